"""The training process's decisions: the windows' lifecycle, the hand-off to the writer, the triggers."""

from vt_lightning.controller.controller import WindowController

__all__ = ["WindowController"]
