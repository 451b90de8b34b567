"""What the writer costs per event, against VizTracer's own ``save()`` of the same events (issue 39).

    python benchmarks/writer_cost.py                 # capture 4 windows, replay each, print the table
    python benchmarks/writer_cost.py --quick         # 1e4 and the real-model window only, 1 round
    python benchmarks/writer_cost.py --jobs DIR      # replay jobs captured before (``--keep DIR``)
    python benchmarks/writer_cost.py --profile real  # cProfile of one replay of that window, by function

Capture: real ``Trainer.fit`` runs record one window each and hand it to the writer; the benchmark
takes the ``WindowJob`` (and copies its raw dumps) at the moment the writer would finish it. Windows:

* ``1e4`` / ``1e5`` / ``1e6``: ``PyHeavyModel`` (benchmarks/workload.py), a training step of that
  many tiny Python calls, no DataLoader workers;
* ``real``: a model as a user writes it, without torchvision (which replaces the pinned CPU torch):
  a small convolutional network fed by 2 DataLoader workers whose ``__getitem__`` augments each
  sample in pure Python (crop, flip, jitter, normalise per row), about 170,000 events in the window,
  most of them from the workers, as in issue 39's ResNet-18 window (140,851 of 169,495).

Replay: each job is finished ``--repeats`` times by ``export.pipeline.finish_window`` in a fresh
``python -I`` process with the collector paused (as the writer process runs it), interleaved with
the baseline on the same events: VizTracer's ``save()`` to ``.json.gz`` of the window's Python events
(``ReportBuilder.save``, what ``save()`` runs once the tracer's buffer is parsed; the parse itself,
``Tracer.load``, is timed separately on a live tracer holding as many calls of one tiny function
and added, so the baseline is VizTracer's whole ``save()``). Stage timings wrap the pipeline's own
functions (nothing in ``vt_lightning/`` changes for the benchmark). Printed: µs per event (Python
plus torch events of the window), min / median / max over the repeats, and the md5 of the trace JSON
written (the same on every repeat and before/after a change that keeps the output).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import hashlib
import json
import os
import pickle
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

from _common import cpu_trainer, quiet, write_block, writer_in_process


def _clock() -> float:
    """CPU seconds of this process: the writer's cost (issue 39: "7 s of writer CPU"), and far
    steadier than wall time on a machine that other jobs share."""
    return time.process_time()


START = "<!-- writer-cost:start -->"
END = "<!-- writer-cost:end -->"
SIZES = {"1e4": 10_000, "1e5": 100_000, "1e6": 1_000_000}
WARMUP_BATCHES = 3  # the window: batches 3 (warmup), 4-6 (active)
ACTIVE = 3


# --------------------------------------------------------------------------------------------------
# The real-model window: pure-Python augmentation in 2 DataLoader workers, a small conv net
# --------------------------------------------------------------------------------------------------


def _crop(image: list[list[float]], top: int, left: int, size: int) -> list[list[float]]:
    return [row[left : left + size] for row in image[top : top + size]]


def _flip_row(row: list[float]) -> list[float]:
    return row[::-1]


def _jitter(value: float, gain: float) -> float:
    return min(max(value * gain, 0.0), 1.0)


def _normalise_row(row: list[float], mean: float, std: float) -> list[float]:
    return [(_jitter(v, 1.1) - mean) / std for v in row]


class AugmentingData:
    """A map-style dataset that augments each 16x16 image in Python (what torchvision's transforms
    and PIL do, in C and Python, for issue 39's ResNet): ~90 Python calls a sample."""

    def __init__(self, length: int = 100_000, size: int = 20, crop: int = 16) -> None:
        self.length, self.size, self.crop = length, size, crop

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        import torch

        rng = random.Random(i)
        image = [[rng.random() for _ in range(self.size)] for _ in range(self.size)]
        top, left = rng.randrange(self.size - self.crop), rng.randrange(self.size - self.crop)
        image = _crop(image, top, left, self.crop)
        if i % 2:
            image = [_flip_row(row) for row in image]
        image = [_normalise_row(row, 0.5, 0.25) for row in image]
        return torch.tensor(image).unsqueeze(0), i % 10


def real_model(batch_size: int = 44) -> Any:
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    class SmallConvNet(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(16, 10),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            return DataLoader(AugmentingData(), batch_size=batch_size, num_workers=2, shuffle=False)

    return SmallConvNet()


# --------------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------------


def _copy_job(job: Any, into: Path) -> Any:
    """The job with its raw dumps (and the workers' parts) copied into ``into``."""
    import dataclasses

    into.mkdir(parents=True, exist_ok=True)

    def copy(path: Any) -> Any:
        if path is None:
            return None
        target = into / Path(path).name
        shutil.copyfile(path, target)
        return type(path)(target) if not isinstance(path, str) else str(target)

    extras = dict(job.extras)
    workers = extras.get("workers")
    if isinstance(workers, dict) and workers.get("dir"):
        parts = into / "workers"
        shutil.copytree(workers["dir"], parts, dirs_exist_ok=True)
        extras["workers"] = {**workers, "dir": str(parts), "wait_s": 0.0}
    return dataclasses.replace(job, torch_raw=copy(job.torch_raw), python_raw=copy(job.python_raw), extras=extras)


def capture(name: str, into: Path) -> Path:
    """One fit that records one window; returns the pickled job's path."""
    import lightning  # noqa: F401  (imported before vt_lightning, as a user's script does)

    from vt_lightning import VizTraceCallback
    from vt_lightning.controller import handoff

    quiet()
    out = into / name
    path = out / "job.pkl"

    def spy(original: Any) -> Any:
        def take(job: Any) -> Any:
            pristine = pickle.loads(pickle.dumps(job))  # as the writer process receives it
            result = original(job)  # the raw dumps stay until the result is delivered; the parts are complete
            if not path.exists():
                path.write_bytes(pickle.dumps(_copy_job(pristine, out / "raw"), protocol=pickle.HIGHEST_PROTOCOL))
            return result

        return take

    root = tempfile.mkdtemp(prefix="vt-bench-writer-")
    try:
        if name == "real":
            model = real_model()
            entries = 1_000_000
        else:
            from workload import PyHeavyModel

            calls = SIZES[name] // ACTIVE
            active = tuple(range(WARMUP_BATCHES + 1, WARMUP_BATCHES + 1 + ACTIVE))
            model = PyHeavyModel(50, heavy_calls=calls, heavy_steps=active)
            entries = max(1_000_000, 2 * SIZES[name])
        cb = VizTraceCallback(
            wait=WARMUP_BATCHES,
            warmup=1,
            active=ACTIVE,
            repeat=1,
            dirpath=root,
            tracer_entries=entries,
        )
        with writer_in_process(handoff, "finish_window", spy):  # finish on the writer thread, where the job is taken
            cpu_trainer(root, [cb], WARMUP_BATCHES + ACTIVE + 3).fit(model)
        if not path.exists():
            raise RuntimeError(f"window {name}: no job reached the writer")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return path


def end_wait(into: Path) -> dict[str, Any]:
    """The end-of-fit wait on the real model: its window closes 2 batches before ``max_steps``, so
    a CPU run holds it and finishes it in this process when training stops (``handoff.finishes_at_end``).
    Measured: from the last batch's end (a callback first in the list) to ``fit`` returning (the
    console's "waited ... for the writer" line is most of it), and the CPU the process spent while
    the held window was finished (training is over then: the finish's thread and its gzip's).

    The yardstick is the same window's ``save()`` in this process once ``fit`` returned: the held
    window's raw dumps are linked aside as its finish returns (before the training thread removes
    them), then VizTracer's parse and ``save()`` of those events are timed here, with the collector
    paused as the held finish runs. The training process's heap makes both slower than in a fresh
    process, so this compares the two where the user's wait happens."""
    from lightning.pytorch.callbacks import Callback

    from vt_lightning import VizTraceCallback

    quiet()

    class LastBatch(Callback):
        at = 0.0

        def on_train_batch_end(self, *args: Any) -> None:
            self.at = time.perf_counter()

    from vt_lightning.controller import handoff

    held_cpu: list[float] = []
    kept: list[Any] = []
    finish = handoff._finish_with_collector_paused
    aside = into / "held-raw"

    def timed(job: Any) -> Any:  # the held window, finished on the writer thread once training stopped
        start = time.process_time()  # the process's: its gzip runs on a thread of its own
        try:
            return finish(job)
        finally:
            held_cpu.append(time.process_time() - start)
            kept.append(_link_raw_aside(job, aside))

    handoff._finish_with_collector_paused = timed
    last = LastBatch()
    cb = VizTraceCallback(wait=WARMUP_BATCHES, warmup=1, active=ACTIVE, repeat=1, dirpath=str(into))
    trainer = cpu_trainer(str(into), [last, cb], WARMUP_BATCHES + 1 + ACTIVE + 2)
    trainer.fit(real_model())
    wait = time.perf_counter() - last.at
    result = cb.results[0]
    python = _python_trace(kept[0])
    python_events = sum(1 for e in python["traceEvents"] if e.get("ph") != "M")
    gc.collect()
    gc.disable()  # as the held finish runs (handoff._finish_with_collector_paused)
    try:
        save_s = _save_seconds(python, aside / "save.json.gz")
    finally:
        gc.enable()
    parse_us = _viztracer_parse_us_per_event(min(python_events, 200_000))
    return {
        "wait_s": wait,
        "held_cpu_s": sum(held_cpu),
        "events": result.python_events + result.torch_events,
        "save_here_s": save_s + parse_us * python_events / 1e6,
    }


def _link_raw_aside(job: Any, aside: Path) -> Any:
    """A copy of ``job`` whose raw Python dump and worker parts are hard links under ``aside``:
    they outlive the training thread's removal of the originals (``pipeline.remove_raw``)."""
    import dataclasses

    aside.mkdir(parents=True, exist_ok=True)
    python_raw = aside / Path(job.python_raw).name
    os.link(job.python_raw, python_raw)
    extras = dict(job.extras)
    workers = extras.get("workers")
    if workers:
        prefix = f"b{int(workers['first'])}-r{int(workers['rank'])}-"
        for name in os.listdir(workers["dir"]):
            if name.startswith(prefix):
                os.link(os.path.join(workers["dir"], name), aside / name)
        extras["workers"] = {**workers, "dir": str(aside)}
    return dataclasses.replace(job, python_raw=python_raw, extras=extras)


def _end_wait_in_fresh_process(code: Path) -> dict[str, Any]:
    into = tempfile.mkdtemp(prefix="vt-bench-endwait-")
    script = (
        f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import writer_cost as w; "
        f"sys.path.insert(0, {str(code)!r}); "
        f"from pathlib import Path; print(json.dumps(w.end_wait(Path({into!r}))))"
    )
    try:
        out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    finally:
        shutil.rmtree(into, ignore_errors=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------------------------------
# Replay (in a fresh process: python -I, as the writer process runs)
# --------------------------------------------------------------------------------------------------

STAGES = [  # the names of this checkout's stages, and of the ones a checkout given to --against may have
    ("vt_lightning.export.pipeline", "_read_json", "read raw JSON"),
    ("vt_lightning.export.pipeline", "calibrate", "calibrate"),
    ("vt_lightning.export.pipeline", "collect_worker_dumps", "read workers' parts"),
    ("vt_lightning.export.pipeline", "filter_python_events", "filter"),
    ("vt_lightning.export.pipeline", "merge_trace", "merge"),  # the code before merge_window
    ("vt_lightning.export.pipeline", "merge_window", "merge"),
    ("vt_lightning.export.pipeline", "add_to_trace", "place workers"),
    ("vt_lightning.export.pipeline", "_apply_lightning_view", "Lightning view"),
    ("vt_lightning.export.pipeline", "apply_lightning_view", "Lightning view"),
    ("vt_lightning.export.pipeline", "encode_trace", "encode"),
    ("vt_lightning.export.atomic", "gzip_bytes", "gzip"),  # on a thread of its own, beside the summary
    ("vt_lightning.export.pipeline", "write_new", "write trace"),
    ("vt_lightning.export.pipeline", "_memory_snapshot", "memory snapshot"),
    ("vt_lightning.export.pipeline", "build_cpu_snapshot", "memory snapshot"),
    ("vt_lightning.export.pipeline", "_write_memory", "memory snapshot"),
    ("vt_lightning.export.pipeline", "_make_summary", "summary + verdicts"),
    ("vt_lightning.export.pipeline", "_summary", "summary + verdicts"),
    ("vt_lightning.export.pipeline", "_write_summary", "summary + verdicts"),
]


def _instrument(times: dict[str, float]) -> None:
    import functools
    import importlib

    for module_name, attr, label in STAGES:
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            continue
        fn = getattr(module, attr)

        @functools.wraps(fn)
        def timed(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
            start = time.thread_time()  # its own thread's CPU: gzip runs beside the summary
            try:
                return _fn(*args, **kwargs)
            finally:
                times[_label] = times.get(_label, 0.0) + time.thread_time() - start

        setattr(module, attr, timed)


def _python_trace(job: Any) -> dict[str, Any]:
    """The window's Python events as VizTracer holds them once parsed (main thread + workers)."""
    from vt_lightning.export.worker_dumps import collect_worker_dumps

    with open(job.python_raw, "rb") as f:
        import orjson

        data = orjson.loads(f.read())
    workers = collect_worker_dumps(job.extras.get("workers"))
    if workers is not None:
        data["traceEvents"].extend(workers.events)
    return data


def _viztracer_parse_us_per_event(events: int) -> float:
    """``Tracer.load`` (the first half of ``save()``) per event, on a live tracer holding ``events``
    calls of one tiny function."""
    from viztracer import VizTracer

    def tiny() -> None:
        pass

    tracer = VizTracer(tracer_entries=max(2 * events, 10_000), verbose=0, register_global=False)
    tracer.start()
    for _ in range(events):
        tiny()
    tracer.stop()
    start = _clock()
    tracer.parse()
    parsed = _clock() - start
    count = len(tracer.data["traceEvents"])
    tracer.clear()
    return parsed / max(count, 1) * 1e6


def _save_seconds(trace: dict[str, Any], out: Path) -> float:
    """VizTracer's ``save()`` after its parse: ``ReportBuilder.save`` of the parsed data."""
    from viztracer.report_builder import ReportBuilder

    data = {**trace, "traceEvents": list(trace["traceEvents"])}  # ReportBuilder edits it in place
    start = _clock()
    ReportBuilder(data, verbose=0).save(output_file=str(out))
    return _clock() - start


def replay(job_path: Path, repeats: int, profile: bool = False) -> dict[str, Any]:
    import dataclasses

    from vt_lightning.export import pipeline

    job = pickle.loads(job_path.read_bytes())
    scratch = Path(tempfile.mkdtemp(prefix="vt-bench-replay-"))
    times: dict[str, float] = {}
    _instrument(times)
    rows: list[dict[str, Any]] = []
    try:
        python = _python_trace(job)
        python_events = sum(1 for e in python["traceEvents"] if e.get("ph") != "M")
        parse_us = _viztracer_parse_us_per_event(min(python_events, 200_000))
        for i in range(repeats):
            times.clear()
            run_dir = scratch / f"run{i}"
            this = dataclasses.replace(job, run_dir=run_dir, job_id="")
            gc.collect()
            gc.disable()  # as writer_process._serve runs a job
            try:
                profiler = cProfile.Profile() if profile and i == repeats - 1 else None
                start = _clock()
                if profiler is not None:
                    profiler.enable()
                result = pipeline.finish_window(this)
                if profiler is not None:
                    profiler.disable()
                total = _clock() - start
            finally:
                gc.enable()
            raw = gzip.decompress(Path(result.trace_path).read_bytes())
            gc.collect()
            gc.disable()
            try:
                save_s = _save_seconds(python, scratch / f"save{i}.json.gz")
            finally:
                gc.enable()
            events = result.python_events + result.torch_events
            rows.append(
                {
                    "total_s": total,
                    "events": events,
                    "python_events": result.python_events,
                    "torch_events": result.torch_events,
                    "save_python_events": python_events,
                    "save_s": save_s + parse_us * python_events / 1e6,
                    "stages_s": dict(times),
                    "md5": hashlib.md5(raw).hexdigest(),
                }
            )
            shutil.rmtree(run_dir, ignore_errors=True)
        if profile:
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"rows": rows, "parse_us_per_event": parse_us}


def _replay_in_fresh_process(job_path: Path, repeats: int, code: Path = ROOT) -> dict[str, Any]:
    """``replay`` in a fresh ``python -I``, importing vt_lightning from ``code`` (a checkout)."""
    script = (
        f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import writer_cost as w; "
        f"sys.path.insert(0, {str(code)!r}); import vt_lightning; from pathlib import Path; "
        f"r = w.replay(Path({str(job_path)!r}), {repeats}); r['code'] = vt_lightning.__file__; "
        "print(json.dumps(r))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["code"].startswith(str(code)):
        raise RuntimeError(f"replay imported vt_lightning from {result['code']}, not from {code}")
    return result


def interleaved(jobs: dict[str, Path], repeats: int, codes: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Every window, ``repeats`` rounds; in each round one fresh process per checkout in ``codes``,
    their order rotating (A/B, B/A, ...), so a slow phase of a shared machine hits both."""
    results: dict[str, dict[str, Any]] = {}
    labels = list(codes)
    for name, path in jobs.items():
        for round_ in range(repeats):
            order = labels[round_ % len(labels) :] + labels[: round_ % len(labels)]
            for label in order:
                one = _replay_in_fresh_process(path, 1, codes[label])
                key = f"{name} [{label}]" if len(labels) > 1 else name
                results.setdefault(key, {"rows": [], "parse_us_per_event": []})
                results[key]["rows"].extend(one["rows"])
                results[key]["parse_us_per_event"].append(one["parse_us_per_event"])
    return results


def _capture_in_fresh_process(name: str, into: Path) -> Path:
    code = (
        f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(ROOT)!r}]; import writer_cost as w; "
        f"from pathlib import Path; print(w.capture({name!r}, Path({str(into)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def render(results: dict[str, dict[str, Any]], waits: dict[str, list[dict[str, Any]]], how: str) -> str:
    lines = [
        START,
        "### Figures (generated)",
        "",
        f"`python benchmarks/writer_cost.py {how}`".replace(" `", "`"),
        f"on Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end (other jobs shared the machine). µs of CPU per event (the",
        "window's Python and torch events), median (min-max) over the rounds; `[before]` is the",
        "checkout given to `--against`, replayed in the same rounds, the order alternating.",
        "",
        "| window | events (Python + torch) | writer µs/event | save() µs/event | writer / save() | md5 of the trace |",
        "|---|---:|---:|---:|---:|---|",
    ]
    stage_lines = []
    for name, result in results.items():
        rows = result["rows"]
        events = rows[0]["events"]
        writer = [r["total_s"] / r["events"] * 1e6 for r in rows]
        save = [r["save_s"] / r["events"] * 1e6 for r in rows]
        ratio = [r["total_s"] / r["save_s"] for r in rows]
        md5s = sorted({r["md5"] for r in rows})
        lines.append(
            f"| {name} | {events:,} ({rows[0]['python_events']:,} + {rows[0]['torch_events']:,}) | "
            f"{_spread(writer)} | {_spread(save)} | {_spread(ratio)} | {' '.join(m[:12] for m in md5s)} |"
        )
        stages = {k: statistics.median(r["stages_s"].get(k, 0.0) for r in rows) for k in rows[0]["stages_s"]}
        shown = ", ".join(f"{k} {v / events * 1e6:.2f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
        stage_lines.append(f"- {name}: {shown}")
    lines += ["", "µs of CPU per event by stage (medians):", "", *stage_lines]
    if any(waits.values()):
        lines += [
            "",
            "End-of-fit wait on the real model (its window held to the end of fit): wall seconds from the",
            "last batch's end to `fit` returning; the CPU seconds the process spent finishing the held",
            "window (its thread, and its gzip on a thread of its own); the same window's `save()` (VizTracer's",
            "parse and save of its Python events) timed in that process once `fit` returned, the yardstick;",
            "and, for comparison, that `save()` estimated from the replays above in a fresh process (their",
            "CPU per event times the window's events):",
            "",
            "| code | rounds | events | wait, wall (s) | held finish, CPU (s) | save() in that process (s) "
            "| wait / save() | finish CPU / save() | save() from the replays (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, runs in waits.items():
            if not runs:
                continue
            key = "real" if "real" in results else f"real [{label}]"
            rows = results.get(key) or results.get(f"real [{label}]") or {"rows": []}
            per_event = statistics.median(r["save_s"] / r["events"] for r in rows["rows"]) if rows["rows"] else 0.0
            wait = [r["wait_s"] for r in runs]
            held = [r["held_cpu_s"] for r in runs]
            here = [r["save_here_s"] for r in runs]
            replayed = [r["events"] * per_event for r in runs]
            lines.append(
                f"| {label} | {len(runs)} | {statistics.median(r['events'] for r in runs):,.0f} | {_spread(wait)} | "
                f"{_spread(held)} | {_spread(here)} | {_spread([w / h for w, h in zip(wait, here, strict=True)])} | "
                f"{_spread([c / h for c, h in zip(held, here, strict=True)])} | "
                f"{_spread(replayed) if per_event else '–'} |"
            )
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1e4 and the real window, 1 round (unless --repeats)")
    parser.add_argument("--windows", default=None, help="comma-separated: 1e4,1e5,1e6,real")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5, --quick 1)")
    parser.add_argument("--jobs", default=None, help="replay the jobs captured under this directory")
    parser.add_argument("--keep", default=None, help="capture into this directory and keep it")
    parser.add_argument("--profile", default=None, help="cProfile one replay of this window")
    parser.add_argument("--no-write", action="store_true", help="print only; docs/performance.md is left as it is")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--json", default=None, help="also write every repeat's figures here")
    parser.add_argument(
        "--end-waits", type=int, default=None, help="rounds of the end-of-fit wait (default: --repeats)"
    )
    parser.add_argument(
        "--against", default=None, help="a checkout of the code before (e.g. main): A/B, interleaved round by round"
    )
    args = parser.parse_args(argv)
    names = args.windows.split(",") if args.windows else (["1e4", "real"] if args.quick else [*SIZES, "real"])
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    for name in names:
        if name not in (*SIZES, "real"):
            parser.error(f"--windows: unknown window {name!r} (1e4, 1e5, 1e6, real)")
    if repeats < 1:
        parser.error("--repeats: at least 1")
    base = Path(args.jobs or args.keep or tempfile.mkdtemp(prefix="vt-bench-jobs-"))
    try:
        jobs = {}
        for name in names:
            existing = base / name / "job.pkl"
            jobs[name] = existing if args.jobs and existing.exists() else _capture_in_fresh_process(name, base)
        if args.profile:
            replay(jobs[args.profile], 1, profile=True)
            return 0
        codes = {"this": ROOT}
        if args.against:
            codes["before"] = Path(args.against).resolve()
        results = interleaved(jobs, repeats, codes)
        waits: dict[str, list[dict[str, Any]]] = {label: [] for label in codes}
        rounds = repeats if args.end_waits is None else args.end_waits
        if "real" in names:
            for round_ in range(rounds):
                labels = list(codes)
                for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
                    waits[label].append(_end_wait_in_fresh_process(codes[label]))
    finally:
        if not (args.jobs or args.keep):
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"replays": results, "end_waits": waits}, indent=1))
    block = render(results, waits, " ".join(sys.argv[1:]) if argv is None else " ".join(argv))
    print(block)
    if not args.no_write:
        write_block(Path(args.doc), START, END, block)
        print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
