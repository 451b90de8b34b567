"""A tiny 2-process DDP training on CPU (gloo), traced by vt_lightning. Run by tests/system/test_ddp.py.

Lightning's subprocess launcher starts rank 1 by re-running this script with the same arguments,
so everything is configured from the command line. Each rank writes ``<report>/rank_<r>.json``
(what the callback did and wrote, batch timings, collectives seen on writer threads); each DataLoader worker writes
``<report>/worker_<pid>.json`` (what it inherited from a forked, tracing parent).

    python train_ddp.py --root DIR --report DIR [--ranks 1] [--num-workers 2] [--max-steps 8]
        [--slow-writer-rank 1 --slow-writer-seconds 4]
        [--slow-step-factor 3 --slow-rank 1 --slow-batch 30 --triggers-only --trigger-interval 0.1]

With ``--slow-step-factor``, step times come from a virtual clock advanced by each training step
(10 ms; 400 ms on ``--slow-batch`` of ``--slow-rank`` only), so only that rank sees a slow step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback

_FORKED_WHILE_TRACING = False


def _before_fork() -> None:
    """Runs in the parent just before a fork: the child inherits the value (was a window recording?)."""
    global _FORKED_WHILE_TRACING
    from vt_lightning.recording import pytracer

    _FORKED_WHILE_TRACING = any(t.running for t in list(pytracer._active))


os.register_at_fork(before=_before_fork)


def python_hook_in_this_process() -> dict:
    """What a profiling tool left installed in this process (main thread view)."""
    try:
        from torch.autograd.profiler import _is_profiler_enabled as torch_flag
    except ImportError:  # pragma: no cover
        torch_flag = None
    from vt_lightning.recording import pytracer

    return {
        "forked_while_tracing": _FORKED_WHILE_TRACING,
        "tracers_running": sum(1 for t in list(pytracer._active) if t.running),
        "sys_getprofile": repr(sys.getprofile()) if sys.getprofile() is not None else None,
        "threading_getprofile": (
            repr(threading.getprofile()) if getattr(threading, "getprofile", lambda: None)() is not None else None
        ),
        "torch_profiler_enabled_flag": bool(torch_flag) if torch_flag is not None else None,
        "torch_profiler_enabled_c": bool(torch._C._autograd._profiler_enabled()),
    }


class RandomData(Dataset):
    """Random samples; in a DataLoader worker, records once what the worker inherited."""

    def __init__(self, size: int, dim: int, report: Path) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, dim, generator=g)
        self.y = torch.randn(size, 1, generator=g)
        self.report = report
        self.parent = os.getpid()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if os.getpid() != self.parent:
            path = self.report / f"worker_{os.getpid()}.json"
            if not path.exists():
                info = {"pid": os.getpid(), "ppid": os.getppid(), **python_hook_in_this_process()}
                path.write_text(json.dumps(info))
        # A little Python and torch work in the worker: events that must not reach any trace.
        return torch.tanh(self.x[index]) * 1.0, self.y[index]


CLOCK = [0]  # virtual step clock (ns), see --slow-step-factor


class Tiny(L.LightningModule):
    def __init__(self, dim: int = 16, slow_rank: int = -1, slow_batch: int = -1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1))
        self.slow_rank = slow_rank
        self.slow_batch = slow_batch

    def training_step(self, batch, batch_idx):
        step = self.trainer.fit_loop.total_batch_idx
        slow = self.trainer.global_rank == self.slow_rank and step == self.slow_batch
        CLOCK[0] += (400 if slow else 10) * 1_000_000
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_to_all",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "scatter_object_list",
    "send",
)
WRITER_COLLECTIVES: list[str] = []  # collectives called from a vt_lightning writer thread
WRITES: list[dict] = []  # one entry per finish_window call
NATIVE_WAITS: list[float | None] = []  # each wait for gloo's threads before torch's profiler stopped


def watch_native_waits() -> None:
    """Note each wait for native threads before a window stops torch's profiler (its seconds, or
    None where it gave up): gloo may still be ending a collective's range (recording/native_threads.py)."""
    from vt_lightning.recording import torchtracer

    wait = torchtracer.wait_for_native_threads

    def noted(*args, **kwargs):
        waited = wait(*args, **kwargs)
        NATIVE_WAITS.append(waited)
        return waited

    torchtracer.wait_for_native_threads = noted


def watch_collectives() -> None:
    """Record any torch.distributed collective called from vt_lightning's writer thread."""
    import torch.distributed as dist

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def wrapper(*args, __original=original, __name=name, **kwargs):
            if threading.current_thread().name.startswith("vt_lightning"):
                WRITER_COLLECTIVES.append(__name)
            return __original(*args, **kwargs)

        setattr(dist, name, wrapper)


def slow_down_writer(rank: int, seconds: float) -> None:
    """Make ``rank``'s first window write ``seconds`` late (the writer thread sleeps first)."""
    from vt_lightning.controller.handoff import BackgroundWriter

    run_job = BackgroundWriter.run  # the writer thread's step (it feeds the writer process)

    def slow_run_job(self, closed, at_end=False):
        job = closed.job
        entry = {
            "rank": job.metadata["global_rank"],
            "window": job.metadata["window"],
            "thread": threading.current_thread().name,
            "start": time.time(),
        }
        if job.metadata["global_rank"] == rank and job.metadata["window"] == 0:
            time.sleep(seconds)
        try:
            return run_job(self, closed, at_end)
        finally:
            entry["end"] = time.time()
            WRITES.append(entry)

    BackgroundWriter.run = slow_run_job


class Reporter(L.Callback):
    """Records per rank: batch timings, the callback's results and writes, collectives seen."""

    def __init__(self, tracer: VizTraceCallback, report: Path) -> None:
        self.tracer = tracer
        self.report = report
        self.batch_seconds: dict[int, float] = {}
        self.batch_end_time: dict[int, float] = {}
        self._t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batch_seconds[trainer.fit_loop.total_batch_idx] = time.perf_counter() - self._t0
        self.batch_end_time[trainer.fit_loop.total_batch_idx] = time.time()

    def on_fit_end(self, trainer, pl_module):
        results = [
            {"trace": str(r.trace_path), "python_events": r.python_events, "torch_events": r.torch_events}
            for r in self.tracer.results
        ]
        info = {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "world_size": trainer.world_size,
            "pid": os.getpid(),
            "output_dir": str(self.tracer.output_dir),
            "results": results,
            "triggered": [[name, firing.to_metadata()] for name, firing in self.tracer._controller.triggered_runs],
            "windows_skipped": self.tracer.windows_skipped,
            "batch_seconds": self.batch_seconds,
            "batch_end_time": self.batch_end_time,
            "writes": WRITES,
            "writer_collectives": WRITER_COLLECTIVES,
            "native_waits": NATIVE_WAITS,
            "main_after_fit": python_hook_in_this_process(),
        }
        (self.report / f"rank_{trainer.global_rank}.json").write_text(json.dumps(info))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--ranks", default="", help="comma-separated global ranks that trace (default: all)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--samples", type=int, default=48, help="dataset size (split over the ranks)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--record-shapes", action="store_true")
    parser.add_argument("--slow-writer-rank", type=int, default=-1, help="this rank writes window 0 late")
    parser.add_argument("--slow-writer-seconds", type=float, default=0.0)
    parser.add_argument("--slow-step-factor", type=float, default=None)
    parser.add_argument("--slow-rank", type=int, default=-1, help="the only rank whose --slow-batch is slow")
    parser.add_argument("--slow-batch", type=int, default=-1)
    parser.add_argument("--triggers-only", action="store_true", help="scheduled_windows=False")
    parser.add_argument("--trigger-interval", type=float, default=0.5)
    parser.add_argument("--active", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tiny-budget-rank", type=int, default=-1, help="this rank alone gets budget_output_mb=0.001")
    args = parser.parse_args()

    torch.set_num_threads(1)
    watch_collectives()
    watch_native_waits()
    if args.slow_writer_rank >= 0:
        slow_down_writer(args.slow_writer_rank, args.slow_writer_seconds)
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    ranks = [int(r) for r in args.ranks.split(",") if r] or None
    tracer = VizTraceCallback(
        wait=1,
        warmup=1,
        active=args.active,
        repeat=args.repeat,
        ranks=ranks,
        budget_output_mb=0.001 if int(os.environ.get("LOCAL_RANK", "0")) == args.tiny_budget_rank else 10_240.0,
        record_shapes=args.record_shapes,
        slow_step_factor=args.slow_step_factor,
        slow_step_baseline=10,
        trigger_interval=args.trigger_interval,
        scheduled_windows=not args.triggers_only,
        trace_workers=False,  # this run checks that workers inherit no tracing (test_workers.py traces them)
    )
    if args.slow_step_factor is not None:
        tracer._controller.step_clock = lambda: CLOCK[0]
    loader_kwargs = {}
    if args.num_workers:
        loader_kwargs = {"multiprocessing_context": "fork", "persistent_workers": False}
    data = DataLoader(
        RandomData(args.samples, 16, report),
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        **loader_kwargs,
    )
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_steps=args.max_steps,
        callbacks=[tracer, Reporter(tracer, report)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(Tiny(slow_rank=args.slow_rank, slow_batch=args.slow_batch), data)


if __name__ == "__main__":
    main()
