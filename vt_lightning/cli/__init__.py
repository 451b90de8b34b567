"""Command lines: the ``vt-lightning`` command (``command``) and the switches that turn the callback
on from outside a script (``lightning``: LightningCLI flags, ``VT_LIGHTNING=1``).

``vt_lightning.cli`` is public API (``from vt_lightning.cli import VizTraceLightningCLI``, and
Lightning's ``callbacks_factory`` entry point ``vt_lightning.cli:callbacks_from_env``), so it
re-exports the Lightning switches. Importing it stays cheap: nothing heavy is imported until used.
"""

from __future__ import annotations

from typing import Any

from vt_lightning.cli.lightning import add_viztrace_arguments, callbacks_from_env, options_from_env
from vt_lightning.constants import ENV_PREFIX, ENV_SWITCH

__all__ = [
    "ENV_PREFIX",
    "ENV_SWITCH",
    "VizTraceLightningCLI",
    "add_viztrace_arguments",
    "callbacks_from_env",
    "options_from_env",
]


def __getattr__(name: str) -> Any:
    if name == "VizTraceLightningCLI":  # built on first use: it imports jsonargparse
        from vt_lightning.cli import lightning

        return lightning.VizTraceLightningCLI
    raise AttributeError(f"module 'vt_lightning.cli' has no attribute {name!r}")
