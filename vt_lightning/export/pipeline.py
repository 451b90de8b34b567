"""Turn one window's raw dumps into its files. Runs on the background writer, never in training.

``finish_window`` is a chain of named stages, each taking the previous one's output and nothing
else of the window (what each takes and gives: docs/architecture.md):

    read -> calibrate -> place -> merge -> enrich -> encode -> summarise -> write

The window's optional files (the memory snapshot, the summary, the job file) fail alone: each fault
becomes one note (``_optional``), the trace is written all the same. Any other fault fails the
window: its raw dumps are removed, and the writer reports the error.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import orjson

from vt_lightning.analysis.clock import Calibration, ClockPair, best_marker_pair
from vt_lightning.analysis.compile import compile_record, compile_span_events
from vt_lightning.analysis.filters import filter_python_events, keeps_whole
from vt_lightning.analysis.flight import add_flight_track
from vt_lightning.analysis.lightning_view import apply_lightning_view
from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot
from vt_lightning.analysis.merge import (
    PythonParts,
    TorchPlacement,
    encode_trace,
    merge_window,
    place_python_events,
    time_origin_us,
    torch_placement,
)
from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.steps import read_window
from vt_lightning.analysis.summary import summarize
from vt_lightning.analysis.summary_devices import memory_view
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.analysis.track_names import name_tracks
from vt_lightning.analysis.verdicts import with_job_verdicts
from vt_lightning.analysis.workers import worker_summary
from vt_lightning.constants import CLOCK_MARKER_PREFIX, CPU_OP_CATEGORY, USER_ANNOTATION_CATEGORY
from vt_lightning.export import raw_json
from vt_lightning.export.atomic import GzipAside, atomic_write, owns, remove_quietly, write_snapshot
from vt_lightning.export.job import WindowJob, WindowResult
from vt_lightning.export.job_file import JOB_EXTRA, build_job, job_summary, span_of, write_job_file
from vt_lightning.export.layout import claim_name
from vt_lightning.export.report import encode_summary, render_markdown, summary_names
from vt_lightning.export.source_lines import named_places, record_sources
from vt_lightning.export.worker_dumps import WorkerDumps, add_to_trace, collect_worker_dumps, remove_parts

T = TypeVar("T")


def finish_window(job: WindowJob) -> WindowResult:
    """Merge, encode, compress and write one window from complete raw dumps; they go if it fails, and
    stay until ``delivered`` if it succeeds, so a writer killed before answering is retried from them."""
    try:
        clocks = calibrate(job, read(job))
        merged = merge(job, place(job, clocks))
        return write(job, summarise(job, encode(job, enrich(job, merged))))
    except BaseException:  # the job's boundary: its raw dumps go, the writer reports the fault
        remove_raw(job)
        raise


@dataclass
class Read:
    """The window's raw dumps, parsed: torch's trace and VizTracer's (empty without one)."""

    torch: dict[str, Any]
    python: dict[str, Any]


def read(job: WindowJob) -> Read:
    python = _read_json(job.python_raw) if job.python_raw is not None else {"traceEvents": []}
    return Read(_read_json(job.torch_raw), python)


def _read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return raw_json.loads(f.read())  # names a tracer wrote unescaped: escaped, not refused


@dataclass
class Calibrated:
    """The dumps with their clocks tied; torch's clock markers are taken out of its trace."""

    torch: dict[str, Any]
    python_events: list[dict[str, Any]]
    calibration: Calibration
    metadata: dict[str, Any]
    origin_us: int
    to_torch: TorchPlacement


def calibrate(job: WindowJob, raw: Read) -> Calibrated:
    """Calibrate on the clock markers torch recorded, or on the wall-clock pairs where it recorded
    none; note an overflow of VizTracer's ring buffer, with the size that would have held the window."""
    torch_trace, python_events = raw.torch, raw.python.get("traceEvents", [])
    calibration = _calibration(job, torch_trace)
    metadata = dict(job.metadata)
    metadata["overflow"] = overflow = bool(raw.python.get("viztracer_metadata", {}).get("overflow", False))
    if overflow:
        metadata["overflow_suggested_tracer_entries"] = suggest_tracer_entries(
            python_events,
            job.clock_start,
            job.clock_end,
            torch_trace.get("traceEvents", []),
            calibration.python_to_torch_us,
        )
    origin_us = time_origin_us(torch_trace.get("traceEvents", []))
    to_torch = torch_placement(calibration, origin_us)
    return Calibrated(torch_trace, python_events, calibration, metadata, origin_us, to_torch)


def _calibration(job: WindowJob, torch_trace: dict[str, Any]) -> Calibration:
    base_ns = int(torch_trace.get("baseTimeNanoseconds", 0))
    events = torch_trace.get("traceEvents", [])
    spans = {
        e["name"]: (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(CLOCK_MARKER_PREFIX)
    }
    if spans:
        torch_trace["traceEvents"] = [e for e in events if not str(e.get("name", "")).startswith(CLOCK_MARKER_PREFIX)]
    start = best_marker_pair(job.clock_markers.get("start", []), spans)
    end = best_marker_pair(job.clock_markers.get("end", []), spans)
    if start is not None and end is not None:
        return Calibration(
            start=start,
            end=end,
            base_ns=base_ns,
            method="torch ranges bracketed by VizTracer clock reads (tightest of "
            f"{len(job.clock_markers['start'])}) at window start and end, linear interpolation",
            import_base_ns=job.import_base_ns,
            wall=(job.clock_start, job.clock_end),
        )
    return Calibration(start=job.clock_start, end=job.clock_end, base_ns=base_ns, import_base_ns=job.import_base_ns)


def suggest_tracer_entries(
    events: list[dict[str, Any]],
    start: ClockPair,
    end: ClockPair,
    torch_events: list[dict[str, Any]],
    to_torch_us: Callable[[float], float],
) -> int:
    """After an overflow the buffer holds the window's last entries: their count scaled to the window,
    from the earliest kept end (an entry is written when its call returns), by time or by torch's ops
    (recorded in full), the larger, with a margin."""
    ends = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in events if e.get("ph") != "M" and "ts" in e]
    if not ends:
        return 0
    window = end.python_us - start.python_us
    if window <= 0:
        return _round_up(len(ends) * 2)
    first_kept = min(ends)
    covered = max(end.python_us - first_kept, window / 1000.0)  # never scale one burst by more than 1000x
    scale = min(window / covered, 1000.0)
    if torch_events:
        since = to_torch_us(first_kept)
        op_ends = [
            float(e["ts"]) + float(e.get("dur", 0.0))
            for e in torch_events
            if e.get("ph") == "X" and e.get("cat") in (CPU_OP_CATEGORY, USER_ANNOTATION_CATEGORY) and "ts" in e
        ]
        in_tail = sum(1 for t in op_ends if t >= since)
        if in_tail:
            scale = max(scale, min(len(op_ends) / in_tail, 1000.0))
    return _round_up(len(ends) * scale * OVERFLOW_MARGIN)


OVERFLOW_MARGIN = 2.0  # measured: the tail's rate was 0.68x the window's on a small model


def _round_up(entries: float) -> int:
    return int(math.ceil(entries / 1000.0) * 1000)


@dataclass
class Placed:
    """The Python events as the merge takes them (the workers' calls already on torch's timeline)."""

    torch: dict[str, Any]
    python: PythonParts
    calibration: Calibration
    metadata: dict[str, Any]
    origin_us: int
    workers: WorkerDumps | None
    notes: list[str]


def place(job: WindowJob, clocks: Calibrated) -> Placed:
    """VizTracer's calls with the DataLoader workers' (placed as they are read when the filter runs),
    filtered, and the gc pauses and compile spans the side recorders took, on torch's timeline."""
    metadata, notes = clocks.metadata, []
    rules, to_torch = job.python_filter, clocks.to_torch
    settle = partial(keeps_whole, rules) if rules is not None else None
    workers = collect_worker_dumps(job.extras.get("workers"), to_torch if rules is not None else None, settle)
    # Copies: placing moves events, and a retry of the same job must find them as handed over.
    gc_pauses = job.extras.get("gc")  # recording/gc_watch.py, on the Python clock
    after = [dict(event) for event in gc_pauses.get("events") or ()] if isinstance(gc_pauses, dict) else []
    before: list[dict[str, Any]] = clocks.python_events
    calls: dict[Any, list[dict[str, Any]]] = {}
    on_python_clock: list[dict[str, Any]] = []  # what is placed here: all but the workers' calls
    if rules is not None:  # the workers' events follow, grouped as the filter groups them
        grouped = workers.grouped if workers is not None else None
        ordered = workers.ordered if workers is not None else None
        before, calls, filter_stats = filter_python_events(before, rules, grouped, ordered)
        from_workers = grouped[0].keys() if grouped is not None else ()
        on_python_clock = before + [call for key, found in calls.items() if key not in from_workers for call in found]
        metadata["python_filter"] = filter_stats.as_dict()
        if rules.user_filters and filter_stats.kept == 0 and filter_stats.filtered:
            notes.append(
                f"include_files / exclude_files / max_stack_depth kept none of the "
                f"{filter_stats.filtered} Python calls recorded; check the paths"
            )
    else:
        before = on_python_clock = [*before, *workers.events] if workers is not None else before
    compile_info = job.extras.get("compile")
    if isinstance(compile_info, dict):  # recording/compile_watch.py: a span per compile, Python clock
        after += compile_span_events(
            compile_info, [*before, *(call for found in calls.values() for call in found), *after]
        )
        metadata["compile"] = compile_record(compile_info)
    place_python_events([*on_python_clock, *after], to_torch)
    parts = PythonParts(before, calls, after)
    if workers is not None:
        parts.settled, parts.names = workers.settled, workers.ordered
    return Placed(clocks.torch, parts, clocks.calibration, metadata, clocks.origin_us, workers, notes)


@dataclass
class Merged:
    """The window's typed trace, and what the later stages add to it from."""

    trace: WindowTrace
    calibration: Calibration
    workers: WorkerDumps | None
    notes: list[str]


def merge(job: WindowJob, placed: Placed) -> Merged:
    trace = merge_window(
        placed.torch,
        placed.python,
        placed.calibration,
        placed.metadata,
        thread_names=job.thread_names,
        origin_us=placed.origin_us,
    )
    return Merged(trace, placed.calibration, placed.workers, placed.notes)


def enrich(job: WindowJob, merged: Merged) -> Merged:
    """The flight track, the workers' processes and fetches, the tracks' names and the Lightning view."""
    trace, notes = merged.trace, list(merged.notes)
    add_flight_track(trace, job.extras.get("flight"), merged.calibration)  # the slow step, sampled
    if merged.workers is not None:
        notes.extend(add_to_trace(trace, merged.workers, merged.calibration.python_to_torch_us))
    name_tracks(trace, int(trace.meta.get("global_rank") or 0))  # by rank and role, the main thread first
    if trace.meta.get("lightning_view"):
        view = apply_lightning_view(trace)
        if not view.get("framework"):
            notes.append("no [pl][module] ranges were recorded (compiled model?), so no Lightning view")
        if view.get("demoted"):
            notes.append(f"{view['demoted']} module ranges the plugin would reject were left out of the Lightning view")
    return Merged(trace, merged.calibration, merged.workers, notes)


@dataclass
class Encoded:
    """The trace, its JSON, and that JSON compressing meanwhile on a thread of its own."""

    trace: WindowTrace
    raw: bytes
    compressing: GzipAside
    notes: list[str]


def encode(job: WindowJob, enriched: Merged) -> Encoded:
    raw = encode_trace(enriched.trace.as_dict())
    return Encoded(enriched.trace, raw, GzipAside(raw, job.gzip_level), enriched.notes)


@dataclass
class Summarised:
    """What is written; a snapshot or summary that is None has none, or a note says why."""

    encoded: Encoded
    snapshot: Any
    summary: Summary | None
    memory_view: dict[str, Any] | None  # the side file of summary_devices.memory_view
    summary_seconds: float
    notes: list[str]


def summarise(job: WindowJob, encoded: Encoded) -> Summarised:
    """The memory snapshot (the job's own, or built from ``[memory]`` events) and the summary."""
    trace, notes = encoded.trace, list(encoded.notes)
    snapshot = job.memory_snapshot
    if job.memory_name is not None and snapshot is None:
        snapshot = _optional("memory snapshot", notes, lambda: build_cpu_snapshot(trace))
    start = time.perf_counter()
    made = _optional("summary", notes, lambda: _summary(job, trace, snapshot)) if job.summary else None
    summary, view = made or (None, None)
    return Summarised(encoded, snapshot, summary, view, time.perf_counter() - start, notes)


def _summary(job: WindowJob, trace: WindowTrace, snapshot: Any) -> tuple[Summary, dict[str, Any] | None]:
    window = read_window(trace)  # read once: the workers' tables share its per-thread nesting
    summary = summarize(trace, snapshot, window)
    summary["window"]["trace"] = job.trace_name
    workers = worker_summary(window)
    if workers is not None:
        summary["workers"] = workers
    return summary, memory_view(window.memory, summary["steps"]["bounds_us"], summary["memory"])


def _optional(what: str, notes: list[str], make: Callable[[], T]) -> T | None:
    """``make()``, or None and one note where it fails: an optional file never costs the trace."""
    try:
        return make()
    except Exception as err:  # the boundary of the window's optional files: the trace is written all the same
        notes.append(f"{what} not written ({type(err).__name__}: {err})")
        return None


def write(job: WindowJob, summarised: Summarised) -> WindowResult:
    """The trace, then the memory snapshot, the job file and the summary beside it, each atomically."""
    encoded, notes = summarised.encoded, list(summarised.notes)
    meta = encoded.trace.meta
    compressed = encoded.compressing.result()
    claim = claim_name(job.trace_name, job.job_id) if job.job_id else None
    trace_path = write_new(job.run_dir, job.trace_name, compressed, claim=claim)
    run_dir = trace_path.parent
    if run_dir != job.run_dir:
        notes.append(
            f"run directory already taken ({job.run_dir} holds another run's {job.trace_name} "
            f"or is not a plain directory); this window went to {run_dir.name}"
        )
    memory_path = None
    if summarised.snapshot is not None and job.memory_name is not None:
        memory_path = _optional(
            "memory snapshot", notes, partial(_write_memory, run_dir / job.memory_name, summarised.snapshot)
        )
    job_info = None
    if JOB_EXTRA in job.extras:  # rank 0 of a job whose ranks all trace: the job file (export/job_file.py)
        write_job = partial(write_job_file, job, run_dir, encoded.trace.as_dict(), len(encoded.raw))
        job_info, job_notes = _optional("job file", notes, write_job) or (None, [])
        notes.extend(job_notes)
    summary_path = markdown = None
    start = time.perf_counter()
    if summarised.summary is not None:
        write_summary = partial(_write_summary, job, run_dir, summarised.summary, job_info, summarised.memory_view)
        summary_path, markdown = _optional("summary", notes, write_summary) or (None, None)
    seconds = summarised.summary_seconds + time.perf_counter() - start
    return WindowResult(
        trace_path=trace_path,
        trace_bytes=len(compressed),
        json_bytes=len(encoded.raw),
        python_events=meta["python_events"],
        torch_events=meta["torch_events"],
        overflow=bool(meta.get("overflow")),
        suggested_tracer_entries=meta.get("overflow_suggested_tracer_entries"),
        memory_path=memory_path,
        memory_bytes=memory_path.stat().st_size if memory_path is not None else 0,
        notes=tuple(notes),
        summary=summarised.summary if summary_path is not None else None,
        summary_path=summary_path,
        summary_markdown=markdown,
        summary_seconds=seconds,
        job=job_info,
    )


def add_job(
    job: WindowJob, staged: Path, fetched: Path, summary: Summary | None
) -> tuple[dict[str, Any] | None, list[str], Summary | None, str | None]:
    """Rank 0 of a remote root, in the writer process, before its window is published: the job file from
    the staged and fetched traces, and the staged summary rewritten with the job's block and verdicts."""
    info, notes = build_job(job.extras[JOB_EXTRA], span_of(job.trace_name), [staged, fetched], staged, job.gzip_level)
    markdown = None
    if info is not None and summary is not None:
        markdown = _optional("summary", notes, partial(_write_summary, job, staged, summary, info, None))
    return info, notes, summary, markdown[1] if markdown else None


def _write_memory(path: Path, snapshot: Any) -> Path:
    write_snapshot(path, snapshot)
    return path


def _write_summary(
    job: WindowJob, run_dir: Path, summary: Summary, job_info: dict[str, Any] | None, view: dict[str, Any] | None
) -> tuple[Path, str]:
    """The summary's ``.jsonc`` and ``.md`` beside the trace (and the memory view): (its path, markdown)."""
    json_name, md_name, view_name = summary_names(job.trace_name)
    if view is not None and summary["memory"] is not None:
        atomic_write(run_dir / view_name, orjson.dumps(view))
        summary["memory"]["view"] = view_name
    if job_info is not None:
        summary["job"] = job_summary(job_info)
        summary["verdicts"] = with_job_verdicts(summary)  # straggler: only rank 0 merged the job file
    summary["sources"] = record_sources(named_places(summary))
    atomic_write(run_dir / json_name, encode_summary(summary))
    markdown = render_markdown(summary)
    atomic_write(run_dir / md_name, markdown.encode())
    return run_dir / json_name, markdown


def remove_raw(job: WindowJob) -> None:
    for raw_path in (job.torch_raw, job.python_raw):
        if raw_path is not None:
            remove_quietly(raw_path)
    remove_parts(job.extras.get("workers"))


MAX_CLASHES = 1000


def run_dir_candidates(run_dir: Any) -> Any:
    """``run_dir``, then ``run_dir.2``, ``run_dir.3``, ...: where a window goes if the first is taken."""
    yield run_dir
    for n in range(2, MAX_CLASHES):
        yield run_dir.with_name(f"{run_dir.name}.{n}")


def usable_run_dir(path: Path) -> bool:
    """Create ``path`` or accept it if it is a real directory; a symlink (or a file) is never used."""
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        pass
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return usable_run_dir(path)
    return stat.S_ISDIR(mode) and not stat.S_ISLNK(mode)


def write_new(run_dir: Path, name: str, data: bytes, claim: str | None = None) -> Path:
    """Write ``data`` as ``name`` in the first candidate directory holding no such file (another run's
    files are kept); with ``claim``, one where this same window already published ``name`` is the answer."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    for candidate in run_dir_candidates(run_dir):
        if not usable_run_dir(candidate):
            continue
        if claim is not None and owns(candidate / name, candidate / claim):
            return candidate / name  # complete (published atomically) and made from the same job
        try:
            atomic_write(candidate / name, data, overwrite=False, claim=claim)
        except FileExistsError:
            continue
        return candidate / name
    raise FileExistsError(f"{MAX_CLASHES} run directories named {run_dir.name}[.N] are taken")


def delivered(job: WindowJob, result: WindowResult) -> None:
    """The result reached the training process, so nothing retries it: drop its raw dumps and claim."""
    remove_raw(job)
    if job.job_id and isinstance(result.trace_path, Path):
        remove_quietly(result.trace_path.parent / claim_name(job.trace_name, job.job_id))
