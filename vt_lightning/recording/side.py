"""Side recorders: what records something of a window beside the two tracers (gc pauses, compiles,
DataLoader workers, the ranks' clock offsets, the flight recorder), built per window by
``controller/side_recorders.py``. One that fails costs itself, never the window; ``collect`` gives
plain, picklable data (``WindowJob.extras[name]``).
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
