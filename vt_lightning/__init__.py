"""Python code and torch ops on one timeline, for scheduled Lightning training steps."""

__version__ = "0.1.0"

from .callback import VizTraceCallback  # noqa: E402

__all__ = ["VizTraceCallback", "__version__"]
