"""Which side recorders (``recording/side.py``) a window gets: one line per kind, decided here so
that ``windows.open_window`` and ``ProfilingWindow`` stay the same as kinds are added."""

from __future__ import annotations

from typing import Any

from vt_lightning.analysis.schedule import Window
from vt_lightning.controller.run import Run
from vt_lightning.options import Options
from vt_lightning.recording.pytracer import PythonTracer
from vt_lightning.recording.side import SideRecorder


def side_recorders(
    options: Options, run: Run, python: PythonTracer, trainer: Any, target: Window
) -> list[SideRecorder]:
    """The side recorders of one window, in start order (stopped in reverse)."""
    recorders: list[SideRecorder] = []
    return recorders
