"""A days-long job in minutes (issue 28): thousands of one-step windows, memory and step time.  Usage:

    python benchmarks/long_run.py [--windows 2000] [--every 6] [--torch-windows 1000]   # ~5 min, 2 cores
    python benchmarks/long_run.py --windows 200 --torch-windows 200                     # smoke run
    python benchmarks/long_run.py --torch-only      # part 2 alone: runs on every torch in the CI matrix

Two parts:

1. ``fit``: a small MLP on CPU with ``VizTraceCallback(wait=every-2, warmup=1, active=1, repeat=0)``
   and every run budget lifted (``budget_windows`` / ``budget_output_mb`` / ``budget_time_share``
   None), for ``--windows`` windows. After each window's active batch it reads the RSS of the
   training process and of the writer process (``/proc/<pid>/statm``); the growth is the slope of a
   least-squares line through the samples from window ``--from-window`` (50) to the last, in KiB
   per window (goal: <= 10 in both). The step-time ratio is the median quiet step (no window) of
   the last 100 windows over that of windows 50-150 (goal: <= 1.2).
2. ``torch``: torch.profiler alone, in a fresh process per arm: a new ``torch.profiler.profile()``
   per one-step window, against one long-lived profile driven window after window (what
   ``recording/torchtracer.py`` does), each exporting its trace; the same slope of RSS.

Prints a markdown table (docs/performance.md, "Long runs") and writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
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

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") / 1024


def rss_kib(pid: int | None = None) -> float | None:
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except (OSError, ValueError, IndexError):
        return None


TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int | None = None) -> float | None:
    """CPU time (user + system, all threads) a process has used so far, in ms: unlike wall time,
    it does not move with the machine's load."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_MS
    except (OSError, ValueError, IndexError):
        return None


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (window, KiB): KiB per window."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


# ------------------------------------------------------------------------------------- part 1: fit
def fit_arm(windows: int, every: int, first: int, writer_timeout: float | None = None) -> dict[str, Any]:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from vt_lightning import VizTraceCallback

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (x,) = batch
            return self.net(x).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    import inspect

    names = ("budget_windows", "budget_output_mb", "budget_time_share")
    if "budget_windows" not in inspect.signature(VizTraceCallback).parameters:  # "before": the old names
        names = ("max_windows", "max_output_mb", "max_time_share")
    extra = {"writer_timeout": writer_timeout} if writer_timeout is not None else {}
    vt = VizTraceCallback(
        wait=every - 2, warmup=1, active=1, repeat=0, memory_snapshot=False, **dict.fromkeys(names, None), **extra
    )

    class Sampler(Callback):
        def __init__(self) -> None:
            self.training: list[tuple[int, float]] = []
            self.writer: list[tuple[int, float]] = []
            self.quiet: dict[int, list[float]] = {}  # window -> quiet step seconds after it
            self.quiet_cpu: dict[int, list[float]] = {}  # window -> training CPU ms of those steps
            self.writer_cpu: list[tuple[int, float]] = []  # (window, writer process CPU ms so far)
            self._start = 0.0
            self._start_cpu: float | None = None
            self.writer_obj: Any = None

        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            self._start_cpu = cpu_ms()
            self._start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            took = time.perf_counter() - self._start
            now_cpu = cpu_ms()
            batch = trainer.global_step - 1
            window, phase = divmod(batch, every)
            if phase == every - 1:  # the window's active batch just ended
                own = rss_kib()
                if own is not None:
                    self.training.append((window, own))
                self.writer_obj = vt._controller.writer or self.writer_obj  # None once fit ended
                process = getattr(vt._controller.writer, "process", None)
                writer = rss_kib(process.pid) if process is not None else None
                if writer is not None:
                    self.writer.append((window, writer))
                spent = cpu_ms(process.pid) if process is not None else None
                if spent is not None:
                    self.writer_cpu.append((window, spent))
            elif 1 <= phase < every - 3:  # quiet batches, away from the window and its close
                self.quiet.setdefault(window, []).append(took)
                if now_cpu is not None and self._start_cpu is not None:
                    self.quiet_cpu.setdefault(window, []).append(now_cpu - self._start_cpu)

    sampler = Sampler()
    steps = windows * every
    data = DataLoader(TensorDataset(torch.randn(512, 64)), batch_size=32)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            default_root_dir=root, accelerator="cpu", devices=1, max_steps=steps, max_epochs=-1,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            logger=False, callbacks=[sampler, vt],
        )  # fmt: skip
        start = time.perf_counter()
        trainer.fit(MLP(), data)
        seconds = time.perf_counter() - start
    outcomes = vt._controller.outcomes
    written = outcomes.history.count if hasattr(outcomes, "history") else len(outcomes.results)

    def median_quiet(lo: int, hi: int) -> float | None:
        values = [t for w in range(lo, hi) for t in sampler.quiet.get(w, [])]
        return statistics.median(values) if values else None

    def mean_quiet_cpu(lo: int, hi: int) -> float | None:
        values = [t for w in range(lo, hi) for t in sampler.quiet_cpu.get(w, [])]
        return statistics.fmean(values) if values else None

    def writer_cpu_per_window(lo: int, hi: int) -> float | None:
        inside = [(w, ms) for w, ms in sampler.writer_cpu if lo <= w < hi]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else None

    early, late = median_quiet(first, first + 100), median_quiet(windows - 100, windows)
    tenths = [(i * windows // 10, (i + 1) * windows // 10) for i in range(10)]
    return {
        "windows": windows,
        "written": written,
        "writers_abandoned": getattr(sampler.writer_obj, "abandoned", None),
        "reported_not_written": getattr(outcomes, "dropped", 0) + vt._controller.windows_skipped,
        "seconds": seconds,
        "training_kib_per_window": slope([p for p in sampler.training if p[0] >= first]),
        "writer_kib_per_window": slope([p for p in sampler.writer if p[0] >= first]),
        "training_rss_mib": [round(sampler.training[i][1] / 1024, 1) for i in (0, -1)] if sampler.training else None,
        "writer_rss_mib": [round(sampler.writer[i][1] / 1024, 1) for i in (0, -1)] if sampler.writer else None,
        "step_ms_early": early * 1e3 if early else None,
        "step_ms_late": late * 1e3 if late else None,
        "late_over_early": late / early if early and late else None,
        "quiet_step_ms_by_window": {
            w: round(statistics.median(v) * 1e3, 3) for w, v in sorted(sampler.quiet.items()) if v
        },
        # CPU time, which the machine's load does not inflate as it does wall time (a tick is 10 ms:
        # means over hundreds of steps)
        "quiet_step_cpu_ms_by_tenth": [_round(mean_quiet_cpu(lo, hi)) for lo, hi in tenths],
        "writer_cpu_ms_per_window_by_tenth": [_round(writer_cpu_per_window(lo, hi)) for lo, hi in tenths],
        "quiet_step_ms_by_tenth": [
            round(m * 1e3, 3) if (m := median_quiet(i * windows // 10, (i + 1) * windows // 10)) else None
            for i in range(10)
        ],
    }


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


# ----------------------------------------------------------------------------- part 2: torch only
TORCH_ARM = r"""
import os, sys, tempfile
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
import torch
from torch.profiler import ProfilerActivity
from vt_lightning.recording.torchtracer import experimental_config  # as the callback builds it
mode, n, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
x = torch.randn(32, 64)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024
def make():  # the options this torch takes (2.4 has neither trace_only nor profile_all_threads)
    return torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True,
        experimental_config=experimental_config(False))
shared = make() if mode == "long-lived" else None
path = os.path.join(tempfile.mkdtemp(), "t.json")
points = []
for i in range(n):
    prof = shared if shared is not None else make()
    prof.profiler = None  # each window a session of its own (as recording/torchtracer.py)
    prof.prepare_trace(); prof.start_trace()
    with torch.autograd.profiler.record_function(f"ProfilerStep#{i}"):
        model(x).pow(2).mean().backward()
    prof.stop_trace()
    prof.export_chrome_trace(path)
    del prof
    if i >= first:
        points.append((i, rss()))
import json
print(json.dumps(points))
"""


def torch_arm(mode: str, windows: int, first: int) -> float | None:
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_ARM, mode, str(windows), str(first)],
        capture_output=True, text=True, timeout=3600, check=True,
    )  # fmt: skip
    points = json.loads(proc.stdout.strip().splitlines()[-1])
    return slope([(int(w), float(kib)) for w, kib in points])


def _fmt(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--every", type=int, default=6, help="batches per window cycle (>= 5)")
    parser.add_argument("--from-window", type=int, default=50)
    parser.add_argument("--torch-windows", type=int, default=1000, help="0: skip the torch.profiler-only part")
    parser.add_argument("--torch-only", action="store_true", help="only the torch.profiler-only part (any torch)")
    parser.add_argument(
        "--writer-timeout", type=float, default=None, help="the callback's writer_timeout (default: its own)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.every < 5 or args.windows < args.from_window + 3:
        parser.error("--every must be >= 5 and --windows more than --from-window + 2")
    import torch

    result: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if args.torch_windows:
        result["torch_only"] = {
            mode: torch_arm(mode, args.torch_windows, args.from_window) for mode in ("new per window", "long-lived")
        }
    if args.torch_only:
        print(f"torch {result['torch']}, Python {result['python']}\n\n| measure | value |\n|---|---:|")
        for mode, kib in result.get("torch_only", {}).items():
            print(f"| torch.profiler only, {mode}, KiB per window | {_fmt(kib)} |")
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    result["fit"] = fit_arm(args.windows, args.every, args.from_window, args.writer_timeout)
    f = result["fit"]
    print(
        f"torch {result['torch']}, Python {result['python']}: {f['written']} windows written and "
        f"{f['reported_not_written']} reported not written, of {f['windows']}, in {f['seconds']:.0f} s; "
        f"writers abandoned: {f['writers_abandoned']}\n"
    )
    print("| measure | value | goal |\n|---|---:|---:|")
    print(f"| training process, KiB per window (windows {args.from_window}-{args.windows - 1}) | "
          f"{_fmt(f['training_kib_per_window'])} | <= 10 |")  # fmt: skip
    print(f"| writer process, KiB per window | {_fmt(f['writer_kib_per_window'])} | <= 10 |")
    print(f"| quiet step, late / early (ms) | {_fmt(f['late_over_early'], 2)} "
          f"({_fmt(f['step_ms_early'], 2)} -> {_fmt(f['step_ms_late'], 2)}) | <= 1.2 |")  # fmt: skip
    print(f"| quiet step by tenth of the run (ms) | {' '.join(_fmt(v, 2) for v in f['quiet_step_ms_by_tenth'])} | |")
    print(f"| quiet step CPU by tenth (ms, training process) | "
          f"{' '.join(_fmt(v, 2) for v in f['quiet_step_cpu_ms_by_tenth'])} | |")  # fmt: skip
    print(f"| writer process CPU per window by tenth (ms) | "
          f"{' '.join(_fmt(v, 1) for v in f['writer_cpu_ms_per_window_by_tenth'])} | |")  # fmt: skip
    for mode, kib in (result.get("torch_only") or {}).items():
        print(f"| torch.profiler only, {mode}, KiB per window | {_fmt(kib)} | |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
