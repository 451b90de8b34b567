"""Quiet steps with DataLoader workers (issue 23): what tracing workers costs outside windows.  Usage:

    python benchmarks/workers.py [--steps 300] [--repeats 5] [--persistent]   # ~2 minutes on 2 cores
    python benchmarks/workers.py --steps 40 --repeats 1                       # smoke run, ~20 s

Two parts.

1. Fit, interleaved repeats, each a fresh Trainer fitting a small MLP on CPU for ``--steps`` batches
   from a DataLoader with ``num_workers=2`` (fork): "no callback" against ``VizTraceCallback`` whose
   only window lies past the end of training (``skip_first`` beyond ``--steps``), so every batch is
   quiet and the workers do their one check per fetch; ``trace_workers=False`` as a third arm
   separates the workers' check from the callback's own quiet cost. Prints fit seconds (median,
   min-max) and the ratio to the baseline's median.
2. The check itself, timed directly in this process: the wrapped fetch a worker calls per batch (one
   read of the plan; the task number noted as the worker loop takes it) against calling the fetcher
   directly, in ns per fetch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback
from vt_lightning.recording.pytracer import PythonTracerConfig
from vt_lightning.recording.worker_plan import SharedPlan, WorkerSetup
from vt_lightning.recording.worker_side import _TracedFetch, _watch_tasks, _WorkerSide


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def arms(steps: int) -> dict[str, dict[str, Any] | None]:
    quiet = {"skip_first": steps + 1000, "summary": False, "memory_snapshot": False}
    return {
        "no callback": None,
        "callback, no window in range, trace_workers=True": quiet,
        "callback, no window in range, trace_workers=False": {**quiet, "trace_workers": False},
    }


def fit(steps: int, options: dict[str, Any] | None, persistent: bool) -> float:
    callbacks = [VizTraceCallback(**options)] if options is not None else []
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            max_steps=steps,
            callbacks=callbacks,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            logger=False,
            num_sanity_val_steps=0,
        )
        data = DataLoader(
            TensorDataset(torch.randn(steps * 16, 64)),
            batch_size=16,
            num_workers=2,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )
        start = time.perf_counter()
        trainer.fit(MLP(), data)
        return time.perf_counter() - start


class _IndexQueue:
    """Stands in for a worker's index queue: task ``(idx, index)`` after task."""

    def __init__(self) -> None:
        self.sent = 0

    def get(self, timeout: float | None = None) -> tuple[int, int]:
        self.sent += 1
        return (self.sent, self.sent)


def _worker_loop(index_queue: _IndexQueue, fetcher: Any, side: _WorkerSide | None, calls: int) -> float:
    """The shape of torch's worker loop (the name and ``index_queue`` are what the wrapper looks for)."""
    if side is not None:
        side.tasks_seen = _watch_tasks(side)
    start = time.perf_counter_ns()
    for _ in range(calls):
        r = index_queue.get(timeout=5.0)
        _idx, index = r  # torch's loop: ``idx, index = r``
        fetcher(index)
    return (time.perf_counter_ns() - start) / calls


def check_cost(calls: int = 200_000) -> tuple[float, float]:
    """ns per fetch: the fetcher called directly, and through the worker's wrapper (no window near)."""
    with tempfile.TemporaryDirectory() as spool:
        plan = SharedPlan(os.path.join(spool, "plan"), create=True)
        plan.publish(0, 10**9, [(10**8, 10**8 + 3)])  # a window far ahead: every fetch is quiet

        def fetch(index: Any) -> Any:
            return index

        direct = min(_worker_loop(_IndexQueue(), fetch, None, calls) for _ in range(3))
        traced = []
        for _ in range(3):
            side = _WorkerSide(WorkerSetup(plan.path, spool, 0, PythonTracerConfig()), 0)
            traced.append(_worker_loop(_IndexQueue(), _TracedFetch(side, fetch), side, calls))
            side.plan.close()
        plan.close()
    return direct, min(traced)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = arms(args.steps)
    times: dict[str, list[float]] = {arm: [] for arm in table}
    for _ in range(args.repeats):
        for arm, options in table.items():  # interleaved: each repeat runs every arm once
            times[arm].append(fit(args.steps, options, args.persistent))
    base = statistics.median(times["no callback"])
    kind = "persistent" if args.persistent else "non-persistent"
    print(
        f"{args.steps} batches, {args.repeats} repeats, num_workers=2 ({kind}, fork), "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}\n"
    )
    print("| arm | fit s, median (min-max) | x baseline |")
    print("|---|---|---|")
    for arm in table:
        t = times[arm]
        print(
            f"| {arm} | {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) | {statistics.median(t) / base:.3f}x |"
        )
    direct, traced = check_cost()
    print(f"\nper fetch in a worker: {direct:.0f} ns direct, {traced:.0f} ns wrapped (+{traced - direct:.0f} ns)")


if __name__ == "__main__":
    main()
