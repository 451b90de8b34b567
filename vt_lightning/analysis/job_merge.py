"""The ranks' traces of one window on one timeline: the job file (pure; written by export/job_file.py;
docs/distributed.md). A rank's events move by the difference of its ``baseTimeNanoseconds`` from
rank 0's (exact ns), then by its clock offset, never onto a file's first event; its pids and flow
ids are renumbered per rank (``PID_STRIDE``: never pid 0, Perfetto's idle process); past the budget,
ranks but ``keep_full`` keep only steps, collectives, metadata and their top functions' calls."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vt_lightning.analysis.straggler import FAMILIES
from vt_lightning.analysis.track_names import KINETO_PROCESS, main_process_name, rank_track
from vt_lightning.constants import PYTHON_CATEGORY, STEP_PREFIX, TRACE_METADATA_KEY

PID_STRIDE = 1_000_000
FLOW_STRIDE = 1 << 40
JOB_BUDGET_BYTES = 1 << 30  # 1 GiB of JSON: Perfetto's UI needs ~2 GB of memory for it, JSON inflates 2-4x when loaded
TOP_FUNCTIONS = 50
JOB_METADATA_KEY = "vt_lightning_job"
_DROPPED_META = ("process_name", "process_sort_index", "process_labels")
SORT_STRIDE = 1000  # process_sort_index of rank N's processes: N * SORT_STRIDE + 1, + 2, ...


def rank_pids(trace: Mapping[str, Any], rank: int) -> dict[Any, int]:
    """``{original pid: job pid}`` of one rank's trace (its own process first)."""
    own = (trace.get(TRACE_METADATA_KEY) or {}).get("pid")
    order: list[Any] = [own] if own is not None else []
    seen = set(order)
    for event in trace.get("traceEvents", []):
        pid = event.get("pid")
        if pid is not None and pid not in seen:
            seen.add(pid)
            order.append(pid)
    return {pid: rank * PID_STRIDE + 1 + i for i, pid in enumerate(order)}


def shift_us(trace: Mapping[str, Any], base_ns: int, offset_us: float) -> float:
    """What to add to this rank's ``ts`` to land on the job's timeline, in whole ns (nesting is kept)."""
    own_base = int(trace.get("baseTimeNanoseconds", 0) or 0)
    return round((own_base - base_ns) - offset_us * 1000.0) / 1000.0


def _process_names(trace: Mapping[str, Any]) -> dict[Any, str]:
    names = {}
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "M" and event.get("name") == "process_name":
            names[event.get("pid")] = str((event.get("args") or {}).get("name", ""))
    return names


def is_kept_when_reduced(event: Mapping[str, Any], top: set[str]) -> bool:
    """What a reduced rank keeps: metadata, steps, collectives and its top Python functions."""
    if event.get("ph") in ("M", None):
        return True
    name = str(event.get("name", ""))
    if name.startswith(STEP_PREFIX) or name.startswith(FAMILIES):
        return True
    if event.get("cat") == PYTHON_CATEGORY:
        return name in top
    return False


def top_functions(events: Iterable[Mapping[str, Any]], n: int = TOP_FUNCTIONS) -> set[str]:
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == PYTHON_CATEGORY:
            totals[str(event.get("name", ""))] += float(event.get("dur", 0.0))
    return set(sorted(totals, key=lambda name: -totals[name])[:n])


def rank_events(
    trace: Mapping[str, Any], rank: int, shift: float, reduced: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """One rank's events on the job timeline, pids and flow ids renumbered; (events, dropped)."""
    pids = rank_pids(trace, rank)
    names = _process_names(trace)
    own = (trace.get(TRACE_METADATA_KEY) or {}).get("pid")
    source = trace.get("traceEvents", [])
    top = top_functions(source) if reduced else set()
    out: list[dict[str, Any]] = []
    dropped = 0
    labels = {pid: _process_label(rank, pid, own, names.get(pid)) for pid in pids}
    # its main process, then its workers, then kineto's rows; no index is 0 (viewers may read it as unset)
    order = sorted(pids, key=lambda pid: (pid != own, "DataLoader worker" not in labels[pid], str(pid)))
    for position, pid in enumerate(order):
        new = pids[pid]
        sort_index = rank * SORT_STRIDE + 1 + position
        out.append({"ph": "M", "name": "process_name", "pid": new, "tid": 0, "args": {"name": labels[pid]}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0, "args": {"sort_index": sort_index}})
    for event in source:
        if event.get("ph") == "M" and event.get("name") in _DROPPED_META:
            continue
        if reduced and not is_kept_when_reduced(event, top):
            dropped += 1
            continue
        moved = dict(event)
        if "pid" in moved:
            pid = moved["pid"]
            moved["pid"] = pids.get(pid, pid)
            # a process's main thread (and kineto's one thread of its `Spans` row) takes the process's new
            # pid: Perfetto lists a thread whose tid is its pid first, as the main thread
            if moved.get("tid") == pid or pid == KINETO_PROCESS:
                moved["tid"] = moved["pid"]
        if "ts" in moved:
            moved["ts"] = round(float(moved["ts"]) + shift, 3)  # shift is whole ns: nesting is kept
        for key in ("id", "bind_id"):
            if isinstance(moved.get(key), int):
                moved[key] = rank * FLOW_STRIDE + moved[key]
            elif isinstance(moved.get(key), str):
                moved[key] = f"{rank}:{moved[key]}"
        out.append(moved)
    return out, dropped


def _process_label(rank: int, pid: Any, own: Any, name: str | None) -> str:
    """``rank N · main process``, ``rank N · DataLoader worker K``, ``rank N · torch.profiler``; no bare pid."""
    if pid == own:
        return main_process_name(rank)
    if pid == KINETO_PROCESS or not name:
        return rank_track(rank, "torch.profiler" if pid == KINETO_PROCESS else f"process {pid}")
    return rank_track(rank, name)


def merge_job(
    traces: Mapping[int, Mapping[str, Any]],
    offsets_us: Mapping[int, float],
    metadata: Mapping[str, Any],
    reduce_ranks: Sequence[int] = (),
) -> dict[str, Any]:
    """The job trace: rank 0's ``baseTimeNanoseconds``, our metadata, then every rank's events."""
    base_ns = int(traces[min(traces)].get("baseTimeNanoseconds", 0) or 0)
    events: list[dict[str, Any]] = []
    left_out: dict[str, int] = {}
    for rank in sorted(traces):
        moved, dropped = rank_events(
            traces[rank], rank, shift_us(traces[rank], base_ns, offsets_us.get(rank, 0.0)), rank in reduce_ranks
        )
        events.extend(moved)
        if dropped:
            left_out[f"rank {rank}"] = dropped
    meta = dict(metadata)
    meta["pid_scheme"] = f"rank * {PID_STRIDE} + 1 + index of the pid in the rank's trace (its own process: 0)"
    meta["reduced_ranks"] = sorted(reduce_ranks)
    meta["left_out_events"] = left_out
    return {"baseTimeNanoseconds": base_ns, "displayTimeUnit": "ms", JOB_METADATA_KEY: meta, "traceEvents": events}


def aligned_events(
    traces: Mapping[int, Mapping[str, Any]], offsets_us: Mapping[int, float]
) -> dict[int, list[dict[str, Any]]]:
    """Each rank's timed events on the job timeline (for the straggler analysis), not renumbered."""
    base_ns = int(traces[min(traces)].get("baseTimeNanoseconds", 0) or 0)
    out = {}
    for rank, trace in traces.items():
        shift = shift_us(trace, base_ns, offsets_us.get(rank, 0.0))
        out[rank] = [
            {**e, "ts": float(e["ts"]) + shift}
            for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and "ts" in e
        ]
    return out


def ranks_to_reduce(sizes: Mapping[int, int], keep_full: Iterable[int], budget_bytes: int) -> list[int]:
    """Ranks that lose detail: none if the job fits the budget, else all but ``keep_full``."""
    if sum(sizes.values()) <= budget_bytes:
        return []
    keep = set(keep_full)
    return sorted(r for r in sizes if r not in keep)


def slowest_and_fastest(wait_ms: Sequence[Mapping[str, Any]]) -> list[int]:
    """The rank that waits least (the slowest: the others wait for it) and the one that waits most."""
    if not wait_ms:
        return [0]
    ordered = sorted(wait_ms, key=lambda w: (float(w["wait_ms"]), int(w["rank"])))
    return sorted({int(ordered[0]["rank"]), int(ordered[-1]["rank"])})
