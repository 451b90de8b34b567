"""The benchmark workload and the measuring / anchor callbacks (no vt_lightning internals here).

* ``PyHeavyModel``: a training step dominated by Python: ``calls`` calls of a tiny Python function
  (one VizTracer event each) plus a few small torch ops, around a 2-layer MLP forward/backward.
  Steps listed in ``heavy_steps`` make ``heavy_calls`` calls instead (the profiled window's steps).
* ``StepClock``: first callback in the list; ``perf_counter_ns`` at every ``on_train_batch_start``
  and at ``on_train_batch_end`` *entry* (before any other callback's end hook runs). The interval
  between two batch starts is the step a user feels (data fetch, every hook, optimizer included).
* ``StopWhen``: ends ``fit`` once a predicate on the finished step says so.
* ``NaiveConstructedTracer``: the naive callback's quiet-step cost: ``VizTracer(...)`` built at setup.
* ``ManualProfilers``: VizTracer + torch.profiler run by hand on the window's active steps, saved on
  the training thread with VizTracer's own ``save()`` (the reference for the window-end stall).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset


def leaf(x: int) -> int:
    return x + 1


def python_work(n: int) -> int:
    s = 0
    for _ in range(n):
        s = leaf(s)
    return s


class ConstantData(Dataset):
    def __init__(self, length: int = 1_000_000, dim: int = 16) -> None:
        self.length = length
        self.x = torch.randn(dim)
        self.y = torch.randn(1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


class PyHeavyModel(L.LightningModule):
    def __init__(
        self, calls: int, heavy_calls: int = 0, heavy_steps: tuple[int, ...] = (), torch_ops: int = 20
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.calls = calls
        self.heavy_calls = heavy_calls
        self.heavy_steps = frozenset(heavy_steps)
        self.torch_ops = torch_ops

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        step = self.trainer.fit_loop.total_batch_idx
        python_work(self.heavy_calls if step in self.heavy_steps else self.calls)
        t = x
        for _ in range(self.torch_ops):
            t = torch.add(t, 0.001)
        return nn.functional.mse_loss(self.net(t), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(ConstantData(), batch_size=8, shuffle=False, num_workers=0)


def profiler_enabled() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


class StepClock(Callback):
    def __init__(self) -> None:
        self.start: list[int] = []
        self.end: list[int] = []
        self.torch_on: list[bool] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.start.append(time.perf_counter_ns())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.end.append(time.perf_counter_ns())
        self.torch_on.append(profiler_enabled())


class StopWhen(Callback):
    """``predicate(step)`` after each finished batch (last callback, so after every end hook)."""

    def __init__(self, predicate: Callable[[int], bool]) -> None:
        self.predicate = predicate

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.predicate(trainer.fit_loop.total_batch_idx):
            trainer.should_stop = True


class NaiveConstructedTracer(Callback):
    """What a naive callback does at setup: build the tracer (hook installed on Python <= 3.11)."""

    def __init__(self, tracer_entries: int = 1_000_000) -> None:
        self.tracer_entries = tracer_entries
        self.tracer: Any = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from viztracer import VizTracer

        self.tracer = VizTracer(tracer_entries=self.tracer_entries, verbose=0, register_global=False)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.tracer is not None:
            # VizTracer.stop() is a no-op on a tracer that was never started: stop the C tracer
            # itself, or its construction-time hook stays installed for the rest of the process.
            from viztracer.snaptrace import Tracer

            Tracer.stop(self.tracer, None)
            self.tracer.clear()
            threading.setprofile(None)
            self.tracer = None


class ManualProfilers(Callback):
    """VizTracer + torch.profiler by hand on ``active_steps``; saved on the training thread."""

    def __init__(self, active_steps: tuple[int, ...], out_dir: str, tracer_entries: int) -> None:
        self.active_steps = tuple(active_steps)
        self.out_dir = out_dir
        self.tracer_entries = tracer_entries
        self.tracer: Any = None
        self.prof: Any = None
        self.rf: Any = None
        self.times: dict[str, float] = {}
        self.viztracer_file: str | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.fit_loop.total_batch_idx
        if step not in self.active_steps:
            return
        if step == self.active_steps[0]:
            from viztracer import VizTracer

            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.prof.start()
            self.tracer = VizTracer(tracer_entries=self.tracer_entries, verbose=0, register_global=False)
            self.tracer.start()
        self.rf = torch.autograd.profiler.record_function(f"ProfilerStep#{step}")
        self.rf.__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.fit_loop.total_batch_idx
        if step not in self.active_steps:
            return
        self.rf.__exit__(None, None, None)
        if step != self.active_steps[-1]:
            return
        self.tracer.stop()
        threading.setprofile(None)
        self.prof.stop()
        self.viztracer_file = os.path.join(self.out_dir, "viztracer.json.gz")
        t0 = time.perf_counter()
        self.tracer.save(self.viztracer_file)
        t1 = time.perf_counter()
        self.prof.export_chrome_trace(os.path.join(self.out_dir, "torch.json"))
        t2 = time.perf_counter()
        self.times = {"viztracer_save_s": t1 - t0, "torch_export_s": t2 - t1, "events": self.tracer.total_entries}
        self.tracer.clear()
        self.tracer = self.prof = None
