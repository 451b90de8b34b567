"""vt_lightning benchmark suite (issue 7).  Usage:

    python benchmarks/run.py            # full run (< 10 min on 2 cores); writes docs/performance.md
    python benchmarks/run.py --quick    # ~1 min smoke run
    python benchmarks/run.py --no-write # print only

What is measured (everything inside a real Lightning ``Trainer.fit``; see docs/performance.md):

1. quiet steps: per-step time outside windows (before the first, between, after the last) with the
   callback vs without, plus an empty callback (Lightning's per-callback dispatch), the callback
   with every trigger armed (slow step, memory growth, trigger file, signal), and the naive anchor
   (a ``VizTracer`` built at setup, never started); the triggers' coarse check and the DDP
   agreement's all-reduce (2 gloo processes) timed directly;
2. window-end stall (last active batch's end-hook entry -> next batch start) vs VizTracer's own
   ``save()`` of the same steps to .json.gz, background write time, bytes/event, and the step time
   while the writer runs (GIL contention) vs steady state;
3. active steps vs VizTracer + torch.profiler by hand and vs Lightning's
   ``PyTorchProfiler(with_stack=True)``;
4. scaling of stall / write time over 1e4, 1e5, 1e6 Python events per window.

Every configuration runs in the same process, interleaved round-robin with a rotating order, and
results are ratios against the baseline of the same round; min / median / max over rounds.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

import instrument
import lightning
import lightning as L
import report
import torch
import viztracer
from lightning.pytorch.callbacks import Callback
from workload import ManualProfilers, NaiveConstructedTracer, PyHeavyModel, StepClock, StopWhen

from vt_lightning import VizTraceCallback

# ------------------------------------------------------------------ parameters
QUIET_CALLS = 80_000  # Python calls per ordinary step (~5 ms of Python)
WINDOW_CALLS_IN_QUIET_RUNS = 100  # keep the quiet runs' windows small so their writer finishes quickly
WAIT = 10  # window schedule of the size runs: steps 0..9 quiet, 10 warmup, 11..13 active
ACTIVE = 5
SETTLE_STEPS = 25  # steady steps recorded once the writer is idle
ARMED_SIGNAL = "SIGUSR1" if hasattr(__import__("signal"), "SIGUSR1") else None


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "viztracer": viztracer.__version__,
        "orjson": _version("orjson"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_at_start": load,
    }


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"


def fit(model: L.LightningModule, callbacks: list[Callback], root: str, profiler: Any = None) -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
        callbacks=callbacks,
        profiler=profiler,
    )
    trainer.fit(model)
    leftover = sys.getprofile() or threading.getprofile()
    if leftover is not None:  # a configuration left a profile hook behind: it would slow every later run
        sys.setprofile(None)
        threading.setprofile(None)
        raise RuntimeError(f"a profile hook was left installed after fit: {leftover!r}")


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def step_times(clock: StepClock) -> list[float]:
    """Seconds from each batch start to the next (the last batch has none)."""
    return [(b - a) / 1e9 for a, b in itertools.pairwise(clock.start)]


# ------------------------------------------------------------------ 1. quiet steps
def quiet_layout(quick: bool) -> dict[str, int]:
    skip_first, wait = (20, 120) if quick else (40, 200)
    after = 100 if quick else 150
    w1 = skip_first + wait  # warmup step of window 1
    w2 = w1 + 1 + ACTIVE + wait  # warmup step of window 2
    return {"skip_first": skip_first, "wait": wait, "w1": w1, "w2": w2, "total": w2 + 1 + ACTIVE + after}


def run_quiet(config: str, layout: dict[str, int], root: str) -> dict[str, Any]:
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    writer_done: list[int] = []
    cb = None
    if config == "empty":
        callbacks.append(Callback())
    elif config == "naive":
        callbacks.append(NaiveConstructedTracer())
    elif config in ("vt", "armed"):
        triggers: dict[str, Any] = {"trigger_file": False}
        if config == "armed":  # every trigger armed; thresholds no quiet step reaches (the cost is the same)
            triggers = {
                "slow_step_factor": 50.0,
                "memory_growth": 1.0,
                "trigger_file": True,
                "trigger_cooldown": 10**6,
                "trigger_signal": ARMED_SIGNAL,
            }
        cb = VizTraceCallback(
            skip_first=layout["skip_first"],
            wait=layout["wait"],
            warmup=1,
            active=ACTIVE,
            repeat=2,
            dirpath=root,
            **triggers,
        )
        instrument.time_writer_jobs(cb, writer_done)
        callbacks.append(cb)
    total = layout["total"]
    callbacks.append(StopWhen(lambda step: step >= total - 1))
    w1, w2 = layout["w1"], layout["w2"]
    active = tuple(range(w1 + 1, w1 + 1 + ACTIVE)) + tuple(range(w2 + 1, w2 + 1 + ACTIVE))
    fit(PyHeavyModel(QUIET_CALLS, WINDOW_CALLS_IN_QUIET_RUNS, active), callbacks, root)
    times = step_times(clock)
    # step i is quiet-and-idle when it is outside both windows and no window is being written
    windows = set(range(w1, w1 + 1 + ACTIVE + 1)) | set(range(w2, w2 + 1 + ACTIVE + 1))  # +1: the close

    def idle(i: int) -> bool:  # step i overlaps no writer job
        return not any(clock.start[i] < end and clock.start[i + 1] > begin for begin, end in writer_done)

    ranges = {
        "before": range(5, w1),
        "between": range(w1 + 1 + ACTIVE + 1, w2),
        "after": range(w2 + 1 + ACTIVE + 1, len(times)),
    }
    out: dict[str, Any] = {}
    for name, steps in ranges.items():
        sel = [times[i] for i in steps if i not in windows and idle(i)]
        out[name] = {"median_s": med(sel), "n": len(sel)}
    out["busy_steps"] = sum(1 for i in range(len(times)) if i not in windows and not idle(i))
    out["events"] = [r.python_events for r in cb.results] if cb is not None else []
    return out


def bench_quiet(rounds: int, root: str) -> dict[str, Any]:
    layout = quiet_layout(rounds < 3)
    configs = ["base", "empty", "vt", "armed", "naive"]
    raw: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for config in order:
            d = tempfile.mkdtemp(dir=root)
            raw[config].append(run_quiet(config, layout, d))
            shutil.rmtree(d, ignore_errors=True)
            gc.collect()
        print(f"  quiet round {r + 1}/{rounds} done", flush=True)
    ratios: dict[str, dict[str, list[float]]] = {}
    for config in ("empty", "vt", "armed", "naive"):
        ratios[config] = {}
        for region in ("before", "between", "after"):
            ratios[config][region] = [
                run[region]["median_s"] / base[region]["median_s"]
                for run, base in zip(raw[config], raw["base"], strict=False)
            ]
    extra_us = {
        config: [
            (run["before"]["median_s"] - base["before"]["median_s"]) * 1e6
            for run, base in zip(raw[config], raw["base"], strict=False)
        ]
        for config in ("empty", "vt", "armed")
    }
    hook_us = [quiet_hook_cost_us() for _ in range(rounds)]
    direct = [
        (base["before"]["median_s"] + us * 1e-6) / base["before"]["median_s"]
        for us, base in zip(hook_us, raw["base"], strict=False)
    ]
    armed_hook_us = [quiet_hook_cost_us(armed=True) for _ in range(rounds)]
    check_us = [trigger_check_cost_us(root) for _ in range(rounds)]
    return {
        "layout": layout,
        "raw": raw,
        "ratios": ratios,
        "extra_us_before": extra_us,
        "hook_us": hook_us,
        "direct_ratio": direct,
        "armed_hook_us": armed_hook_us,
        "check_us": check_us,
    }


def quiet_hook_cost_us(calls: int = 200_000, armed: bool = False) -> float:
    """What VizTraceCallback adds to a quiet step, timed directly: its two batch hooks outside any
    window (the only code it runs there; tests prove no hook is installed). Immune to the step-time
    noise that dominates the ratios above; best of 5. ``armed``: with the slow-step trigger, whose
    quiet batches also read the clock and append to the baseline (the coarse checks are timed apart)."""
    cb = VizTraceCallback(skip_first=10**9)
    if armed:
        from vt_lightning.analysis.triggers import SlowStep

        cb._controller.slow = SlowStep(3.0, 50, time.perf_counter_ns)  # as armed by setup
        cb._controller.next_look, cb._controller.next_check = -1, 10**12
    progress = SimpleNamespace(total=SimpleNamespace(ready=6))  # batch 5 in progress (Lightning's counter)
    trainer = SimpleNamespace(
        fit_loop=SimpleNamespace(total_batch_idx=5, epoch_loop=SimpleNamespace(batch_progress=progress))
    )
    start, end = cb.on_train_batch_start, cb.on_train_batch_end
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            start(trainer, None, None, 0)
            end(trainer, None, None, None, 0)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def trigger_check_cost_us(root: str, checks: int = 5000) -> float:
    """One coarse check in one process, every trigger armed: stat of the trigger file, one read of
    /proc/self/statm, the signal flag, the slow-step median (50 steps) and the cadence; best of 3."""
    from vt_lightning.analysis.schedule import Schedule
    from vt_lightning.analysis.sources import WindowPlan
    from vt_lightning.analysis.triggers import TriggerConfig
    from vt_lightning.controller.agreement import Agreement
    from vt_lightning.controller.watch import TriggerWatch
    from vt_lightning.recording.probes import memory_reader

    config = TriggerConfig(slow_step_factor=3.0, memory_growth=1.0, trigger_file=True)
    read, kind = memory_reader()
    watch = TriggerWatch(
        config,
        Agreement(0),
        time.perf_counter_ns,
        Path(root) / "vt_lightning.trigger",
        None,
        read,
        kind,
        lambda key, message: None,
        first_check=0,
    )
    for _ in range(60):
        watch.slow.steady()
    plan = WindowPlan(Schedule(), scheduled=False)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for step in range(checks):
            watch.next_check = step
            watch.check(step, plan)
        best = min(best, (time.perf_counter() - t0) / checks)
    return best * 1e6


def _agreement_worker(rank: int, world: int, init: str, checks: int, out: Any) -> None:
    import torch.distributed as dist

    from vt_lightning.analysis.triggers import SLOW_STEP, Firing
    from vt_lightning.controller.agreement import gloo_agreement

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    agreement, _ = gloo_agreement(rank, None)
    for _ in range(200):
        agreement.agree([], 8)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(checks):
        agreement.agree([], 8)
    quiet = (time.perf_counter() - t0) / checks
    fired = [Firing(SLOW_STEP, 5, 0.4, 0.01, "s")] if rank == 1 else []
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(checks // 10):
        agreement.agree(fired, 8)
    firing = (time.perf_counter() - t0) / (checks // 10)
    if rank == 0:
        out.put({"quiet_us": quiet * 1e6, "firing_us": firing * 1e6})
    dist.destroy_process_group()


def agreement_cost_us(root: str, checks: int = 2000) -> dict[str, float]:
    """The DDP agreement's collective per check, 2 gloo processes on this machine (rank 0's view)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tempfile.mktemp(dir=root, prefix='store-')}"
    procs = [ctx.Process(target=_agreement_worker, args=(r, 2, init, checks, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return result


# ------------------------------------------------------------------ 2-4. windows of 1e4 / 1e5 / 1e6 events
def run_window(config: str, calls: int, entries: int, root: str) -> dict[str, Any]:
    clock = StepClock()
    active = tuple(range(WAIT + 1, WAIT + 1 + ACTIVE))
    last = active[-1]
    callbacks: list[Callback] = [clock]
    writer_done: list[int] = []
    state: dict[str, Any] = {"done_step": None}
    cb = manual = None
    profiler = None
    stages = instrument.Stages()
    if config in ("vt", "vt_nolv"):
        cb = VizTraceCallback(
            skip_first=0,
            wait=WAIT,
            warmup=1,
            active=ACTIVE,
            repeat=1,
            dirpath=root,
            tracer_entries=entries,
            lightning_view=config == "vt",
        )
        instrument.time_writer_jobs(cb, writer_done)
        callbacks.append(cb)
    elif config == "manual":
        manual = ManualProfilers(active, root, entries)
        callbacks.append(manual)
    elif config == "ptl":
        from lightning.pytorch.profilers import PyTorchProfiler

        profiler = PyTorchProfiler(
            dirpath=root,
            filename="ptl",
            with_stack=True,
            profile_memory=True,
            schedule=torch.profiler.schedule(wait=WAIT, warmup=1, active=ACTIVE, repeat=1),
        )

    def stop(step: int) -> bool:
        if step >= last + 10_000:
            return True
        if cb is None:
            return step >= last + SETTLE_STEPS
        if writer_done and state["done_step"] is None:
            state["done_step"] = step
        return state["done_step"] is not None and step >= max(state["done_step"], last) + SETTLE_STEPS

    callbacks.append(StopWhen(stop))
    model = PyHeavyModel(QUIET_CALLS, heavy_calls=calls, heavy_steps=active)
    with instrument.stage_timers(stages):
        fit(model, callbacks, root, profiler)
    times = step_times(clock)
    active_s = [(clock.end[i] - clock.start[i]) / 1e9 for i in active]
    steady_active = active_s[1:]  # the first active step also pays the window's activation
    gaps = [(clock.start[i + 1] - clock.end[i]) / 1e9 for i in range(len(clock.start) - 1)]
    out: dict[str, Any] = {
        "active_step_s": med(steady_active),
        "first_active_step_s": active_s[0],
        "active_steps_s": active_s,
        "stall_s": gaps[last],
        "quiet_gap_s": med(gaps[last + 5 :]) if len(gaps) > last + 5 else med(gaps[2:WAIT]),
        "torch_on_at_active_end": [clock.torch_on[i] for i in active],
    }
    if cb is not None:
        t_end = clock.end[last]
        done = writer_done[0][1] if writer_done else None
        out["write_s"] = (done - t_end) / 1e9 if done is not None else None
        busy = [times[i] for i in range(last + 1, len(times)) if done is not None and clock.start[i + 1] <= done]
        steady_from = next((i for i in range(last + 1, len(times)) if clock.start[i] >= (done or 0)), len(times)) + 3
        steady = times[steady_from:]
        # mean, not median: the GIL convoy makes the steps bimodal (normal ones, and 20-30x slower ones)
        out["busy_step_s"] = sum(busy) / len(busy) if busy else float("nan")
        out["busy_max_step_s"] = max(busy) if busy else float("nan")
        out["busy_steps"] = len(busy)
        out["steady_step_s"] = med(steady)
        out["steady_steps"] = len(steady)
        # training time the write cost: busy wall time minus the same steps at steady speed
        out["lost_s"] = sum(busy) - len(busy) * out["steady_step_s"] if busy else 0.0
        res = cb.results[0] if cb.results else None
        if res is not None:
            out.update(
                python_events=res.python_events,
                torch_events=res.torch_events,
                trace_bytes=res.trace_bytes,
                json_bytes=res.json_bytes,
                overflow=res.overflow,
            )
        out["stages"] = stages.summary()
    elif config == "manual":
        out.update(manual.times)
        out["viztracer_gz_bytes"] = os.path.getsize(manual.viztracer_file) if manual.viztracer_file else None
    return out


def bench_windows(plan: list[tuple[int, int]], with_ptl: set[int], root: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for target, reps in plan:
        calls = max(1, target // ACTIVE - instrument.OVERHEAD_EVENTS_PER_STEP)
        entries = max(1_000_000, 2 * target)
        configs = ["none", "manual", "vt"] + (["ptl", "vt_nolv"] if target in with_ptl else [])
        raw: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
        for r in range(reps):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for config in order:
                d = tempfile.mkdtemp(dir=root)
                t0 = time.perf_counter()
                raw[config].append(run_window(config, calls, entries, d))
                raw[config][-1]["fit_wall_s"] = time.perf_counter() - t0
                shutil.rmtree(d, ignore_errors=True)
                gc.collect()
            print(f"  {target:.0e} events: round {r + 1}/{reps} done", flush=True)
        results[str(target)] = {"target_events": target, "calls_per_active_step": calls, "raw": raw}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (fewer rounds, no 1e6)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not touch docs/ or benchmarks/results/")
    parser.add_argument("--rounds", type=int, default=None, help="quiet-step rounds (default 6, quick 2)")
    parser.add_argument("--results", default=str(HERE / "results" / "latest.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument(
        "--render", metavar="JSON", help="only re-render docs/performance.md (+ plot) from a results file"
    )
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        results["summary"] = report.summarize(results)
        print(report.text_tables(results))
        png = report.plot(results, ROOT / "docs" / "img")
        report.write_doc(Path(args.doc), results, Path(args.render), png)
        return 0

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vt_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)

    started = time.perf_counter()
    info = machine_info()
    print(report.header(info), flush=True)
    root = tempfile.mkdtemp(prefix="vt-bench-")
    try:
        rounds = args.rounds or (2 if args.quick else 6)
        print("1. quiet steps", flush=True)
        quiet = bench_quiet(rounds, root)
        quiet["agreement"] = [
            agreement_cost_us(root, 500 if args.quick else 2000) for _ in range(2 if args.quick else 3)
        ]
        plan = [(10_000, 2), (100_000, 1)] if args.quick else [(10_000, 5), (100_000, 5), (1_000_000, 3)]
        with_ptl = {10_000} if args.quick else {10_000, 100_000}
        print("2-4. windows", flush=True)
        windows = bench_windows(plan, with_ptl, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {
        "info": info,
        "quick": args.quick,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "params": {"quiet_calls": QUIET_CALLS, "wait": WAIT, "active": ACTIVE, "rounds": rounds},
        "quiet": quiet,
        "windows": windows,
    }
    summary = report.summarize(results)
    results["summary"] = summary
    print(report.text_tables(results), flush=True)
    print(f"total {results['elapsed_s']:.0f} s", flush=True)
    if not args.no_write:
        out = Path(args.results)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str))
        png = report.plot(results, ROOT / "docs" / "img")
        report.write_doc(Path(args.doc), results, out, png)
        print(f"wrote {out} and {args.doc}" + (f" and {png}" if png else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
