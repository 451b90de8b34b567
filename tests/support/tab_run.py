"""The run both TensorBoard-tab test files read: one real Trainer whose ``Dataset.__getitem__``
sleeps 30 ms, so both windows are ``input_bound`` at this file's ``SlowRows.__getitem__``.
``benchmarks/tb_plugin.py`` writes its one real window with the same run (``repeat=1``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from conftest import make_trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback

SOURCE = __file__  # the file every verdict of the run names


class SlowRows(Dataset):
    """30 ms per ``__getitem__`` (``batch_size=None``: one call per batch): an input_bound window."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.03)
        return torch.randn(4, 8)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def getitem_line() -> int:
    """The line of ``def __getitem__`` in this file: where the verdicts point."""
    return next(i for i, text in enumerate(Path(SOURCE).read_text().splitlines(), 1) if "def __getitem__" in text)


def input_bound_run(root: Path, repeat: int = 2) -> Path:
    """``repeat`` windows (batches 2-4, 7-9, …) under ``root/lightning_logs/version_0``."""
    callback = VizTraceCallback(wait=1, warmup=1, active=3, repeat=repeat)
    make_trainer(root, [callback], max_steps=5 * repeat + 2).fit(Tiny(), DataLoader(SlowRows(), batch_size=None))
    return root
