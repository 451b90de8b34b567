"""Shared fixtures: a tiny LightningModule whose training step leaves a per-batch Python marker; and
the three test tiers (CONTRIBUTING.md): every test is in exactly one of ``unit``, ``integration`` and
``system``, the folder its file lives in."""

from __future__ import annotations

import gzip
import math
import re
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import orjson
import pytest
import torch
from support.paths import TESTS
from support.s3 import s3_server  # noqa: F401 (a fixture: moto's S3 server, for the remote-root tests)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MARKER = re.compile(r"^batch_(\d+) ")

# ------------------------------------------------------------------------------------------------
# Tiers: a test's tier is the folder it lives in (tests/unit, tests/integration, tests/system).
# unit: pure, in-process, no Trainer, no subprocess, the whole tier in seconds.
# integration: a real Trainer, files, the real parsers (TensorBoard plugin, memory_viz, HTA).
# system: subprocesses, DDP, the TensorBoard server, faults.
# Each tier folder is a package (its __init__.py), so that one subject's tests keep one file name
# in every tier (unit/test_budget.py, integration/test_budget.py). Serial files and the benchmarks'
# smoke file say so themselves (``pytestmark``; CONTRIBUTING.md).
# ------------------------------------------------------------------------------------------------
TIERS = ("unit", "integration", "system")


def tier_of(path: Path) -> str | None:
    """The tier folder ``path`` is in, or None outside ``tests/unit``, ``tests/integration`` and
    ``tests/system``."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


def tier_problem(path: Path, marked: set[str]) -> str | None:
    """Why a test in ``path`` that carries the tier markers ``marked`` has no single tier, or None."""
    tier = tier_of(path)
    if tier is None:
        return "outside the tier folders"
    if marked - {tier}:
        return f"marked {', '.join(sorted(marked - {tier}))} in tests/{tier}/"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a non-interactive shell (``nox &``, ``nohup … &``) inherits
    SIGINT ignored, and so would every subprocess of the tests that press Ctrl-C (they would never
    see it): give the tests the default back, which their subprocesses then inherit."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tier of its folder; a test outside the tier folders, or marked with
    another tier than its folder's, fails the collection."""
    problems = []
    for item in items:
        problem = tier_problem(item.path, {mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if problem:
            problems.append(f"{item.nodeid}: {problem}")
        else:
            item.add_marker(str(tier_of(item.path)))
    if problems:
        raise pytest.UsageError(
            "a test's tier is its folder: put each test file in tests/unit, tests/integration or "
            "tests/system, and mark no test with another tier (CONTRIBUTING.md).\n" + "\n".join(problems)
        )


@pytest.fixture(autouse=True)
def _unit_tier_stays_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit-tier test that builds a Lightning Trainer or starts a subprocess fails loudly: it
    belongs in the integration or system tier."""
    if request.node.get_closest_marker("unit") is None:
        return
    nodeid = request.node.nodeid

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"{nodeid} is in the unit tier, which {what}: mark it integration or system")

        return refused

    monkeypatch.setattr(L.Trainer, "__init__", refuse("never builds a Lightning Trainer"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("never starts a subprocess"))


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


def raising_at(
    original: Callable[..., Any], call: int, error: Callable[[], BaseException]
) -> tuple[Callable[..., Any], list[int]]:
    """``original``, but its ``call``-th call (from 0) raises ``error()``; and its call count (a
    one-item list). How the fault tests inject a fault of ours into an inner call."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] - 1 == call:
            raise error()
        return original(*args, **kwargs)

    return wrapper, calls


def hooks_left(model: nn.Module) -> list[str]:
    """Every tracer, hook and patch a window installs that is still there: torch's profiler, the
    profile hooks (``sys``, ``threading``; on 3.12+ ``sys.monitoring``'s tools from the profiler's
    id up: the debugger's and coverage's ids belong to the test run), the rival guard's patches and
    the Lightning view's module hooks."""
    from vt_lightning.recording.rivals import guard_installed

    left = []
    if torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled():
        left.append("torch profiler recording")
    if sys.getprofile() is not None:
        left.append(f"profile hook {sys.getprofile()!r}")
    if threading.getprofile() is not None:
        left.append(f"thread profile hook {threading.getprofile()!r}")
    if sys.version_info >= (3, 12):
        tools = {i: sys.monitoring.get_tool(i) for i in range(sys.monitoring.PROFILER_ID, 6)}
        left += [f"sys.monitoring tool {i}: {name}" for i, name in tools.items() if name is not None]
    if guard_installed():
        left.append("rival guard patches")
    left += [f"module hooks on {type(m).__name__}" for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    return left


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
def writer_process_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests whose subject is the writer process: every window goes to it, none is held and
    finished in the training process at the run's end (``handoff.FINISH_AT_END_WITHIN_S``)."""
    from vt_lightning.controller import handoff

    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)


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
