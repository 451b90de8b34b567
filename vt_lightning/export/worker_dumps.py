"""The writer's side of DataLoader worker tracing: collect the parts the workers wrote to the spool
for one window (``recording/worker_side.py``), wait a bounded time for those still being written, and
put their events on the window's timeline. A worker that died or hung loses only its own part: the
window is written without it, with a note.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson

from vt_lightning.analysis.merge import TorchPlacement
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.analysis.workers import (
    ThreadCalls,
    lower_origin,
    main_sort_index,
    place_events,
    seconds_to_lower,
    worker_process_events,
    worker_to_main_us,
)
from vt_lightning.constants import PYTHON_CATEGORY
from vt_lightning.export import raw_json
from vt_lightning.export.atomic import process_alive, remove_quietly, scheduler_state

POLL_S = 0.02


@dataclass
class WorkerDumps:
    """The workers' events of one window, on the main process's VizTracer clock."""

    events: list[dict[str, Any]] = field(default_factory=list)
    # ``events`` as the filter groups them (``workers.ThreadCalls``): it need not walk them again
    grouped: ThreadCalls = field(default_factory=lambda: ({}, []))
    # the threads of ``grouped`` filed outer first, and their names (``place_events``' ``ordered``)
    ordered: dict[tuple[Any, Any], set[Any]] = field(default_factory=dict)
    # the threads put on the nanosecond grid as placed (``place_events``' ``settled``)
    settled: dict[tuple[Any, Any], tuple[Any, Any]] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)  # pid, worker, rank, fetches (main µs)
    missing: list[str] = field(default_factory=list)


def _alive(pid: int) -> bool:
    """A live process with this pid on this host; a zombie is dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = scheduler_state(f.read())
    except OSError:  # no /proc (not Linux), or the process is gone
        state = ""
    return state not in ("Z", "X") if state else process_alive(pid)


def _stem_pid(stem: str) -> int:
    for part in os.path.basename(stem).split("-"):
        if part.startswith("p") and part[1:].isdigit():
            return int(part[1:])
    return -1


def _part_files(extras: dict[str, Any], suffix: str = "") -> list[str]:
    """The spool's files of one window's worker parts. Not ``glob``: its cache keeps every new pattern."""
    prefix = f"b{int(extras['first'])}-r{int(extras['rank'])}-"
    try:
        with os.scandir(str(extras["dir"])) as entries:
            return [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(suffix)]
    except OSError:
        return []


def part_stems(extras: dict[str, Any]) -> list[str]:
    return sorted(path[: -len(".started")] for path in _part_files(extras, ".started"))


def wait_for_parts(
    stems: list[str], wait_s: float, alive: Callable[[int], bool] = _alive
) -> tuple[list[str], list[str]]:
    """(complete stems, notes on the others) once every part is complete or its worker is gone,
    or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    pending = list(stems)
    while True:
        pending = [s for s in pending if not os.path.exists(f"{s}.meta.json")]
        if not any(alive(_stem_pid(s)) for s in pending) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    pending = [s for s in pending if not os.path.exists(f"{s}.meta.json")]  # completed at the last moment
    complete = [s for s in stems if s not in pending]
    notes = []
    for stem in pending:
        pid = _stem_pid(stem)
        why = "it exited or was killed mid-window" if not alive(pid) else f"still busy after {wait_s:.0f} s (hung?)"
        notes.append(f"DataLoader worker pid {pid} wrote no events for this window: {why}")
    return complete, notes


def collect_worker_dumps(
    extras: dict[str, Any] | None,
    to_torch: TorchPlacement | None = None,
    settle: Callable[[set[Any]], bool] | None = None,
) -> WorkerDumps | None:
    """Read one window's worker parts (None: none). ``to_torch``: placed on torch's timeline as read;
    ``settle``: which threads' calls go on the nanosecond grid too."""
    if not extras:
        return None
    out = WorkerDumps()
    stems = part_stems(extras)
    if not stems:
        return None
    complete, out.missing = wait_for_parts(stems, float(extras.get("wait_s", 10.0)))
    main_clock = [(float(us), int(ns)) for us, ns in extras["main_clock"]]
    for stem in complete:
        try:
            with open(f"{stem}.meta.json", "rb") as f:
                meta = orjson.loads(f.read())
            with open(f"{stem}.json", "rb") as f:
                dump = raw_json.loads(f.read())  # VizTracer's raw dump: names unescaped
        except (OSError, ValueError) as err:
            out.missing.append(f"a DataLoader worker's events could not be read ({type(err).__name__}: {err})")
            continue
        to_main = worker_to_main_us([(float(u), int(n)) for u, n in meta["clock"]], main_clock)
        helper_tids = {int(t) for t in meta.get("helper_tids", [])}
        events = chain(dump.get("traceEvents", []), library_spans(meta))  # one placing: one sort per thread
        out.events += place_events(
            events, to_main, helper_tids, out.grouped, to_torch, out.ordered, settle, out.settled
        )
        if dump.get("viztracer_metadata", {}).get("overflow"):
            out.missing.append(
                f"DataLoader worker {meta['worker']} filled its ring buffer: only its last events are kept"
            )
        out.workers.append(
            {
                "pid": int(meta["pid"]),
                "worker": int(meta["worker"]),
                "rank": int(meta["rank"]),
                "fetches": [(int(b), to_main(float(s)), to_main(float(e))) for b, s, e in meta["fetches"]],
            }
        )
    return out


def library_spans(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The library calls a worker noted as spans, as complete events on its fetching thread."""
    pid, tid = int(meta["pid"]), int(meta.get("tid") or meta["pid"])
    return [
        {
            "ph": "X",
            "name": str(name),
            "ts": float(start),
            "dur": float(end) - float(start),
            "cat": PYTHON_CATEGORY,
            "pid": pid,
            "tid": tid,
        }
        for name, start, end in meta.get("spans", [])
    ]


def add_to_trace(trace: WindowTrace, dumps: WorkerDumps, to_torch_us: Callable[[float], float]) -> list[str]:
    """Name the workers' processes, add their ``fetch batch N`` spans and metadata, and move the time
    origin down should a worker have fetched before it; returns the notes."""
    meta = trace.meta
    origin = float(meta.get("time_origin_us", 0))
    processes: dict[int, dict[str, Any]] = {}
    for worker in dumps.workers:
        entry = processes.setdefault(worker["pid"], {**worker, "fetches": []})
        entry["fetches"].extend(worker["fetches"])
    after = main_sort_index(trace.metadata, set(processes))

    def on_trace(us: float) -> float:
        return to_torch_us(us) - origin

    for pid, worker in processes.items():
        fetches = sorted(worker["fetches"])
        trace.add(worker_process_events(pid, worker["rank"], worker["worker"], fetches, on_trace, after))
    lower_origin(trace, seconds_to_lower(trace.earliest()))
    meta["workers"] = {
        "processes": [{"pid": pid, "worker": w["worker"], "rank": w["rank"]} for pid, w in sorted(processes.items())],
        "missing": list(dumps.missing),
    }
    return list(dumps.missing)


def remove_parts(extras: dict[str, Any] | None) -> None:
    """Delete every file of one window's worker parts (once the window is delivered, or failed)."""
    if not extras:
        return
    for path in _part_files(extras):
        remove_quietly(path)
