"""CPU memory snapshots from a merged trace, in ``torch.cuda.memory._snapshot()``'s format: torch's
``[memory]`` instants as the allocator's trace, the calls and ops around each as its stack, written
as memory_viz needs (docs/memory.md, "For developers"). Pure."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from vt_lightning.analysis.nest import covering, outer_first
from vt_lightning.analysis.spans import union
from vt_lightning.analysis.trace import Thread, WindowTrace
from vt_lightning.analysis.usercode import parse_function
from vt_lightning.constants import CPU_OP_CATEGORY, PYTHON_CATEGORY, USER_ANNOTATION_CATEGORY

# the Python calls and torch events that may enclose an allocation
FRAME_CATEGORIES = frozenset({PYTHON_CATEGORY, CPU_OP_CATEGORY, USER_ANNOTATION_CATEGORY})
UNKNOWN_FILE = "??"  # what torch writes for a frame without a source file
CPU_DEVICE_TYPE = 0  # ``Device Type`` of torch's [memory] events (c10::DeviceType::CPU)
_DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda", 13: "mps", 20: "meta", 12: "xpu", 9: "hip"}
_LARGE_SEGMENT = 1 << 20  # the CUDA allocator's small/large split, kept for the segment_type field
_START, _END = itemgetter(0), itemgetter(1)


def parse_frame(event_name: str) -> dict[str, Any]:
    """One memory_viz frame from an event name (no source: the whole name, file ``"??"``, line 0)."""
    name, file, line = parse_function(event_name)
    if file is None or line is None:
        return {"filename": UNKNOWN_FILE, "line": 0, "name": event_name}
    return {"filename": file, "line": line, "name": name}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _stack_frames(
    memory: list[tuple[float, int]],
    intervals: list[tuple[float, float, str]],
    frame_of: Callable[[str], dict[str, Any]],
) -> dict[int, list[dict[str, Any]]]:
    """Each memory event's enclosing calls, innermost first, nested or not."""
    ordered = outer_first(intervals, _START, _END)
    memory.sort()
    out: dict[int, list[dict[str, Any]]] = {}
    previous: list[dict[str, Any]] = []
    for (_, index), found in zip(memory, covering(ordered, [ts for ts, _ in memory])):
        frames = [frame_of(iv[2]) for iv in reversed(found)]
        if frames == previous:  # identical frames compare by identity first: cheap
            frames = previous  # share the list: stored once in the pickle
        previous = frames
        out[index] = frames
    return out


def build_cpu_snapshot(trace: WindowTrace | Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A ``_snapshot()``-format dict of a window's trace (None: no ``[memory]`` event), times in its µs; on
    CPU ``segments`` are the address ranges used."""
    if not isinstance(trace, WindowTrace):
        trace = WindowTrace.of({"traceEvents": list(trace)})
    records, memory_by_thread = _memory_records(trace.memory)
    if not records:
        return None
    calls_by_thread = _calls_of_threads(trace, memory_by_thread.keys())
    frame_of = functools.lru_cache(maxsize=None)(parse_frame)  # one dict per name: pickled once
    frames_of: dict[int, list[dict[str, Any]]] = {}
    for thread, memory in memory_by_thread.items():
        frames_of.update(_stack_frames(memory, calls_by_thread[thread], frame_of))
    del calls_by_thread, memory_by_thread

    devices = _device_order({record[4] for record in records})
    replay = _Replay(len(devices))
    device_index = {device: i for i, device in enumerate(devices)}
    records.sort(key=lambda r: (r[0], r[1]))  # by time; equal times keep the trace's order
    for ts, index, addr, size, device in records:
        replay.add(device_index[device], round(ts), addr, size, frames_of.get(index, []))

    segments: list[dict[str, Any]] = []
    for d in range(len(devices)):
        segments.extend(_segments(d, replay.ranges[d], replay.live[d].values()))

    return {
        "segments": segments,
        "device_traces": replay.traces,
        "vt_lightning": {
            "source": "cpu-profiler-memory-events",
            "devices": [_device_label(device) for device in devices],
            "events": len(records),
            "frees_without_alloc": replay.frees_before_window,
            "allocs_without_free": replay.unmatched_allocs,
            "frames": "viztracer+torch-ops",
            "time": "trace ts (torch timeline, us)",
        },
    }


_Record = tuple[float, int, int, int, tuple[int, int]]  # ts, index, addr, bytes, device


def _memory_records(
    events: Sequence[Mapping[str, Any]],
) -> tuple[list[_Record], dict[Thread, list[tuple[float, int]]]]:
    """torch's ``[memory]`` events as records in trace order, and per thread their (ts, index)."""
    memory_by_thread: dict[Thread, list[tuple[float, int]]] = {}
    records: list[_Record] = []
    for event in events:
        args = event.get("args") or {}
        ts = _number(event.get("ts"))
        addr = args.get("Addr")
        size = args.get("Bytes")
        if ts is None or not isinstance(addr, int) or not isinstance(size, int) or size == 0:
            continue
        device = (_int_or(args.get("Device Type"), CPU_DEVICE_TYPE), _int_or(args.get("Device Id"), -1))
        index = len(records)
        records.append((ts, index, addr, size, device))
        memory_by_thread.setdefault((event.get("pid"), event.get("tid")), []).append((ts, index))
    return records, memory_by_thread


def _calls_of_threads(trace: WindowTrace, threads: Iterable[Thread]) -> dict[Thread, list[tuple[float, float, str]]]:
    """The calls and ops of the threads that allocated only (others enclose no allocation)."""
    calls_by_thread: dict[Thread, list[tuple[float, float, str]]] = {key: [] for key in threads}
    tids = {tid for _, tid in calls_by_thread}
    span = trace.python
    if span.start == 0 and span.stop == len(trace.events):  # read back: every event is read
        parts: list[Iterable[dict[str, Any]]] = [trace.events]
    else:  # the merge's: the Python part holds nothing but the threads' calls (and what is no span)
        calls = [call for thread in calls_by_thread for call in trace.threads.python.get(thread) or ()]
        parts = [trace.events[: span.start], calls, trace.events[span.stop :]]
    for part in parts:
        # picked by a comprehension first: most of a window's events are a worker's, which allocated nothing
        for event in [e for e in part if e.get("tid") in tids]:
            if event.get("ph") != "X":
                continue
            found = calls_by_thread.get((event.get("pid"), event.get("tid")))
            if found is None:
                continue
            if event.get("cat") not in FRAME_CATEGORIES:
                continue
            ts = event.get("ts")
            if type(ts) is not float:  # a merged trace's are (snapped floats): skip the checks
                ts = _number(ts)
            name = event.get("name")
            if ts is None or not isinstance(name, str):
                continue
            dur = event.get("dur")
            if type(dur) is not float:
                dur = _number(dur) or 0.0
            found.append((ts, ts + max(dur, 0.0), name))
    return calls_by_thread


class _Replay:
    """The allocator's trace per device, replayed in time order, with what could not be matched."""

    def __init__(self, devices: int) -> None:
        self.traces: list[list[dict[str, Any]]] = [[] for _ in range(devices)]
        self.live: list[dict[int, dict[str, Any]]] = [{} for _ in range(devices)]  # addr -> its alloc entry
        self.ranges: list[list[tuple[int, int]]] = [[] for _ in range(devices)]
        self.unmatched_allocs = 0
        self.frees_before_window = 0

    def add(self, d: int, time_us: int, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        trace, alive = self.traces[d], self.live[d]
        if size > 0:
            previous = alive.pop(addr, None)
            if previous is not None:  # its free was lost: close it here so the replay stays sane
                self.unmatched_allocs += 1
                _append_free(trace, addr, previous["size"], time_us, previous["frames"])
            entry = _trace_entry("alloc", addr, size, time_us, frames)
            trace.append(entry)
            alive[addr] = entry
            self.ranges[d].append((addr, addr + size))
            return
        allocated = alive.pop(addr, None)
        if allocated is None:
            self.frees_before_window += 1
            freed = -size
            self.ranges[d].append((addr, addr + freed))
        else:
            freed = allocated["size"]
        _append_free(trace, addr, freed, time_us, frames)


def _trace_entry(action: str, addr: int, size: int, time_us: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": frames}


def _append_free(trace: list[dict[str, Any]], addr: int, size: int, time_us: int, frames: list[dict[str, Any]]) -> None:
    trace += (_trace_entry(action, addr, size, time_us, frames) for action in ("free_requested", "free_completed"))


def _device_order(devices: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Accelerators first by (type, id), CPU last: torch's own convention (cpu = device_count)."""
    return sorted(devices, key=lambda dev: (dev[0] == CPU_DEVICE_TYPE, dev[0], dev[1]))


def _device_label(device: tuple[int, int]) -> str:
    kind, index = device
    name = _DEVICE_TYPE_NAMES.get(kind, f"device_type_{kind}")
    return name if index < 0 else f"{name}:{index}"


def _segments(
    device: int, ranges: list[tuple[int, int]], live_entries: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Merged address ranges, each tiled by its live blocks and ``inactive`` gaps."""
    blocks = sorted(live_entries, key=lambda e: e["addr"])
    segments = []
    b = 0
    for start, end in union(ranges):
        seg_blocks: list[dict[str, Any]] = []
        cursor = start
        allocated = 0
        while b < len(blocks) and blocks[b]["addr"] < end:
            entry = blocks[b]
            b += 1
            addr, size = entry["addr"], entry["size"]
            if addr < cursor or addr + size > end:  # overlaps a kept block: inconsistent input
                continue
            if addr > cursor:
                seg_blocks.append(_inactive(cursor, addr - cursor))
            seg_blocks.append(
                {
                    "address": addr,
                    "size": size,
                    "requested_size": size,
                    "state": "active_allocated",
                    "frames": entry["frames"],
                }
            )
            allocated += size
            cursor = addr + size
        if cursor < end:
            seg_blocks.append(_inactive(cursor, end - cursor))
        total = end - start
        segments.append(
            {
                "device": device,
                "address": start,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": 0,
                "segment_type": "large" if total > _LARGE_SEGMENT else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": seg_blocks,
            }
        )
    return segments


def _inactive(address: int, size: int) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
