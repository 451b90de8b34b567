"""The run both TensorBoard-tab test files read: one real Trainer whose ``Dataset.__getitem__``
sleeps 30 ms, so both windows are ``input_bound`` at this file's ``SlowRows.__getitem__``; each step
keeps ``SCRATCH_MIB`` alive in ``Tiny.scratch`` (the memory panel's top site), and batches from 7 on
sort their batch (``aten::sort`` only in the second window: the diff's "only in B").
``benchmarks/tb_plugin.py`` writes its one real window with the same run (``repeat=1``)."""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import torch
from conftest import make_trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from vt_lightning import VizTraceCallback

SOURCE = __file__  # the file every verdict of the run names
SCRATCH_MIB = 8


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
        scratch = self.scratch()
        if batch_idx >= 7:
            batch = batch.sort(dim=0).values
        return self.layer(batch).pow(2).mean() + scratch[0]

    def scratch(self) -> torch.Tensor:
        return torch.zeros(SCRATCH_MIB << 18)  # float32: SCRATCH_MIB MiB

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def scaled(x: torch.Tensor) -> torch.Tensor:
    """What ``compiled_run`` compiles with inductor: the compile panel names this function."""
    return (x * 2).relu()


class Compiled(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.scaled = torch.compile(scaled)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(self.scaled(batch[0])).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def compiled_run(root: Path) -> None:
    """One window on batches 0-1 whose first step compiles ``scaled`` with inductor (cold when
    ``TORCHINDUCTOR_CACHE_DIR`` is new: ~15-20 s)."""
    callback = VizTraceCallback(wait=0, warmup=0, active=2, repeat=1, memory_snapshot=False)
    data = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=8)
    make_trainer(root, [callback], max_steps=2, num_sanity_val_steps=0, limit_val_batches=0).fit(Compiled(), data)


def line_of(text: str, source: str = SOURCE) -> int:
    """The first line of ``source`` holding ``text``."""
    return next(i for i, line in enumerate(Path(source).read_text().splitlines(), 1) if text in line)


def getitem_line() -> int:
    """The line of ``def __getitem__`` in this file: where the verdicts point."""
    return line_of("def __getitem__")


def private_copy(directory: Path) -> ModuleType:
    """This module copied into ``directory`` and imported from there: a run whose verdicts name a
    file the test may edit (``module.SOURCE``), never the repository's."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / "tab_user_code.py"
    shutil.copyfile(__file__, copy)
    spec = importlib.util.spec_from_file_location("tab_user_code", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def input_bound_run(root: Path, repeat: int = 2) -> Path:
    """``repeat`` windows (batches 2-4, 7-9, …) under ``root/lightning_logs/version_0``."""
    callback = VizTraceCallback(wait=1, warmup=1, active=3, repeat=repeat)
    make_trainer(root, [callback], max_steps=5 * repeat + 2).fit(Tiny(), DataLoader(SlowRows(), batch_size=None))
    return root


if __name__ == "__main__":  # python tab_run.py ROOT RUN (tests/ on PYTHONPATH): one run in a process of its own
    import sys

    {"compiled": compiled_run, "input_bound": input_bound_run}[sys.argv[2]](Path(sys.argv[1]))
