"""Side recorders: small tools that record something of a window beside the two tracers.

Garbage-collector pauses, torch.compile events, DataLoader workers, clock offsets between ranks,
the flight recorder's samples: each is one object with this shape, built per window by
``controller/side_recorders.py`` and driven by ``ProfilingWindow``. A side recorder that fails is
dropped with one warning; it never costs the window. What ``collect`` returns is plain, picklable
data that crosses to the writer as ``WindowJob.extras[name]``.
"""

from __future__ import annotations

from typing import Any, Protocol


class SideRecorder(Protocol):
    """Started just before the Python tracer (at the first active batch), stopped just after it."""

    name: str  # its key in ``WindowJob.extras``

    def start(self) -> None:
        """Begin recording (and install any hook); raise to be dropped from this window."""

    def stop(self) -> None:
        """Stop recording and remove every hook; called once, also on abort; raise to lose its data."""

    def collect(self) -> Any:
        """What was recorded, as plain data for the writer (None: nothing to hand over)."""
