"""What VizTraceCallback costs a training batch outside its windows. Usage:

    python benchmarks/quiet_batch.py             # 20 interleaved rounds, rewrites docs/performance.md's block
    python benchmarks/quiet_batch.py --quick     # 2 short rounds: proves it runs
    python benchmarks/quiet_batch.py --no-write  # print only

Outside windows the callback installs no hook; what it runs per batch is its two batch hooks: two
clock reads for the untraced steps' data wait (``controller/data_wait.py``), an attribute chain and
a comparison. Measured two ways, on a training step that does nothing (``training_step`` returns
None: no forward, no backward, no optimizer), so that nothing but Lightning's own loop surrounds it:

* end to end: one real ``Trainer.fit`` of ``--batches`` batches per configuration, interleaved
  round-robin in a rotating order: no callback, no callback again (its difference from the first is
  the noise floor of this measurement), an empty ``Callback()``, and ``VizTraceCallback`` whose
  first window lies past the run. A batch's time is the interval between two consecutive
  ``on_train_batch_start`` calls of a timing callback (median over the batches after the first 50);
  each configuration's difference from the round's no-callback run, in µs per batch;
* directly: the two hooks called in a loop outside any window (``run.quiet_hook_cost_us``: best of
  5 x 200,000 batches), immune to the loop's noise; and what Lightning's dispatch reads of the
  callback for every hook it calls on it, its ``state_key`` (a property: the key of a callback
  made by the ``VT_LIGHTNING`` switch differs), against an empty ``Callback()``'s, for the
  ``HOOKS_PER_BATCH`` hooks Lightning calls per batch of an empty step.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

import lightning
import lightning as L
import torch
from _common import cpu_trainer, quiet, write_block
from lightning.pytorch.callbacks import Callback
from run import quiet_hook_cost_us
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback

START = "<!-- quiet-batch:start -->"
END = "<!-- quiet-batch:end -->"
SKIP = 50  # the first batches (the loop and the data iterator warming up) are not counted
HOOKS_PER_BATCH = 4  # callback hooks Lightning 2.6 calls per batch of a step that returns None (cProfile)
CONFIGS = ("none", "none_again", "empty", "vt")
LABELS = {
    "none_again": "no callback again - no callback (the noise)",
    "empty": "empty `Callback()` - no callback",
    "vt": "`VizTraceCallback`, no window in the run - no callback",
}


class EmptyStep(L.LightningModule):
    """A step that does nothing: Lightning skips backward and the optimizer when it returns None."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BatchStarts(Callback):
    """The ``perf_counter`` of every batch start; first in the callback list."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append(time.perf_counter())


def batch_us(config: str, batches: int, root: str) -> float:
    """Median µs per batch of one fit."""
    clock = BatchStarts()
    extra: list[Callback] = {
        "empty": [Callback()],
        "vt": [VizTraceCallback(skip_first=10**9)],  # its first window lies past the run
    }.get(config, [])
    data = DataLoader(TensorDataset(torch.zeros(batches, 1)), batch_size=1)
    cpu_trainer(root, [clock, *extra], max_steps=batches).fit(EmptyStep(), data)
    starts = clock.starts[SKIP:]
    return statistics.median(b - a for a, b in itertools.pairwise(starts)) * 1e6


def state_key_us(calls: int = 200_000) -> float:
    """µs per batch that Lightning's reads of ``VizTraceCallback.state_key`` take beyond an empty
    ``Callback()``'s (``HOOKS_PER_BATCH`` reads a batch); best of 5."""
    best = {}
    for name, cb in (("vt", VizTraceCallback(skip_first=10**9)), ("empty", Callback())):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in itertools.repeat(None, calls):
                cb.state_key  # noqa: B018 - the read is what is timed
            times.append((time.perf_counter() - t0) / calls)
        best[name] = min(times)
    return (best["vt"] - best["empty"]) * HOOKS_PER_BATCH * 1e6


def measure(rounds: int, batches: int) -> dict[str, Any]:
    raw: dict[str, list[float]] = {c: [] for c in CONFIGS}
    direct: list[float] = []
    keys: list[float] = []
    for r in range(rounds):
        order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
        for config in order:
            root = tempfile.mkdtemp(prefix="vt-quiet-batch-")
            try:
                raw[config].append(batch_us(config, batches, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            gc.collect()
        direct.append(quiet_hook_cost_us())
        keys.append(state_key_us())
        print(f"  round {r + 1}/{rounds} done", flush=True)
    extra = {c: [run - base for run, base in zip(raw[c], raw["none"], strict=True)] for c in CONFIGS[1:]}
    return {"raw": raw, "extra": extra, "direct": direct, "state_key": keys}


def _row(label: str, values: list[float]) -> str:
    return f"| {label} | {min(values):.2f} | {statistics.median(values):.2f} | {max(values):.2f} | {len(values)} |"


def render(result: dict[str, Any], command: str, seconds: float) -> str:
    import os

    load = [round(x, 2) for x in os.getloadavg()]
    lines = [
        START,
        "",
        f"Run: `{command}` in {seconds:.0f} s. Python {platform.python_version()}, torch {torch.__version__}, "
        f"lightning {lightning.__version__}; {os.cpu_count()} cores, load average at the end {load}.",
        "",
        "| µs per batch | min | median | max | rounds |",
        "|---|---:|---:|---:|---:|",
        _row("an empty training step, no callback", result["raw"]["none"]),
        *(_row(LABELS[c], result["extra"][c]) for c in CONFIGS[1:]),
        _row("`VizTraceCallback`'s two batch hooks, timed directly", result["direct"]),
        _row(
            f"Lightning's {HOOKS_PER_BATCH} reads of its `state_key` - of `Callback()`'s, timed directly",
            result["state_key"],
        ),
        "",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 batches, nothing written")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches = 2, 300
    quiet()
    started = time.monotonic()
    result = measure(args.rounds, args.batches)
    command = " ".join(["python benchmarks/quiet_batch.py", *sys.argv[1:]])
    block = render(result, command, time.monotonic() - started)
    print(block)
    if not (args.quick or args.no_write):
        write_block(ROOT / "docs" / "performance.md", START, END, block)


if __name__ == "__main__":
    main()
