"""A project that owns its CLI: VizTraceLightningCLI adds an off-by-default --viztrace option."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _tiny import TinyData, TinyModel

from vt_lightning.cli import VizTraceLightningCLI

if __name__ == "__main__":
    VizTraceLightningCLI(TinyModel, TinyData)
