"""What the run budget bounds (issue 22: 9): a one-batch window at every batch.  Usage:

    python benchmarks/budget.py [--steps 200] [--repeats 3]     # ~3 minutes on 2 cores

Three arms, interleaved, each a fresh Trainer fitting the same small MLP on CPU for ``--steps``
batches: no callback (the baseline); ``VizTraceCallback(wait=0, warmup=0, active=1, repeat=0)`` with
the default budget; the same with every budget lifted. Prints a markdown table of fit seconds
(median, min-max over the repeats), the ratio to the baseline's median, and the windows written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


ARMS = {
    "no callback": None,
    "window at every batch, default budget": {},
    "window at every batch, budget lifted": {
        "budget_windows": None,
        "budget_output_mb": None,
        "budget_time_share": None,
    },
}


def fit(steps: int, budget: dict | None) -> tuple[float, int]:
    callbacks = []
    if budget is not None:
        callbacks.append(VizTraceCallback(wait=0, warmup=0, active=1, repeat=0, summary=False, **budget))
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
        )
        data = DataLoader(TensorDataset(torch.randn(steps * 16, 64)), batch_size=16)
        start = time.perf_counter()
        trainer.fit(MLP(), data)
        seconds = time.perf_counter() - start
    return seconds, len(callbacks[0].results) if callbacks else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    windows: dict[str, list[int]] = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm, budget in ARMS.items():  # interleaved: each repeat runs every arm once
            seconds, written = fit(args.steps, budget)
            times[arm].append(seconds)
            windows[arm].append(written)
    base = statistics.median(times["no callback"])
    print(f"{args.steps} batches, {args.repeats} repeats, Python {sys.version.split()[0]}, torch {torch.__version__}\n")
    print("| arm | fit s, median (min-max) | x baseline | windows written |")
    print("|---|---|---|---|")
    for arm in ARMS:
        t = times[arm]
        print(
            f"| {arm} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) | "
            f"{statistics.median(t) / base:.1f}x | {'/'.join(map(str, windows[arm]))} |"
        )


if __name__ == "__main__":
    main()
