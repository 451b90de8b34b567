"""A stock LightningCLI script that knows nothing of vt_lightning."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _tiny import TinyData, TinyModel
from lightning.pytorch.cli import LightningCLI

if __name__ == "__main__":
    LightningCLI(TinyModel, TinyData)
