"""What the CLI tests of every tier share: the callback's constructor arguments, which every
configuration surface (the environment, LightningCLI's flags and help) must offer, and the folder
of the CLI scripts."""

from __future__ import annotations

import inspect

from support.paths import SCRIPTS
from vt_lightning import VizTraceCallback

CLI_SCRIPTS = SCRIPTS / "cli"


def constructor_args() -> list[str]:
    return [p for p in inspect.signature(VizTraceCallback.__init__).parameters if p != "self"]
