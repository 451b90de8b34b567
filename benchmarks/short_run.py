"""Short runs (issue 25): what one window, and the callback alone, cost a 40-step fit.

    python benchmarks/short_run.py                 # 7 interleaved rounds (~3 min on 2 cores)
    python benchmarks/short_run.py --rounds 15     # steadier medians
    python benchmarks/short_run.py --cold          # every fit in a fresh interpreter (first-fit costs)
    python benchmarks/short_run.py --threads 1     # torch on one core, the other left free (a GPU job's shape)
    python benchmarks/short_run.py --quick         # 1 round, proves it runs (no figures)

Each round fits the same small CNN (40 steps of about 15 ms on a 2-core CPU) once per variant,
in one process, in a rotating order:

* ``none``        no callback;
* ``vt_idle``     VizTraceCallback whose only window lies past the run (fixed costs alone);
* ``vt_window``   VizTraceCallback with one window: wait 20, warmup 1, active 2 (batches 20-22);
* ``vt_ahead``    ``vt_window`` with the writer process started in the background at train start
                  instead of at the window's hand-off (``handoff.HAND_OFF_START_ON_CPU = False``,
                  what accelerator runs do): which costs the fit more, and where;
* ``vt_process``  ``vt_window`` with the window handed to a writer process started at its hand-off
                  (``handoff.FINISH_AT_END_WITHIN_S = 0``, the default before it was held and
                  finished in the training process when fit ends): the hold's A/B;
* ``vt_flight``   ``vt_idle`` plus the slow-step trigger armed after 10 steps (flight recorder on);
* ``pl_profiler`` Lightning's ``PyTorchProfiler(with_stack=True)`` with the same torch schedule.

Timestamps come from a clock callback placed first (every batch start and batch-end entry) and
from a subclass of VizTraceCallback that stamps before and after each of its hooks; no library
code path is changed. The window's cost is broken down into: setup (writer start included), the
warmup batch (kineto starts), each active batch, the close (last active batch's end hook), the
batch after the window, and the end-of-fit wait (``on_train_end`` + ``teardown``: the writer
drains). Every figure is a median over rounds of a difference against ``none`` of the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import itertools
import json
import logging
import os
import statistics
import subprocess
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
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback
from vt_lightning.controller import handoff

STEPS = 40
BATCH = 96  # about 15 ms a step on the 2-core CPU when it is quiet (32: 5 ms, 128: 19 ms)
WAIT, WARMUP, ACTIVE = 20, 1, 2
WINDOW = range(WAIT, WAIT + WARMUP + ACTIVE + 1)  # warmup, active batches, and the batch after
VARIANTS = ("none", "vt_idle", "vt_window", "vt_process", "vt_ahead", "vt_flight", "pl_profiler")
WINDOWED = ("vt_window", "vt_process", "vt_ahead", "pl_profiler")
VT_WINDOWED = ("vt_window", "vt_process", "vt_ahead")
FINISH_AT_END_WITHIN_S = handoff.FINISH_AT_END_WITHIN_S  # the default, restored after vt_process


class SmallCNN(L.LightningModule):
    """About 15 ms a step on a 2-core CPU (batch ``BATCH`` of 3x32x32)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 10),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data() -> DataLoader:
    x = torch.randn(STEPS * BATCH, 3, 32, 32)
    y = torch.randint(0, 10, (STEPS * BATCH,))
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


class Clock(Callback):
    """First in the list: ``perf_counter_ns`` at every batch start and batch-end entry, and every
    full (generation 2) garbage collection during fit: (start ns, duration ns)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.full_gcs: list[tuple[int, int]] = []
        self._gc_start = 0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        now = time.perf_counter_ns()
        if phase == "start":
            self._gc_start = now
        else:
            self.full_gcs.append((self._gc_start, now - self._gc_start))

    def setup(self, *args: Any, **kwargs: Any) -> None:
        gc.callbacks.append(self.on_gc)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        if self.on_gc in gc.callbacks:
            gc.callbacks.remove(self.on_gc)

    def gcs_in_steps(self) -> list[tuple[int, float]]:
        """(step, ms) of each full collection inside a step (-1: outside the steps)."""
        out = []
        for start, duration in self.full_gcs:
            step = max((i for i, t in enumerate(self.starts) if t <= start), default=-1)
            out.append((step, duration / 1e6))
        return out

    def on_train_batch_start(self, *args: Any) -> None:
        self.starts.append(time.perf_counter_ns())

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter_ns())

    def steps_ms(self, fit_end: int) -> list[float]:
        """Step i: batch start i to batch start i+1 (the last one: to the end of fit's loop)."""
        edges = [*self.starts, fit_end]
        return [(b - a) / 1e6 for a, b in itertools.pairwise(edges)]


class TimedVT(VizTraceCallback):
    """VizTraceCallback whose hooks are stamped (ms spent inside each, by batch)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spent: dict[str, float] = {}

    def _time(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spent[key] = self.spent.get(key, 0.0) + (time.perf_counter_ns() - t0) / 1e6

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self._time("setup", super().setup, *args, **kwargs)

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self._time(f"start{trainer.global_step}", super().on_train_batch_start, trainer, *args)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step = trainer.global_step - 1  # already advanced by the optimizer step
        self._time(f"end{step}", super().on_train_batch_end, trainer, *args)

    def on_train_end(self, *args: Any) -> None:
        self._time("train_end", super().on_train_end, *args)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self._time("teardown", super().teardown, *args, **kwargs)


def make_callbacks(variant: str, out: str) -> tuple[list[Callback], Any]:
    common = {"dirpath": out, "wait": WAIT, "warmup": WARMUP, "active": ACTIVE}
    if variant == "none":
        return [], None
    if variant == "vt_idle":
        cb = TimedVT(**{**common, "wait": 10 * STEPS})
    elif variant in VT_WINDOWED:
        cb = TimedVT(**common)
    elif variant == "vt_flight":
        cb = TimedVT(**{**common, "wait": 10 * STEPS}, slow_step_factor=50.0, slow_step_baseline=10)
    elif variant == "pl_profiler":
        schedule = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
        profiler = PyTorchProfiler(dirpath=out, filename="pl", schedule=schedule, with_stack=True)
        return [], profiler
    else:
        raise ValueError(variant)
    return [cb], None


def fit_once(variant: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        torch.manual_seed(0)
        model, loader = SmallCNN(), data()
        clock = Clock()
        callbacks, profiler = make_callbacks(variant, out)
        trainer = L.Trainer(
            max_steps=STEPS,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[clock, *callbacks],
            profiler=profiler,
            default_root_dir=out,
        )
        sink = io.StringIO()
        handoff.HAND_OFF_START_ON_CPU = variant != "vt_ahead"
        handoff.FINISH_AT_END_WITHIN_S = 0.0 if variant == "vt_process" else FINISH_AT_END_WITHIN_S
        gc.collect()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            t0 = time.perf_counter_ns()
            trainer.fit(model, loader)
            t1 = time.perf_counter_ns()
        spent = callbacks[0].spent if callbacks else {}
        return {
            "fit_ms": (t1 - t0) / 1e6,
            "steps_ms": clock.steps_ms(clock.ends[-1] if clock.ends else t1),
            "spent": spent,
            "full_gcs": clock.gcs_in_steps(),
            "printed": sink.getvalue(),
        }


def cold_fit(variant: str, threads: int) -> dict[str, Any]:
    """One fit in a fresh interpreter: what a user's first (and in a sweep, every) short run pays."""
    command = [sys.executable, __file__, "--one", variant, "--threads", str(threads)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["full_gcs"] = [tuple(g) for g in result["full_gcs"]]
    return result


def breakdown(spent: dict[str, float], steps: list[float], base: list[float]) -> dict[str, float]:
    """The window's parts, ms: hooks' own time where the callback spends it, step deltas else
    (batches 0-1 too: the writer process boots in the background at train start)."""
    warm, first, last = WAIT, WAIT + WARMUP, WAIT + WARMUP + ACTIVE - 1
    parts = {
        "setup (writer start incl.)": spent.get("setup", 0.0),
        "batches 0-1, step delta (writer boots)": steps[0] + steps[1] - base[0] - base[1],
        "warmup batch (kineto start), hook": spent.get(f"start{warm}", 0.0),
        "warmup batch, step delta": steps[warm] - base[warm],
    }
    for i in range(first, last + 1):
        parts[f"active batch {i}, step delta"] = steps[i] - base[i]
    parts["close (last active end hook)"] = spent.get(f"end{last}", 0.0)
    parts["batch after the window, step delta"] = steps[last + 1] - base[last + 1]
    parts["end-of-fit wait (train_end + teardown)"] = spent.get("train_end", 0.0) + spent.get("teardown", 0.0)
    return parts


def quiet_worst(steps: list[float], base: list[float], window: bool) -> tuple[float, int]:
    """(ms, step) of the quiet step slowed most against the same step of ``none``."""
    skip = set(WINDOW) if window else set()
    return max((s - b, i) for i, (s, b) in enumerate(zip(steps, base)) if i not in skip)


def quiet_ratio(steps: list[float], base: list[float]) -> float:
    """Median step over median step of ``none``, quiet steps only: not batches 0-1 (where a writer
    started ahead boots) nor the window and the batch after it (every variant alike)."""
    quiet = [i for i in range(2, len(steps)) if i not in WINDOW]
    return statistics.median(steps[i] for i in quiet) / statistics.median(base[i] for i in quiet)


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> str:
    def med(values: list[float]) -> str:
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return f"{mid:8.1f} ({lo:7.1f} .. {hi:7.1f})"

    lines = ["measure (ms, median (min .. max) over rounds, each against `none` of its round)"]
    fits = {v: [r[v]["fit_ms"] for r in rounds] for v in VARIANTS}
    lines.append(f"  fit, none                                  {med(fits['none'])}")
    added = {v: [r[v]["fit_ms"] - r["none"]["fit_ms"] for r in rounds] for v in VARIANTS if v != "none"}
    for v, values in added.items():
        lines.append(f"  fit added, {v:<32} {med(values)}")
    for v in VT_WINDOWED:
        ratio = [a / p for a, p in zip(added[v], added["pl_profiler"]) if p > 0]
        if ratio:
            lines.append(f"  {v} added / pl_profiler added {'':<10} {statistics.median(ratio):8.2f}x")
    for v in ("vt_idle", "vt_flight"):
        share = [100 * r[v]["fit_ms"] / r["none"]["fit_ms"] - 100 for r in rounds]
        lines.append(f"  {v} fit vs none                       {med(share)} %")
    for v in VT_WINDOWED:
        lines.append(f"window breakdown ({v})")
        parts = [breakdown(r[v]["spent"], r[v]["steps_ms"], r["none"]["steps_ms"]) for r in rounds]
        for key in parts[0]:
            lines.append(f"  {key:<42} {med([p[key] for p in parts])}")
        # The parts' sum: the window's cost without the other 34 steps' noise, against what
        # pl_profiler added to the fit. The warmup hook and the close are inside their batches'
        # step deltas (a step runs from one batch start to the next), so they are not added twice.
        inside_steps = ("warmup batch (kineto start), hook", "close (last active end hook)")
        sums = [sum(v for k, v in p.items() if k not in inside_steps) for p in parts]
        lines.append(f"  {'sum of the parts':<42} {med(sums)}")
        ratio = [total / pl for total, pl in zip(sums, added["pl_profiler"]) if pl > 0]
        shown = f"{statistics.median(ratio):8.2f}x" if ratio else "     n/a (pl_profiler added nothing)"
        lines.append(f"  {'sum of the parts / pl_profiler added':<42} {shown}")
    lines.append("worst quiet step vs none (step by step, same round)")
    for v in VARIANTS[1:]:
        worst = [quiet_worst(r[v]["steps_ms"], r["none"]["steps_ms"], v in WINDOWED) for r in rounds]
        lines.append(f"  {v:<42} {med([w for w, _ in worst])}  at steps {[i for _, i in worst]}")
    # The flight recorder's goal (quiet steps within 1 %) is below a fit's noise here; the median of
    # a round's quiet steps over the same median of `none` is steadier (40 steps each).
    lines.append("median quiet step / none's (ratio per round; batches 0-1 and the window left out)")
    for v in VARIANTS[1:]:
        ratios = [quiet_ratio(r[v]["steps_ms"], r["none"]["steps_ms"]) for r in rounds]
        lines.append(f"  {v:<42} {statistics.median(ratios):8.3f}x ({min(ratios):.3f} .. {max(ratios):.3f})")
    lines.append("full garbage collections during fit: count in steps, total ms (median over rounds)")
    for v in VARIANTS:
        counts = [len([g for g in r[v]["full_gcs"] if g[0] >= 0]) for r in rounds]
        totals = [sum(ms for step, ms in r[v]["full_gcs"] if step >= 0) for r in rounds]
        steps_hit = sorted({step for r in rounds for step, _ in r[v]["full_gcs"] if step >= 0})
        lines.append(
            f"  {v:<14} {statistics.median(counts):4.1f} gc, {statistics.median(totals):7.1f} ms  steps {steps_hit}"
        )
    step_none = [statistics.median(r["none"]["steps_ms"]) for r in rounds]
    lines.append(f"median quiet step, none                      {med(step_none)}")
    lines.append(
        "noise: spread of `none` fit over rounds "
        f"{100 * (max(fits['none']) - min(fits['none'])) / statistics.median(fits['none']):.1f} %"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="one round: proves the script runs")
    parser.add_argument("--no-write", action="store_true", help="accepted for the smoke test; nothing is written")
    parser.add_argument(
        "--cold", action="store_true", help="every fit in a fresh interpreter (a user's first fit: imports, first GC)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch's intra-op threads (0: its default, every core); 1 leaves a core free, as a GPU job does",
    )
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # --cold's child: one fit, JSON out
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if args.one:
        result = fit_once(args.one)
        result.pop("printed")
        print(json.dumps(result))
        return
    if not args.cold:
        for variant in VARIANTS:  # warm every path once (imports, kernels, the writer's first start)
            fit_once(variant)
    results = []
    for n in range(rounds):
        order = VARIANTS[n % len(VARIANTS) :] + VARIANTS[: n % len(VARIANTS)]
        results.append({v: cold_fit(v, args.threads) if args.cold else fit_once(v) for v in order})
        print(f"round {n + 1}/{rounds}: " + ", ".join(f"{v} {results[-1][v]['fit_ms']:.0f} ms" for v in VARIANTS))
    print(summarize(results))


if __name__ == "__main__":
    main()
