"""DataLoader workers in a window: which batches a worker traces (its global batch in a published
active range), where its events go, what the summary says of them. Pure: the I/O is
``recording/workers.py``'s and ``export/worker_dumps.py``'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.merge import TorchPlacement
from vt_lightning.analysis.nest import outer_first_order
from vt_lightning.analysis.nesting import settle_as_arrays, write_times
from vt_lightning.analysis.python_tables import PythonStats
from vt_lightning.analysis.schedule import Schedule
from vt_lightning.analysis.schema import WorkerEntry, Workers
from vt_lightning.analysis.spans import ms as _ms
from vt_lightning.analysis.steps import WindowData
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.analysis.track_names import rank_track
from vt_lightning.constants import PYTHON_CATEGORY, TRACE_METADATA_KEY

PLAN_SLOTS = 4  # window ranges a plan holds: back-to-back windows closer than the prefetch depth
NO_LIMIT = 2**62  # an epoch of unknown length (an iterable dataset without ``__len__``)
FETCH_CATEGORY = "dataloader"
TOP_WORKER_PYTHON = 5
_NAME = itemgetter("name")
_CALLS = ("X", "B")

Range = tuple[int, int]  # [first, end) global batch indices of a window's active batches
# Events as filters.filter_python_events groups them: the calls per (pid, tid), and the rest.
ThreadCalls = tuple[dict[tuple[Any, Any], list[dict[str, Any]]], list[dict[str, Any]]]


def upcoming_ranges(schedule: Schedule, step: int, count: int = PLAN_SLOTS) -> list[Range]:
    """The active ranges of the next ``count`` scheduled windows not over by batch ``step``."""
    ranges: list[Range] = []
    window = schedule.next_window(step)
    while window is not None and len(ranges) < count:
        ranges.append((window.active_start, window.end))
        window = schedule.next_window(window.end)
    return ranges


def plan_ranges(scheduled: Sequence[Range], pinned: Iterable[Range] = ()) -> list[Range]:
    """``pinned`` (windows open now) first, then the scheduled ones: at most ``PLAN_SLOTS``, distinct."""
    out: list[Range] = []
    for candidate in (*pinned, *scheduled):
        if candidate not in out and candidate[1] > candidate[0]:
            out.append(candidate)
    return out[:PLAN_SLOTS]


def global_batch(epoch_base: int, epoch_limit: int, idx: Any) -> int | None:
    """The epoch's task ``idx`` as a global batch; None if unknown or past the epoch's limit."""
    if not isinstance(idx, int) or idx < 0 or idx >= epoch_limit:
        return None
    return epoch_base + idx


def range_of(ranges: Iterable[Range], batch: int | None) -> Range | None:
    if batch is None:
        return None
    for first, end in ranges:
        if first <= batch < end:
            return (first, end)
    return None


ClockReading = tuple[float, int]  # (VizTracer µs, monotonic ns) read together


def _line(pairs: Sequence[ClockReading]) -> tuple[float, float, float]:
    """(x0, y0, slope) of the line through the first and last reading (µs -> ns)."""
    x0, y0 = float(pairs[0][0]), float(pairs[0][1])
    x1, y1 = float(pairs[-1][0]), float(pairs[-1][1])
    slope = (y1 - y0) / (x1 - x0) if x1 - x0 > 1000.0 else 1000.0  # < 1 ms apart: offset only
    return x0, y0, slope


class LinearClock:
    """A worker's VizTracer µs -> the training process's, as coefficients ``place_events`` inlines."""

    __slots__ = ("mslope", "mx", "my", "wslope", "wx", "wy")

    def __init__(self, worker: tuple[float, float, float], main: tuple[float, float, float]) -> None:
        self.wx, self.wy, self.wslope = worker
        self.mx, self.my, self.mslope = main

    def __call__(self, us: float) -> float:
        mono_ns = self.wy + (us - self.wx) * self.wslope
        return self.mx + (mono_ns - self.my) / self.mslope


def worker_to_main_us(worker: Sequence[ClockReading], main: Sequence[ClockReading]) -> LinearClock:
    """Each process anchors VizTracer's clock itself (under spawn, a different zero), so both read it
    beside ``time.monotonic_ns``, the clock they share."""
    return LinearClock(_line(worker), _line(main))


def place_events(
    events: Iterable[dict[str, Any]],
    to_main_us: LinearClock,
    drop_tids: set[int],
    grouped: ThreadCalls | None = None,
    to_torch: TorchPlacement | None = None,
    ordered: dict[tuple[Any, Any], set[Any]] | None = None,
    settle: Callable[[set[Any]], bool] | None = None,
    settled: dict[tuple[Any, Any], tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[dict[str, Any]]:
    """A worker's events moved onto the main process's clock in place, less its helper threads' and its
    ``process_name``; ``grouped`` files them as the filter does, ``to_torch`` puts the calls on torch's
    timeline (their threads into ``ordered``; those ``settle`` keeps whole and that nest, on the grid)."""
    wx, wy, wslope = to_main_us.wx, to_main_us.wy, to_main_us.wslope
    mx, my, mslope = to_main_us.mx, to_main_us.my, to_main_us.mslope
    kept: list[dict[str, Any]] = []
    append = kept.append
    threads, others = grouped if grouped is not None else ({}, [])
    placing = to_torch is not None and grouped is not None
    complete: dict[tuple[Any, Any], tuple[list[dict[str, Any]], list[Any], list[Any]]] = {}
    mixed: set[tuple[Any, Any]] = set()  # threads with a "B" call too: filed as read
    last_pid: Any = drop_tids  # no event's: the first call looks its thread up
    last_tid: Any = drop_tids
    add_call = add_ts = add_dur = append
    for event in events:
        get = event.get
        tid = get("tid")
        if tid in drop_tids:
            continue
        ph = get("ph")
        if ph == "X" and "ts" in event:
            pid = get("pid")
            if tid != last_tid or pid != last_pid:  # a thread's calls come in runs
                last_pid, last_tid = pid, tid
                columns = complete.get((pid, tid))
                if columns is None:
                    columns = complete[(pid, tid)] = ([], [], [])
                add_call, add_ts, add_dur = columns[0].append, columns[1].append, columns[2].append
            add_call(event)
            add_ts(event["ts"])
            add_dur(get("dur", 0.0))
            append(event)
            continue
        if ph == "M" and get("name") == "process_name":
            continue
        if "ts" in event:
            start = mx + ((wy + (float(event["ts"]) - wx) * wslope) - my) / mslope
            event["ts"] = start
            if ph == "B" and grouped is not None:
                if to_torch is not None:  # placed as merge.place_python_events places one
                    if not isinstance(get("cat"), str):
                        event["cat"] = PYTHON_CATEGORY
                    event["ts"] = to_torch.at(start)
                key = (get("pid"), tid)
                if key not in complete:
                    complete[key] = ([], [], [])
                mixed.add(key)
                append(event)
                continue
        if grouped is not None:
            others.append(event)
        append(event)
    for key, (calls, ts, dur) in complete.items():
        start_array, dur_array = _place_calls(ts, dur, to_main_us, to_torch if placing else None)
        group = threads.setdefault(key, []) if grouped is not None else []
        if key in mixed or not placing:
            write_times(calls, start_array.tolist(), dur_array.tolist(), PYTHON_CATEGORY if placing else None)
            if key in mixed:  # its X and B calls in the dump's order
                group += (
                    e for e in kept if (e.get("pid"), e.get("tid")) == key and e.get("ph") in _CALLS and "ts" in e
                )
            else:
                group += calls
            continue
        order = outer_first_order(start_array, dur_array)  # filed outer first
        group += map(calls.__getitem__, order.tolist())
        names = _names(calls)
        if ordered is not None and names is not None:
            ordered[key] = names
        if settle is not None and settled is not None and names is not None and settle(names):
            found = settle_as_arrays(calls, start_array, dur_array, order, PYTHON_CATEGORY)
            if found is not None:
                settled[key] = (found[0][order], found[1][order])
                continue
        write_times(calls, start_array.tolist(), dur_array.tolist(), PYTHON_CATEGORY)
    return kept


def _names(calls: list[dict[str, Any]]) -> set[Any] | None:
    """The calls' distinct names (None where one has none, or one cannot be hashed)."""
    try:
        return set(map(_NAME, calls))
    except (KeyError, TypeError):
        return None


def _place_calls(
    ts: list[Any], dur: list[Any], to_main_us: LinearClock, to_torch: TorchPlacement | None
) -> tuple[np.ndarray, np.ndarray]:
    """Calls' starts and lengths mapped as arrays, ``LinearClock``'s operations in its order."""
    try:
        starts = np.array(ts, dtype=float)
        lengths = np.array(dur, dtype=float)
    except (TypeError, ValueError):  # what float() reads, or its error
        starts = np.array([float(value) for value in ts], dtype=float)
        lengths = np.array([float(value) for value in dur], dtype=float)
    clock = to_main_us
    start = clock.mx + ((clock.wy + (starts - clock.wx) * clock.wslope) - clock.my) / clock.mslope
    end = clock.mx + ((clock.wy + ((starts + lengths) - clock.wx) * clock.wslope) - clock.my) / clock.mslope
    length = end - start
    length = np.where(length < 0.0, 0.0, length)
    return (start, length) if to_torch is None else to_torch.calls(start, length)


def process_name(rank: int, worker_id: int) -> str:
    return rank_track(rank, f"DataLoader worker {worker_id}")


def worker_process_events(
    pid: int,
    rank: int,
    worker_id: int,
    fetches: Sequence[tuple[int, float, float]],
    to_torch_us: Callable[[float], float],
    after: int = 0,
) -> list[dict[str, Any]]:
    """The worker's process name, sort index (after ``after``) and a span per traced fetch."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process_name(rank, worker_id)}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": after + 1 + worker_id}},
    ]  # fmt: skip
    for batch, start, end in fetches:
        ts = round(to_torch_us(start), 3)
        events.append(
            {
                "ph": "X",
                "cat": FETCH_CATEGORY,
                "name": f"fetch batch {batch}",
                "pid": pid,
                "tid": pid,  # a worker fetches on its main thread, whose native id is its pid
                "ts": ts,
                "dur": max(round(to_torch_us(end) - ts, 3), 0.0),
                "args": {"batch": batch, "worker": worker_id},
            }
        )
    return events


def main_sort_index(events: Iterable[Mapping[str, Any]], workers: set[int]) -> int:
    """The largest numeric ``process_sort_index`` of the trace's processes other than ``workers``."""
    found = [
        int(e["args"]["sort_index"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_sort_index" and isinstance(e.get("pid"), int)
        and e.get("pid") not in workers and isinstance(e.get("args", {}).get("sort_index"), int)
    ]  # fmt: skip
    return max(found, default=0)


def seconds_to_lower(earliest_us: float | None) -> int:
    """Whole seconds to lower the time origin below every event (a worker fetches ahead)."""
    return 0 if earliest_us is None or earliest_us >= 0 else int(-earliest_us // 1_000_000) + 1


def lower_origin(trace: WindowTrace, seconds: int) -> None:
    """Move ``trace``'s time origin ``seconds`` earlier: every ``ts`` grows, absolute time stays."""
    if seconds <= 0:
        return
    shift_us = seconds * 1_000_000
    trace.shift(shift_us)
    trace.header["baseTimeNanoseconds"] = int(trace.header.get("baseTimeNanoseconds", 0)) - shift_us * 1000
    meta = trace.header.get(TRACE_METADATA_KEY)
    if isinstance(meta, dict) and "time_origin_us" in meta:
        meta["time_origin_us"] = int(meta["time_origin_us"]) - shift_us


def worker_summary(window: WindowData) -> Workers | None:
    """The summary's ``workers`` key (None without workers)."""
    from vt_lightning.analysis.summary import rank_python

    info = window.meta.get("workers")
    if not isinstance(info, Mapping):
        return None
    workers: Sequence[Mapping[str, Any]] = info.get("processes", [])
    pids = {int(w["pid"]) for w in workers}
    fetches: dict[int, list[tuple[int, float]]] = {pid: [] for pid in pids}
    for x in window.rest:  # the fetch spans, among the events other than Python calls
        if x.get("cat") == FETCH_CATEGORY and x.get("pid") in pids:
            fetches[x["pid"]].append((int(x.get("args", {}).get("batch", -1)), float(x.get("dur", 0.0))))
    whole = window.whole_threads
    stats = PythonStats()
    for worker_pid in pids:
        for thread in window.python_calls:
            if thread[0] == worker_pid:
                window.walk(thread)
                stats.threads[thread] = whole.threads[thread]
    stats.info, stats.package_of, stats.user = whole.info, whole.package_of, whole.user
    threads_of: dict[Any, list[Any]] = {pid: [] for pid in pids}
    for thread in stats.threads:
        threads_of[thread[0]].append(thread)
    per_worker: list[WorkerEntry] = []
    for entry in sorted(workers, key=lambda w: (int(w["worker"]), int(w["pid"]))):
        pid = int(entry["pid"])
        done = sorted(fetches[pid])
        top = rank_python(stats, stats.merged(threads_of[pid]), 1, limit=2 * TOP_WORKER_PYTHON)
        per_worker.append(
            {
                "worker": int(entry["worker"]),
                "pid": pid,
                "process": process_name(int(entry["rank"]), int(entry["worker"])),
                "batches": [batch for batch, _ in done],
                "busy_ms": _ms(sum(dur for _, dur in done)),
                "top_python": [e for e in top["by_self"] if e["origin"] == "user"][:TOP_WORKER_PYTHON],
            }
        )
    overall = rank_python(stats, stats.merged(), 1, limit=2 * TOP_WORKER_PYTHON)["by_self"] if stats.threads else []
    return {
        "workers": per_worker,
        "top_python": overall[: 2 * TOP_WORKER_PYTHON],
        "missing": list(info.get("missing", [])),
    }


def workers_markdown(workers: Mapping[str, Any]) -> list[str]:
    """The summary's workers as markdown lines (``vt-lightning summary``, summary.md)."""
    rows = workers.get("workers") or []
    lines = [
        "",
        "| DataLoader worker | batches fetched | busy ms | top user function (self ms) |",
        "|---|---|---:|---|",
    ]
    for worker in rows:
        top = (worker.get("top_python") or [None])[0]
        where = f"`{top['function']}` ({_ms_text(top.get('self_ms'))})" if top else "–"
        batches = ", ".join(str(b) for b in worker.get("batches") or []) or "–"
        lines.append(f"| {worker.get('process')} | {batches} | {_ms_text(worker.get('busy_ms'))} | {where} |")
    if not rows:
        lines.append("| (none traced) | – | – | – |")
    missing = workers.get("missing") or []
    if missing:
        lines += ["", *(f"Worker events missing: {note}." for note in missing)]
    return lines


def _ms_text(value: Any) -> str:
    return "–" if value is None else f"{float(value):.2f}"
