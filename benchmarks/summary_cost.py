"""What the per-window summary costs (issue 13). Usage:

    python benchmarks/summary_cost.py            # 3 rounds x {1e4, 1e5} events; updates docs/performance.md
    python benchmarks/summary_cost.py --quick    # 1 round, 1e4 events only
    python benchmarks/summary_cost.py --no-write # print only

For each window size, real ``Trainer.fit`` runs with ``VizTraceCallback(summary=True)`` and
``summary=False``, interleaved. Measured per window:

* writer job: the whole background job (torch's export on the writer thread, then read / merge /
  encode / gzip / write / memory snapshot / summary in the writer process);
* summary: the part of that spent computing the summary and writing its two files
  (``WindowResult.summary_seconds``, timed in the writer process);
* time to trace: from the end of the window's last batch to the trace file's modification time;
* time to files: from the end of the window's last batch to the job's end (every file on disk);
* verdicts (analysis/verdicts/, part of the summary): every rule over the same merged trace, in one
  process, best of 5, beside the summary's other isolated costs.

Each run records two windows and measures the second: the first also pays the writer process's start.

The training thread does no summary work: it only logs the returned scalars at the next batch start.
"""

from __future__ import annotations

import argparse
import gc
import os
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

import instrument
from _common import quiet, write_block
from run import ACTIVE, QUIET_CALLS, WAIT, fit
from workload import PyHeavyModel, StepClock, StopWhen

from vt_lightning import VizTraceCallback

START = "<!-- summary-cost:start -->"
END = "<!-- summary-cost:end -->"


def one_window(summary: bool, calls: int, root: str) -> dict[str, Any]:
    """Two windows; the second is measured (the first also pays the writer process's start)."""
    clock = StepClock()
    cycle = WAIT + 1 + ACTIVE
    active = tuple(range(WAIT + 1, WAIT + 1 + ACTIVE))
    second = tuple(step + cycle for step in active)
    last = second[-1]
    jobs: list[tuple[int, int]] = []
    cb = VizTraceCallback(
        wait=WAIT,
        warmup=1,
        active=ACTIVE,
        repeat=2,
        dirpath=root,
        summary=summary,
        tracer_entries=max(1_000_000, 2 * calls * ACTIVE),
    )
    instrument.time_writer_jobs(cb, jobs)
    model = PyHeavyModel(QUIET_CALLS // 20, heavy_calls=calls, heavy_steps=active + second)
    wall_at_last: list[int] = []

    def stop(step: int) -> bool:
        if step == last:
            wall_at_last.append(time.time_ns())  # file mtimes are wall clock
        return len(jobs) >= 2 and step > last + 2

    fit(model, [clock, cb, StopWhen(stop)], root)
    (begin, end), result = jobs[1], cb.results[1]
    isolated = isolated_costs(result.trace_path) if summary else {}
    return {
        **isolated,
        "writer_job_s": (end - begin) / 1e9,
        "time_to_trace_s": (result.trace_path.stat().st_mtime_ns - wall_at_last[0]) / 1e9,
        "time_to_files_s": (end - clock.end[last]) / 1e9,
        "summary_s": result.summary_seconds if summary else 0.0,
        "python_events": result.python_events,
        "torch_events": result.torch_events,
    }


def _best(fn: Any, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def isolated_costs(trace_path: Path) -> dict[str, float]:
    """Best of 5, in this process, on the written window: the summary against the writer's other
    steps on the same trace (less sensitive to a loaded machine than the end-to-end times)."""
    import gzip

    import orjson

    from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot
    from vt_lightning.analysis.merge import encode_trace
    from vt_lightning.analysis.steps import read_window
    from vt_lightning.analysis.summary import summarize
    from vt_lightning.analysis.verdicts import find_verdicts
    from vt_lightning.export.atomic import gzip_bytes

    raw = gzip.decompress(trace_path.read_bytes())
    trace = orjson.loads(raw)
    snapshot = build_cpu_snapshot(trace["traceEvents"])
    summary = summarize(trace, snapshot)
    # What summarize hands the verdicts (its one read of the window), so their cost here is their own.
    data = read_window(trace)
    return {
        "iso_loads_s": _best(lambda: orjson.loads(raw)),
        "iso_encode_gzip_s": _best(lambda: gzip_bytes(encode_trace(trace), 3)),
        "iso_cpu_snapshot_s": _best(lambda: build_cpu_snapshot(trace["traceEvents"])),
        "iso_summary_s": _best(lambda: summarize(trace, snapshot)),
        # the verdicts alone (they are part of the summary above): every rule over the same trace
        "iso_verdicts_s": _best(lambda: find_verdicts(data, summary, snapshot)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args(argv)
    quiet()
    plan = [(10_000, 1)] if args.quick else [(10_000, 3), (100_000, 3)]
    root = tempfile.mkdtemp(prefix="vt-bench-summary-")
    rows = []
    try:
        for target, rounds in plan:
            calls = max(1, target // ACTIVE - instrument.OVERHEAD_EVENTS_PER_STEP)
            raw: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
            for r in range(rounds):
                for summary in (True, False) if r % 2 == 0 else (False, True):
                    d = tempfile.mkdtemp(dir=root)
                    raw[summary].append(one_window(summary, calls, d))
                    shutil.rmtree(d, ignore_errors=True)
                    gc.collect()
            rows.append((target, raw))
            print(f"  {target:.0e} events: done", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    block = render(rows, args.quick)
    print(block)
    if not args.no_write:
        write_block(Path(args.doc), START, END, block)
        print(f"wrote {args.doc}")
    return 0


def _ms(values: list[float]) -> str:
    values = sorted(values)
    return f"{statistics.median(values) * 1000:.0f} ({values[0] * 1000:.0f}–{values[-1] * 1000:.0f})"


def render(rows: list[tuple[int, dict[bool, list[dict[str, Any]]]]], quick: bool) -> str:
    lines = [
        START,
        "## The per-window summary's cost",
        "",
        f"`python benchmarks/summary_cost.py{' --quick' if quick else ''}` — {ACTIVE} active steps of "
        "`PyHeavyModel`, `summary=True` vs `summary=False` interleaved; ms, median (min–max) over "
        f"{len(next(iter(rows))[1][True]) if rows else 0} round(s). Nothing of it runs on the training thread.",
        "",
        f"Machine load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
        "| Python events / window | summary | writer job | of which summary | time to trace | time to all files |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for _target, raw in rows:
        for summary in (False, True):
            runs = raw[summary]
            events = int(statistics.median(r["python_events"] for r in runs))
            lines.append(
                f"| {events:,} | {'on' if summary else 'off'} | {_ms([r['writer_job_s'] for r in runs])} | "
                f"{_ms([r['summary_s'] for r in runs]) if summary else '–'} | "
                f"{_ms([r['time_to_trace_s'] for r in runs])} | {_ms([r['time_to_files_s'] for r in runs])} |"
            )
    lines += [
        "",
        "The same windows' merged traces, in one process, best of 5 (ms): the summary against the",
        "writer's other steps on the same trace, which the end-to-end times above drown in noise on a",
        "loaded machine.",
        "",
        "| Python events / window | read JSON | encode + gzip | CPU memory snapshot | summary | of which verdicts |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for _target, raw in rows:
        runs = raw[True]
        events = int(statistics.median(r["python_events"] for r in runs))
        cells = [
            _ms([r[k] for r in runs]).split(" ")[0]
            for k in ("iso_loads_s", "iso_encode_gzip_s", "iso_cpu_snapshot_s", "iso_summary_s", "iso_verdicts_s")
        ]
        lines.append(f"| {events:,} | " + " | ".join(cells) + " |")
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
