"""The window controller and what it drives in the training process: the lifecycle, the hand-off
to the writer and the inbox of its answers, the triggers' wiring, the console messages."""

from vt_lightning.controller.controller import WindowController

__all__ = ["WindowController"]
