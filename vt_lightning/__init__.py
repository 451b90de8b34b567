"""Python code and torch ops on one timeline, for scheduled Lightning training steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vt_lightning.constants import VERSION as __version__

__all__ = ["VizTraceCallback", "__version__"]

if TYPE_CHECKING:
    from vt_lightning.callback import VizTraceCallback


def __getattr__(name: str) -> Any:
    # Lazy: the VT_LIGHTNING entry point imports this package in every Trainer and must stay cheap.
    if name == "VizTraceCallback":
        from vt_lightning.callback import VizTraceCallback

        return VizTraceCallback
    raise AttributeError(f"module 'vt_lightning' has no attribute {name!r}")
