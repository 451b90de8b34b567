"""A tiny 2-process DDP training on CPU (gloo) for the job timeline (issue 23). Run by
tests/system/test_job_timeline.py.

Every training step calls ``torch.distributed.barrier()`` (its exits must line up on the job
timeline) and, with ``--late-rank R``, rank R alone calls ``slow_on_rank_one`` (30 ms of sleep)
before its forward pass, so it arrives last at every collective; ``--work S`` makes every rank
sleep S seconds per step (a step of realistic length, the same on every rank). Each rank writes
``<report>/rank_<r>.json``: its results, and on rank 0 the job part of each result.

    python train_job.py --root DIR --report DIR [--late-rank 1] [--num-workers 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback

LATE_SECONDS = 0.03


def slow_on_rank_one() -> None:
    time.sleep(LATE_SECONDS)


def same_work_on_every_rank(seconds: float) -> None:
    time.sleep(seconds)


class Tiny(L.LightningModule):
    def __init__(self, late_rank: int, work: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.late_rank = late_rank
        self.work = work

    def training_step(self, batch, batch_idx):
        torch.distributed.barrier()
        if self.work:
            same_work_on_every_rank(self.work)
        if self.trainer.global_rank == self.late_rank:
            slow_on_rank_one()
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Reporter(L.Callback):
    def __init__(self, tracer: VizTraceCallback, report: Path) -> None:
        self.tracer = tracer
        self.report = report

    def on_fit_end(self, trainer, pl_module):
        results = [
            {"trace": str(r.trace_path), "job": getattr(r, "job", None), "notes": list(r.notes)}
            for r in self.tracer.results
        ]
        info = {"global_rank": trainer.global_rank, "output_dir": str(self.tracer.output_dir), "results": results}
        (self.report / f"rank_{trainer.global_rank}.json").write_text(json.dumps(info, default=str))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--late-rank", type=int, default=-1)
    parser.add_argument("--work", type=float, default=0.0, help="seconds every rank sleeps in each step")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--persistent-workers", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    tracer = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 16, generator=g), torch.randn(96, 1, generator=g))
    loader_kwargs: dict = {}
    if args.num_workers:
        loader_kwargs = {"multiprocessing_context": "fork", "persistent_workers": args.persistent_workers}
    loader = DataLoader(data, batch_size=8, num_workers=args.num_workers, **loader_kwargs)
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=6,
        callbacks=[tracer, Reporter(tracer, report)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        logger=L.pytorch.loggers.CSVLogger(args.root),
    )
    trainer.fit(Tiny(args.late_rank, args.work), loader)


if __name__ == "__main__":
    main()
