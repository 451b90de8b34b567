"""Shared fixtures: a tiny LightningModule whose training step leaves a per-batch Python marker."""

from __future__ import annotations

import gzip
import math
import re
import sys
import types
from pathlib import Path
from typing import Any

import lightning as L
import orjson
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MARKER = re.compile(r"^batch_(\d+) ")


def _marker_template(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


def recorded_name(qualname: str) -> str:
    """How VizTracer names a function: its qualified name on 3.11+ (``Model.training_step``), only
    its own name on 3.10, whose code objects have no ``co_qualname``."""
    return qualname if sys.version_info >= (3, 11) else qualname.rsplit(".", 1)[-1]


def renamed(function: Any, name: str) -> Any:
    """A copy of ``function`` whose code is called ``name`` (what VizTracer records)."""
    names = {"co_name": name, "co_qualname": name} if sys.version_info >= (3, 11) else {"co_name": name}
    return types.FunctionType(function.__code__.replace(**names), function.__globals__, name)


def batch_marker(step: int):
    """A function named ``batch_<step>`` so the trace tells which global batch ran it."""
    return renamed(_marker_template, f"batch_{step}")


class MarkerModel(L.LightningModule):
    """Each training batch calls ``batch_<global batch index>``, which issues a torch op."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.layer = nn.Linear(dim, 1)
        self.train_batches: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.fit_loop.total_batch_idx
        self.train_batches.append(step)
        (x,) = batch
        x = batch_marker(step)(x)
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("val", self.layer(x).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n: int = 64, batch_size: int = 4, dim: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, dim)), batch_size=batch_size)


def make_trainer(root: Path, callbacks: list, **kwargs: Any) -> L.Trainer:
    defaults: dict[str, Any] = dict(
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        max_steps=10,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=True,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    defaults.update(kwargs)
    return L.Trainer(callbacks=callbacks, **defaults)


def trace_files(root: Path) -> list[Path]:
    return sorted(Path(root).rglob("*.pt.trace.json.gz"))


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as f:
        return orjson.loads(f.read())


def marker_steps(trace: dict[str, Any]) -> set[int]:
    """Global batch indices whose ``batch_<n>`` marker appears as a Python event."""
    steps = set()
    for event in trace["traceEvents"]:
        match = MARKER.match(event.get("name", ""))
        if event.get("cat") == "FEE" and match:
            steps.add(int(match.group(1)))
    return steps


MS = 1_000_000  # nanoseconds


class VirtualClock:
    """A step clock in nanoseconds that only moves when a test moves it (``clock.ns += ...``), so
    step-time triggers are tested without depending on this machine's timing."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def model() -> MarkerModel:
    return MarkerModel()


def span_ns(event: dict[str, Any]) -> tuple[int, int]:
    """(start, end) in integer nanoseconds, as Perfetto's JSON importer reads them:
    ``llround(ts * 1000)`` and ``llround(dur * 1000)``, end = start + duration. Comparing the
    float sums ``ts + dur`` instead would flag 1-ulp differences no viewer ever sees."""
    start = math.floor(float(event["ts"]) * 1000 + 0.5)
    return start, start + math.floor(float(event.get("dur", 0.0)) * 1000 + 0.5)


def overlaps_without_nesting(trace: dict[str, Any]) -> list[tuple[str, str]]:
    """Pairs of X events of one thread that overlap without nesting: Perfetto drops the second."""
    by_thread: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "X":
            by_thread.setdefault((event["pid"], event["tid"]), []).append((*span_ns(event), event["name"]))
    bad = []
    for spans in by_thread.values():
        spans.sort(key=lambda span: (span[0], -span[1]))
        stack: list[tuple[int, int, str]] = []
        for start, end, name in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and stack[-1][1] < end:
                bad.append((stack[-1][2], name))
                continue
            stack.append((start, end, name))
    return bad
