"""Turn one window's raw dumps into its files. Runs on the background writer, never in training.

Input is a ``WindowJob``: paths of torch's and VizTracer's raw JSON in the spool directory, the
clock pairs read at the window's edges and the metadata. Output is the merged, gzipped trace (and,
when asked, the memory snapshot) in the window's run directory, each written atomically.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import stat
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from vt_lightning.analysis.clock import Calibration, ClockPair, best_marker_pair
from vt_lightning.analysis.compile import compile_record, compile_span_events
from vt_lightning.analysis.filters import filter_python_events, keeps_whole
from vt_lightning.analysis.flight import add_flight_track
from vt_lightning.analysis.merge import (
    TorchPlacement,
    encode_trace,
    merge_window,
    ran_steps,
    time_origin_us,
    torch_placement,
)
from vt_lightning.analysis.steps import Call, Thread, read_window
from vt_lightning.analysis.summary import summarize
from vt_lightning.analysis.verdicts import with_job_verdicts
from vt_lightning.constants import (
    CLOCK_MARKER_PREFIX,
    CPU_OP_CATEGORY,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)
from vt_lightning.export import raw_json
from vt_lightning.export.atomic import GzipAside, atomic_write, owns, release_claim
from vt_lightning.export.job import WindowJob, WindowResult
from vt_lightning.export.job_file import JOB_EXTRA, job_summary, write_job_file
from vt_lightning.export.layout import claim_name
from vt_lightning.export.report import encode_summary, render_markdown, summary_names
from vt_lightning.export.worker_dumps import (
    WorkerDumps,
    add_to_trace,
    collect_worker_dumps,
    remove_parts,
    summarize_workers,
)


def _read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return raw_json.loads(f.read())  # names a tracer wrote unescaped: escaped, not refused


def calibrate(job: WindowJob, torch_trace: dict[str, Any]) -> Calibration:
    """Calibrate on the clock markers torch recorded (removing them from its events); fall back to
    the wall-clock pairs when torch recorded none."""
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
    torch_events: list[dict[str, Any]] | None = None,
    to_torch_us: Callable[[float], float] | None = None,
) -> int:
    """After an overflow the ring buffer holds the window's last entries: scale their count to the
    whole window, from the span they were actually *written* in.

    VizTracer writes an entry when a call returns, so the kept entries were written between the
    earliest kept end time and the window's end. Their start times say nothing about that span: an
    outer call that began at the window's start is among the last to return, and measuring from its
    start made the rate look tiny (advice 16x too low). Two scalings, the larger wins: by time, and
    by torch's ops (recorded in full for the whole window) — Python calls follow the ops more
    closely than the clock when a step's phases differ. A margin covers the rest.
    """
    ends = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in events if e.get("ph") != "M" and "ts" in e]
    if not ends:
        return 0
    window = end.python_us - start.python_us
    if window <= 0:
        return _round_up(len(ends) * 2)
    first_kept = min(ends)
    covered = max(end.python_us - first_kept, window / 1000.0)  # never scale one burst by more than 1000x
    scale = min(window / covered, 1000.0)
    if torch_events and to_torch_us is not None:
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


def remove_raw(job: WindowJob) -> None:
    for raw_path in (job.torch_raw, job.python_raw):
        if raw_path is not None:
            try:
                os.unlink(raw_path)
            except OSError:
                pass
    remove_parts(job.extras.get("workers"))


def finish_window(job: WindowJob) -> WindowResult:
    """Merge, encode, compress and write one window. The raw dumps are removed if it fails, and
    kept when it succeeds: the training process removes them once the result has reached it
    (``delivered``), so a writer killed after writing, before answering, is retried from them.

    The raw dumps must be complete (torch's export done, VizTracer's dump child reaped): the
    training process's writer thread sees to that before the job reaches here."""
    try:
        torch_trace = _read_json(job.torch_raw)
        python = _read_json(job.python_raw) if job.python_raw is not None else {"traceEvents": []}
        overflow = bool(python.get("viztracer_metadata", {}).get("overflow", False))
        calibration = calibrate(job, torch_trace)
        metadata = dict(job.metadata)
        metadata["overflow"] = overflow
        suggested = None
        if overflow:
            suggested = suggest_tracer_entries(
                python.get("traceEvents", []),
                job.clock_start,
                job.clock_end,
                torch_events=torch_trace.get("traceEvents", []),
                to_torch_us=calibration.python_to_torch_us,
            )
            metadata["overflow_suggested_tracer_entries"] = suggested
        notes: list[str] = []
        origin_us = time_origin_us(torch_trace.get("traceEvents", []))
        to_torch = torch_placement(calibration, origin_us, ran_steps(metadata.get("steps")))
        python_events, workers, apart, placed = _python_events(job, python, metadata, notes, to_torch)
        run_calls: dict[Thread, list[Call]] = {}  # the workers' calls as the summary reads them
        merged, run = merge_window(
            torch_trace,
            python_events,
            calibration,
            metadata,
            thread_names=job.thread_names,
            apart=apart,
            origin_us=origin_us,
            placed=placed,
            bounds=run_calls,
        )
        del torch_trace, python, python_events
        workers_run = WorkersRun(merged, run, workers, run_calls)
        add_flight_track(merged, job.extras.get("flight"), calibration)  # the slow step, sampled
        if workers is not None:
            notes.extend(
                add_to_trace(
                    merged, workers, calibration.python_to_torch_us, workers_run.range(), workers_run.earliest_start()
                )
            )
        if metadata.get("lightning_view"):
            notes.extend(_apply_lightning_view(merged, workers_run.main_events()))
        raw = encode_trace(merged)
        compressing = GzipAside(raw, job.gzip_level)  # meanwhile, the snapshot and the summary are made
        snapshot = None
        if job.memory_name is not None:
            try:
                snapshot = _memory_snapshot(job, workers_run)
            except Exception as err:  # the trace is written; a snapshot problem must not undo it
                notes.append(f"memory snapshot not written ({type(err).__name__}: {err})")
        made = _make_summary(job, merged, snapshot, workers_run) if job.summary else None
        compressed = compressing.result()
        claim = claim_name(job.trace_name, job.job_id) if job.job_id else None
        trace_path = write_new(job.run_dir, job.trace_name, compressed, claim=claim)
        run_dir = trace_path.parent
        if run_dir != job.run_dir:
            notes.append(
                f"run directory already taken ({job.run_dir} holds another run's {job.trace_name} "
                f"or is not a plain directory); this window went to {run_dir.name}"
            )
        memory_path = None
        if snapshot is not None:
            try:
                memory_path = _write_memory(job, run_dir, snapshot)
            except Exception as err:
                notes.append(f"memory snapshot not written ({type(err).__name__}: {err})")
        result = WindowResult(
            trace_path=trace_path,
            trace_bytes=len(compressed),
            json_bytes=len(raw),
            python_events=merged["vt_lightning"]["python_events"],
            torch_events=merged["vt_lightning"]["torch_events"],
            overflow=overflow,
            suggested_tracer_entries=suggested,
            memory_path=memory_path,
            memory_bytes=memory_path.stat().st_size if memory_path is not None else 0,
            notes=tuple(notes),
        )
        if JOB_EXTRA in job.extras:  # rank 0 of a job whose ranks all trace: the job file (export/job_file.py)
            job_info, job_notes = write_job_file(job, run_dir, merged, len(raw))
            result = dataclasses.replace(result, job=job_info, notes=(*result.notes, *job_notes))
        if made is not None:
            result = _write_summary(job, run_dir, made, result)
        return result
    except BaseException:
        remove_raw(job)
        raise


class WorkersRun:
    """Where the DataLoader workers' events lie in a merged trace's ``traceEvents``: one run, most
    of a window's events, that the passes reading only the training process's events (the
    workers' placement, the Lightning view, the memory snapshot) skip without walking it. Events
    are only appended after the merge, so the run stays where the merge put it; its two ends are
    checked by identity before each use, and the whole list is read should they have moved.
    ``calls``: the run's calls as the summary reads them, made by the merge (its ``bounds``)."""

    def __init__(
        self,
        merged: dict[str, Any],
        run: range,
        workers: WorkerDumps | None,
        calls: dict[Thread, list[Call]] | None = None,
    ) -> None:
        self.merged = merged
        self.events: list[dict[str, Any]] = merged["traceEvents"]
        self.run = run
        self.pids = {int(worker["pid"]) for worker in workers.workers} if workers is not None else set()
        self.ends = (self.events[run.start], self.events[run.stop - 1]) if len(run) else None
        self.calls = calls
        self.origin = self._origin()

    def _origin(self) -> Any:
        return (self.merged.get(TRACE_METADATA_KEY) or {}).get("time_origin_us")

    def range(self) -> range:
        """The run, or an empty range when there is none (or it is not where it was)."""
        events, run, ends = self.events, self.run, self.ends
        if ends is None or run.stop > len(events) or events[run.start] is not ends[0]:
            return range(0)
        return run if events[run.stop - 1] is ends[1] else range(0)

    def main_events(self) -> list[dict[str, Any]]:
        """The events outside the run, in their order (all of them when there is no run)."""
        run = self.range()
        return self.events[: run.start] + self.events[run.stop :] if len(run) else self.events

    def earliest_start(self) -> float | None:
        """The run's earliest ``ts``, read from ``calls`` while they hold the whole run (each
        thread's first call starts first: they are outer-first); None where they do not."""
        calls = self.summary_calls()
        if calls is None or not all(calls.values()) or sum(map(len, calls.values())) != len(self.range()):
            return None
        return min(found[0][0] for found in calls.values())

    def summary_calls(self) -> dict[Thread, list[Call]] | None:
        """``calls`` while they still describe the run: None once the run moved or the trace's
        origin was lowered (``worker_dumps.add_to_trace`` then moved every ``ts``)."""
        if not self.calls or not len(self.range()) or self._origin() != self.origin:
            return None
        return self.calls


def _worker_calls_start(events: list[dict[str, Any]], pids: set[int]) -> int:
    """Where the workers' calls begin in ``filter_python_events``' output: it puts each thread's
    kept calls after every other event, the training process's threads first, so "a worker's
    call" is false up to one index and true from there on, found by bisection."""
    return bisect.bisect_left(
        events, True, key=lambda e: e.get("pid") in pids and e.get("ph") in ("X", "B") and "ts" in e
    )


def _python_events(
    job: WindowJob, python: dict[str, Any], metadata: dict[str, Any], notes: list[str], to_torch: TorchPlacement
) -> tuple[
    list[dict[str, Any]],
    WorkerDumps | None,
    range | None,
    tuple[TorchPlacement, dict[Any, list[dict[str, Any]]]] | None,
]:
    """The window's Python-clock events, before the merge: VizTracer's calls with the DataLoader
    workers' parts (``worker_dumps.py``), filtered, then the gc pauses and compile spans the side
    recorders took. Returns them with the workers' parts (or None), where the workers' run lies
    among them (or None) and, when the workers' calls were placed on torch's timeline as they
    were read (``to_torch``: the filter runs, so they come as one run), ``to_torch`` with those
    calls per thread for ``merge_window``'s ``placed``; ``metadata`` and ``notes`` get what the
    filter and the compile watch report."""
    raw_events: list[dict[str, Any]] = python.get("traceEvents", [])
    python_events = raw_events  # a new list from here on but without a filter or workers
    filtering = job.python_filter is not None
    settle = partial(keeps_whole, job.python_filter) if job.python_filter is not None else None
    workers = collect_worker_dumps(job.extras.get("workers"), to_torch if filtering else None, settle)
    apart = placed = None
    if job.python_filter is not None:  # the workers' events follow, grouped as the filter groups
        grouped = workers.grouped if workers is not None else None
        kept_groups: dict[Any, list[dict[str, Any]]] = {}
        python_events, filter_stats = filter_python_events(
            python_events, job.python_filter, grouped, kept_groups, workers.ordered if workers is not None else None
        )
        if workers is not None:
            pids = {int(worker["pid"]) for worker in workers.workers}
            apart = range(_worker_calls_start(python_events, pids), len(python_events))
            placed = (to_torch, kept_groups) if len(apart) else None
        metadata["python_filter"] = filter_stats.as_dict()
        if job.python_filter.user_filters and filter_stats.kept == 0 and filter_stats.filtered:
            notes.append(
                f"include_files / exclude_files / max_stack_depth kept none of the "
                f"{filter_stats.filtered} Python calls recorded; check the paths"
            )
    elif workers is not None:
        if all(event.get("ph") == "M" for event in workers.grouped[1]):  # else calls and others mix
            apart = range(len(python_events), len(python_events) + len(workers.events))
        python_events = [*python_events, *workers.events]
    gc_pauses = job.extras.get("gc")
    if isinstance(gc_pauses, dict) and gc_pauses.get("events"):  # recording/gc_watch.py, on the Python clock
        # Copies: merging moves events in place, and the job stays as handed over (a retry of
        # the same job on the writer thread would otherwise shift these a second time).
        python_events = python_events if python_events is not raw_events else list(python_events)
        python_events.extend(dict(event) for event in gc_pauses["events"])
    compile_info = job.extras.get("compile")
    if isinstance(compile_info, dict):  # recording/compile_watch.py: a span per compile, Python clock
        spans = compile_span_events(compile_info, python_events)
        python_events = python_events if python_events is not raw_events else list(python_events)
        python_events.extend(spans)  # not a copy of the window's events with them: it touches each
        metadata["compile"] = compile_record(compile_info)
    return python_events, workers, apart, placed


MAX_CLASHES = 1000


def run_dir_candidates(run_dir: Any) -> Any:
    """``run_dir``, then ``run_dir.2``, ``run_dir.3``, ...: where a window may go if the first is
    taken (a ``Path``, or a remote run directory's ``URL``)."""
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
    """Write ``data`` as ``name`` in the first candidate run directory that is a real directory and
    holds no file of that name: another run sharing the directory (or a resumed run) keeps its files.
    Ranks of one run share a run directory: their file names differ.

    With ``claim`` (``layout.claim_name``), a candidate whose ``name`` this same window already
    published (its writer was killed before answering, and this is the retry) is the answer: no
    second directory, and no word about another run."""
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


def _apply_lightning_view(merged: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """The Lightning view of ``merged``, read from ``events`` (the training process's)."""
    from vt_lightning.analysis.lightning_view import apply_lightning_view

    summary = apply_lightning_view(merged, events)
    notes = []
    if not summary.get("framework"):
        notes.append("no [pl][module] ranges were recorded (compiled model?), so no Lightning view")
    if summary.get("demoted"):
        notes.append(f"{summary['demoted']} module ranges the plugin would reject were left out of the Lightning view")
    return notes


def _memory_snapshot(job: WindowJob, workers_run: WorkersRun) -> Any:
    """The memory snapshot, built from the training process's events (the workers' calls are no
    ``[memory]`` event, and enclose none but their own threads') unless the job brought one; None
    where the window holds no memory event."""
    from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot

    if job.memory_snapshot is not None:
        return job.memory_snapshot
    run = workers_run.range()
    return build_cpu_snapshot(
        workers_run.main_events(), everything=workers_run.events, apart_pids=workers_run.pids if len(run) else set()
    )


def _write_memory(job: WindowJob, run_dir: Path, snapshot: Any) -> Path:
    from vt_lightning.export.memory_files import write_snapshot

    path = run_dir / str(job.memory_name)
    write_snapshot(path, snapshot)
    return path


@dataclasses.dataclass(frozen=True)
class _Summary:
    """A window's summary as ``_make_summary`` left it: the summary, or the note that says why
    there is none, and the seconds it took."""

    summary: Any
    failure: str | None
    seconds: float


def _make_summary(
    job: WindowJob, merged: dict[str, Any], snapshot: Any, workers_run: WorkersRun | None = None
) -> _Summary:
    """The window's summary, its workers' tables included; a failure is a note, never a lost
    window. ``workers_run``: the workers' calls, which the summary then takes as the merge read
    them rather than walking them again."""
    start = time.perf_counter()
    try:
        run = workers_run.range() if workers_run is not None else range(0)
        run_calls = workers_run.summary_calls() if workers_run is not None else None
        # read once: the workers' tables share its per-thread nesting
        window = read_window(merged, run, run_calls)
        summary = summarize(merged, snapshot, window)
        summary["window"]["trace"] = job.trace_name
        workers = summarize_workers(merged, window)
        if workers is not None:
            summary["workers"] = workers
    except Exception as err:
        return _Summary(None, f"summary not written ({type(err).__name__}: {err})", time.perf_counter() - start)
    return _Summary(summary, None, time.perf_counter() - start)


def _write_summary(job: WindowJob, run_dir: Path, made: _Summary, result: WindowResult) -> WindowResult:
    """``<worker>.<span>.summary.json`` and ``.md`` beside the trace, the job's verdicts added
    where this rank wrote the job file; a failure is a note, never a lost window."""
    summary = made.summary
    if summary is None:
        return dataclasses.replace(result, notes=(*result.notes, str(made.failure)), summary_seconds=made.seconds)
    start = time.perf_counter()
    try:
        json_name, md_name = summary_names(job.trace_name)
        if result.job is not None:
            summary["job"] = job_summary(result.job)
            summary["verdicts"] = with_job_verdicts(summary)  # straggler: only rank 0 merged the job file
        atomic_write(run_dir / json_name, encode_summary(summary))
        markdown = render_markdown(summary)
        atomic_write(run_dir / md_name, markdown.encode())
    except Exception as err:
        return dataclasses.replace(
            result,
            notes=(*result.notes, f"summary not written ({type(err).__name__}: {err})"),
            summary_seconds=made.seconds + time.perf_counter() - start,
        )
    return dataclasses.replace(
        result,
        summary=summary,
        summary_markdown=markdown,
        summary_path=run_dir / json_name,
        summary_seconds=made.seconds + time.perf_counter() - start,
    )


def delivered(job: WindowJob, result: WindowResult) -> None:
    """The window's result reached the training process, so nothing retries it: drop its raw
    dumps and its claim."""
    remove_raw(job)
    if job.job_id and isinstance(result.trace_path, Path):
        release_claim(result.trace_path.parent / claim_name(job.trace_name, job.job_id))
