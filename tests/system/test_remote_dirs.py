"""An output root that is a URL refused on one DDP rank stops every rank with that rank's error
(issue 22, item 6): real 2-process DDP on CPU, in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

DDP_REFUSED_ON_RANK_1 = r"""
import os, sys
from pathlib import Path
import lightning as L
import torch
from fsspec import register_implementation
from fsspec.implementations.memory import MemoryFileSystem
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from vt_lightning import VizTraceCallback
from vt_lightning.controller.remote import OutputRootError

class RefusesRankOne(MemoryFileSystem):
    protocol = "vtrankone"
    def makedirs(self, path, exist_ok=False):
        if os.environ.get("LOCAL_RANK", "0") == "1":
            raise PermissionError("rank 1 has no credentials for this store")
        return super().makedirs(path, exist_ok=exist_ok)

register_implementation("vtrankone", RefusesRankOne, clobber=True)

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

report = Path(sys.argv[1])
trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", max_steps=2, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(report.parent / "local"),
    callbacks=[VizTraceCallback(wait=0, warmup=0, active=1, dirpath="vtrankone://bucket/run")],
)
try:
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4))
except OutputRootError as err:
    (report / f"rank_{trainer.global_rank}.txt").write_text(str(err))
    sys.stdout.flush()
    os._exit(3)
(report / f"rank_{trainer.global_rank}.txt").write_text("trained")
"""


def test_a_url_refused_on_one_rank_stops_every_rank_with_its_error(tmp_path):
    script = tmp_path / "refused.py"
    script.write_text(DDP_REFUSED_ON_RANK_1)
    report = tmp_path / "report"
    report.mkdir()
    foreign = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in foreign and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(report)], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"a rank hung after rank 1 failed the URL check:\n{output[-3000:]}")
    deadline = time.monotonic() + 30
    while len(list(report.glob("rank_*.txt"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    said = {p.name: p.read_text() for p in sorted(report.glob("rank_*.txt"))}
    assert proc.returncode == 3, output[-3000:]
    assert sorted(said) == ["rank_0.txt", "rank_1.txt"], output[-3000:]
    assert said["rank_0.txt"] == said["rank_1.txt"]
    assert "vtrankone://bucket/run" in said["rank_0.txt"] and "rank 1 has no credentials" in said["rank_0.txt"]
    assert "found on rank 1; every rank stops" in said["rank_0.txt"] and "set `dirpath`" in said["rank_0.txt"]
