"""The job file: rank 0's writer waits (bounded) for every rank's trace of a window, then merges them
(``analysis/job_merge.py``) with the straggler named (``analysis/straggler.py``); no job file
without every rank. Its own directory and names ending in neither ``.pt.trace.json(.gz)`` nor
``.summary.jsonc`` keep TensorBoard's profiler plugin, HTA and ``vt-lightning summary`` from taking
it for one more rank. Ranks on other hosts that never show up keep the clock exchange
(``clock_name``) for ``vt-lightning job`` (``build_job``). Layout and waits: docs/distributed.md."""

from __future__ import annotations

import gzip
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import orjson

from vt_lightning.analysis.job_merge import (
    JOB_BUDGET_BYTES,
    aligned_events,
    merge_job,
    ranks_to_reduce,
    slowest_and_fastest,
)
from vt_lightning.analysis.offsets import CollectiveCheck, collective_residuals, rank_offsets
from vt_lightning.analysis.schema import JobInfo
from vt_lightning.analysis.straggler import analyze_straggler, choose_family, is_collective, slow_ops, steps_of
from vt_lightning.analysis.summary import top_ops
from vt_lightning.constants import TRACE_METADATA_KEY, TRACE_SUFFIX
from vt_lightning.export.atomic import atomic_write, gzip_bytes
from vt_lightning.export.job import Location, WindowJob
from vt_lightning.export.reading import is_regular_file

JOB_EXTRA = "clock_sync"  # the side recorder's key in WindowJob.extras (recording/clock_sync.py)
JOB_DIR = "job"
JOB_SUFFIX = ".json.gz"
JOB_SUMMARY_SUFFIX = ".ranks.json"
CLOCK_SUFFIX = ".clock.json"  # the clock exchange, kept where no job file could be written (``build_job``)
MAX_JOB_WAIT_S = 30.0
WAIT_AFTER_TIMEOUT_S = 2.0  # once a rank's file did not come in time, later windows wait only this long
POLL_S = 0.1
_UNSHARED: set[str] = set()  # run roots whose other hosts' files never arrived (said once, no more waits)
_TIMED_OUT: set[str] = set()  # run roots where a rank's file did not come within the wait


def job_names(span: str) -> tuple[str, str]:
    """(job file, job summary) names inside ``<window dir>/job/``."""
    return f"job.{span}{JOB_SUFFIX}", f"job.{span}{JOB_SUMMARY_SUFFIX}"


def clock_name(span: str) -> str:
    """The clock exchange's file in ``<window dir>/job/``, written where the log dir is not shared."""
    return f"job.{span}{CLOCK_SUFFIX}"


def root_unshared(run_dir: Path) -> bool:
    """Whether ranks on other hosts never wrote into this run's root (said once, not waited for again)."""
    return str(run_dir.parent) in _UNSHARED


def span_of(trace_name: str) -> str:
    """The window's span in a rank's trace name (``<host>_<rank>.<span>.pt.trace.json.gz``)."""
    return trace_name[: -len(TRACE_SUFFIX)].rsplit(".", 1)[-1]


def job_file_of(trace: Location) -> Location | None:
    """The job file of the window a rank's trace belongs to (a local path or a URL), if one was written."""
    if not trace.name.endswith(TRACE_SUFFIX):
        return None
    path = trace.parent / JOB_DIR / job_names(span_of(trace.name))[0]
    return path if is_regular_file(path) else None


def rank_of(name: str, span: str, world_size: int) -> int | None:
    """The rank whose trace of window ``span`` is named ``name`` (``<host>_<rank>.<span>…``), or None."""
    suffix = f".{span}{TRACE_SUFFIX}"
    rank = name[: -len(suffix)].rsplit("_", 1)[-1] if name.endswith(suffix) else ""
    return int(rank) if rank.isdigit() and int(rank) < world_size else None


def wait_for_ranks(
    list_names: Callable[[], Iterable[str]], span: str, world_size: int, timeout_s: float
) -> dict[int, str]:
    """The ranks' trace names of one window among ``list_names()``, polled for until every other rank's is
    there (rank 0's is in memory) or ``timeout_s`` has passed."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        found = {rank: name for name in list_names() if (rank := rank_of(name, span, world_size)) is not None}
        if set(range(1, world_size)) <= set(found) or time.monotonic() >= deadline:
            return found
        time.sleep(POLL_S)


def _read(path: Path) -> tuple[dict[str, Any], int]:
    """(the trace, its JSON size in bytes)."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return orjson.loads(data), len(data)


def write_job_file(
    job: WindowJob, run_dir: Path, merged: dict[str, Any], json_bytes: int
) -> tuple[dict[str, Any] | None, list[str]]:
    """Rank 0's part: (the job block, notes); a fault is the writer's note, the window's files are written."""
    sync = dict(job.extras.get(JOB_EXTRA) or {})
    if job.publish_to is not None:  # made from the store's files before publishing (controller/remote.py)
        return None, []
    meta = merged.get(TRACE_METADATA_KEY) or {}
    world = int(sync.get("world_size") or meta.get("world_size") or 1)
    span = str(meta.get("span") or span_of(job.trace_name))
    files, missing_note = _rank_traces(sync, run_dir, span, world)
    if missing_note is not None:
        if root_unshared(run_dir):  # what `vt-lightning job` needs to build it from the nodes' directories
            (run_dir / JOB_DIR).mkdir(exist_ok=True)
            atomic_write(run_dir / JOB_DIR / clock_name(span), orjson.dumps(sync))
        return None, [missing_note]
    return merge_ranks(sync, run_dir, span, merged, json_bytes, files, job.trace_name, job.gzip_level)


def read_clock(path: Path) -> tuple[dict[str, Any], str]:
    """(the clock exchange, the window's span) kept in ``<window dir>/job/<clock_name>``."""
    return orjson.loads(path.read_bytes()), path.name[len("job.") : -len(CLOCK_SUFFIX)]


def build_job(
    sync: dict[str, Any], span: str, window_dirs: list[Path], run_dir: Path, gzip_level: int = 3
) -> tuple[dict[str, Any] | None, list[str]]:
    """The job file from every rank's trace in ``window_dirs`` (nodes' directories or one staging one)."""
    world = int(sync.get("world_size") or 1)
    files = {
        rank: path
        for directory in window_dirs
        for path in directory.glob(f"*.{span}{TRACE_SUFFIX}")
        if (rank := rank_of(path.name, span, world)) is not None
    }
    missing = sorted(set(range(world)) - set(files))
    if missing:
        return None, [f"no job file for {run_dir}: no trace of rank(s) {missing} in {', '.join(map(str, window_dirs))}"]
    merged, json_bytes = _read(files[0])
    return merge_ranks(sync, run_dir, span, merged, json_bytes, files, files[0].name, gzip_level)


def merge_ranks(
    sync: dict[str, Any],
    run_dir: Path,
    span: str,
    merged: dict[str, Any],
    json_bytes: int,
    files: dict[int, Path],
    trace_name: str,
    gzip_level: int,
) -> tuple[dict[str, Any], list[str]]:
    """Every rank's trace (rank 0's is ``merged``) on one timeline, written into ``run_dir/job``."""
    meta = merged.get(TRACE_METADATA_KEY) or {}
    world = int(sync.get("world_size") or meta.get("world_size") or 1)
    traces: dict[int, dict[str, Any]] = {0: merged}
    sizes = {0: json_bytes}
    for rank in range(1, world):
        traces[rank], sizes[rank] = _read(files[rank])
    hosts = {r: str((t.get(TRACE_METADATA_KEY) or {}).get("host", "")) for r, t in traces.items()}
    same_host = {r: hosts[r] == hosts[0] for r in traces}
    samples = {int(k): [tuple(s) for s in v] for k, v in (sync.get("samples") or {}).items()}
    offsets, unknown = rank_offsets(samples, same_host, world)
    notes: list[str] = []
    if unknown:
        notes.append(
            f"job file: no clock offset for ranks {unknown} on other hosts "
            f"({sync.get('error') or 'no sample'}); not shifted"
        )
    offset_us = {r: (o.offset_us if (o := offsets.get(r)) else 0.0) for r in traces}
    aligned = aligned_events(traces, offset_us)
    straggler = analyze_straggler(aligned)
    straggler["slow_ops"] = slow_ops(
        {r: _op_ms_per_step(events) for r, events in aligned.items()},
        statistics.fmean([s["step_ms"] for s in straggler["steps"]] or [0.0]),
        straggler["family"],
    )
    check = _collective_check(aligned)
    bounds = [span for events in aligned.values() for span in steps_of(events)]
    steps_us = [round(min(b[0] for b in bounds), 3), round(max(b[1] for b in bounds), 3)] if bounds else None
    del aligned
    budget = int(sync.get("budget_bytes") or JOB_BUDGET_BYTES)
    reduced = ranks_to_reduce(sizes, slowest_and_fastest(straggler["wait_ms_per_step"]), budget)
    ranks_info = [
        {
            "rank": r,
            "host": hosts[r],
            "pid": (traces[r].get(TRACE_METADATA_KEY) or {}).get("pid"),
            "trace": files[r].name if r in files else trace_name,
            **(offsets[r].as_dict() if r in offsets else {"offset_us": None, "uncertainty_us": None}),
        }
        for r in sorted(traces)
    ]
    left_out = (
        [f"ranks {reduced}: only steps, collectives and their top Python functions (job over {budget} bytes of JSON)"]
        if reduced
        else []
    )
    info: dict[str, Any] = {
        "file": f"{JOB_DIR}/{job_names(span)[0]}",
        "summary": f"{JOB_DIR}/{job_names(span)[1]}",
        "world_size": world,
        "ranks": ranks_info,
        "alignment": "one host: the ranks' shared clock, no shift (offset 0, bound: the ping-pong's half round trip)"
        if all(same_host.values())
        else "NTP-style ping-pong at window start, minimum round trip; offsets subtracted",
        "clock_sync_error": sync.get("error"),
        "collective_check": check.as_dict() if check is not None else None,
        "straggler": straggler,
        "steps_us": steps_us,  # the ranks' recorded steps on the job file's timeline: where a viewer opens
        "budget_bytes": budget,
        "reduced_ranks": reduced,
        "left_out": left_out,
    }
    trace = merge_job(traces, offset_us, {**info, "span": span, "window": meta.get("window")}, reduced)
    del traces
    raw = orjson.dumps(trace)
    del trace
    info["json_bytes"] = len(raw)
    notes.extend(_write_files(run_dir, span, raw, info, gzip_level))
    if reduced:
        notes.append(f"job file over its budget ({budget} bytes of JSON): {left_out[0]}")
    return info, notes


def _rank_traces(sync: dict[str, Any], run_dir: Path, span: str, world: int) -> tuple[dict[int, Path], str | None]:
    """The other ranks' traces, waited for; with the note saying why there is no job file when one is late."""
    host_ids: dict[int, int] = {int(k): int(v) for k, v in (sync.get("host_ids") or {}).items()}
    remote_ranks = {r for r, h in host_ids.items() if h != host_ids.get(0)}
    root = str(run_dir.parent)
    wait_s = min(float(sync.get("job_wait_s", MAX_JOB_WAIT_S)), MAX_JOB_WAIT_S)
    if root in _UNSHARED and remote_ranks:
        wait_s = 0.0
    elif root in _TIMED_OUT:  # a rank that stopped writing must not cost every later window the full wait
        wait_s = min(wait_s, WAIT_AFTER_TIMEOUT_S)
    names = wait_for_ranks(lambda: (p.name for p in run_dir.glob(f"*.{span}{TRACE_SUFFIX}")), span, world, wait_s)
    files = {rank: run_dir / name for rank, name in names.items()}
    missing = sorted(set(range(1, world)) - set(files))
    if not missing:
        return files, None
    if remote_ranks & set(missing):
        _UNSHARED.add(root)
        return files, (
            "no job file: the log dir is not shared between hosts (ranks on other hosts wrote no "
            f"trace into {run_dir} within {wait_s:.0f} s; ranks {missing} missing); after training, run "
            "`vt-lightning job <this log dir> <each other node's log dir>` to build it (docs/distributed.md)"
        )
    _TIMED_OUT.add(root)
    return files, f"no job file for {run_dir.name} (rank(s) {missing} wrote no trace of it within {wait_s:.0f} s)"


def _op_ms_per_step(events: list[dict[str, Any]]) -> dict[str, float]:
    """A rank's self CPU ms per step of each op over its recorded steps (the summary's ``totals``)."""
    steps = steps_of(events)
    if not steps:
        return {}
    return dict(top_ops(events, len(steps), {}, limit=0, region=(steps[0][0], steps[-1][1]))["totals"]["ms"])


def _collective_check(aligned: dict[int, list[dict[str, Any]]]) -> CollectiveCheck | None:
    """How well the ranks' collectives line up after the shift; None without a known collective."""
    family = choose_family(aligned)
    if not family:
        return None
    exits = {
        r: [
            (str(e["name"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            for e in events
            if is_collective(str(e.get("name", "")), family)
        ]
        for r, events in aligned.items()
    }
    return collective_residuals(exits, {}) if exits else None


def _write_files(run_dir: Path, span: str, raw: bytes, info: dict[str, Any], gzip_level: int) -> list[str]:
    """The job file (never over one already there) and its ``.ranks.json``. Returns the notes."""
    job_name, summary_name = job_names(span)
    directory = run_dir / JOB_DIR
    directory.mkdir(exist_ok=True)
    notes: list[str] = []
    try:
        atomic_write(directory / job_name, gzip_bytes(raw, gzip_level), overwrite=False)
    except FileExistsError:
        notes.append(f"job file {job_name} already there (a retried window); kept")
    atomic_write(directory / summary_name, orjson.dumps(info, option=orjson.OPT_INDENT_2) + b"\n")
    return notes


def job_summary(info: dict[str, Any]) -> JobInfo:
    """The ``job`` block of rank 0's ``.summary.jsonc`` (``analysis/schema.JobInfo``)."""
    straggler = (info.get("straggler") or {}).get("straggler")
    check = info.get("collective_check") or {}
    block = {
        "file": info["file"],
        "world_size": info["world_size"],
        "ranks": [
            {
                "rank": r["rank"],
                "host": r["host"],
                "offset_us": r.get("offset_us"),
                "uncertainty_us": r.get("uncertainty_us"),
                "same_host": bool(r.get("same_host", True)),
            }
            for r in info["ranks"]
        ],
        "max_exit_residual_us": check.get("max_residual_us"),
        "straggler": None
        if straggler is None
        else {
            k: straggler.get(k)
            for k in (
                *("rank", "others_wait_ms", "step_ms", "share_of_step", "function", "file", "line", "excess_ms"),
                *("explains_share", "unattributed_ms"),
            )
        },
        "slow_ops": list((info.get("straggler") or {}).get("slow_ops") or []),
        "steps_us": info.get("steps_us"),
        "reduced_ranks": list(info.get("reduced_ranks") or []),
    }
    return cast(JobInfo, block)
