"""The device parts of a window's summary: GPU busy time and idle gaps, memory peaks and
allocation sites. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from vt_lightning.analysis.schema import AllocationSite, DeviceMemory, Gpu, IdleGap, Memory
from vt_lightning.analysis.spans import Span, clip, difference, ms, span_of, union
from vt_lightning.analysis.trace import Calls
from vt_lightning.analysis.usercode import is_user_file, parse_function

KERNEL_CATEGORIES = frozenset({"kernel"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
TOP_GAPS = 5
TOP_SITES = 10


def gpu_summary(events: Sequence[Mapping[str, Any]], window: Span, calls: Calls, limit: int = TOP_GAPS) -> Gpu | None:
    """Busy % over the window and the largest idle gaps, each with the training thread's call in it."""
    kernels = [span_of(e) for e in events if e.get("cat") in KERNEL_CATEGORIES]
    if not kernels:
        return None
    lo, hi = window
    busy = union(clip(kernels, lo, hi))
    busy_us = sum(e - s for s, e in busy)
    gaps = sorted(difference([window], busy), key=lambda g: g[1] - g[0], reverse=True)
    order = calls.nest.order.tolist()
    ordered = list(zip(calls.starts[order].tolist(), calls.ends[order].tolist(), calls.ordered_names))
    devices = sorted({str(e.get("pid")) for e in events if e.get("cat") in KERNEL_CATEGORIES})
    return {
        "devices": devices,
        "busy_percent": round(100.0 * busy_us / (hi - lo), 2) if hi > lo else 0.0,
        "kernel_ms": ms(busy_us),
        "wall_ms": ms(hi - lo),
        "idle_gaps": [_gap(gap, ordered) for gap in gaps[:limit]],
    }


def _gap(gap: Span, calls: Sequence[tuple[float, float, str]]) -> IdleGap:
    mid = (gap[0] + gap[1]) / 2
    innermost = None
    user = None
    for start, end, name in calls:  # outer first (``nest.outer_first``): the last cover is innermost
        if start > mid:
            break
        if end > mid:
            innermost = name
            if is_user_file(parse_function(name)[1]):
                user = name
    return {
        "start_us": round(gap[0], 3),
        "ms": ms(gap[1] - gap[0]),
        "python": innermost,
        "user_python": user,
    }


_DEVICE_NAMES = {0: "cpu", 1: "cuda"}


def memory_summary(
    events: Sequence[Mapping[str, Any]], snapshot: Mapping[str, Any] | None, limit: int = TOP_SITES
) -> Memory | None:
    """Peaks per device (torch's ``[memory]`` events, else the snapshot) and the top allocation sites."""
    peaks: dict[str, dict[str, int]] = {}
    for event in events:
        if event.get("ph") != "i" or event.get("name") != "[memory]":
            continue
        args = event.get("args") or {}
        kind = args.get("Device Type", 0)
        index = args.get("Device Id", -1)
        label = _DEVICE_NAMES.get(kind, f"device_type_{kind}") + (
            f":{index}" if isinstance(index, int) and index >= 0 else ""
        )
        peak = peaks.setdefault(label, {"allocated": 0, "reserved": 0})
        for key, arg in (("allocated", "Total Allocated"), ("reserved", "Total Reserved")):
            value = args.get(arg)
            if isinstance(value, int) and value > peak[key]:
                peak[key] = value
    source = "torch [memory] events"
    if not peaks and snapshot:
        peaks = _snapshot_peaks(snapshot)
        source = "memory snapshot replay"
    sites = _allocation_sites(snapshot, limit) if snapshot else []
    if not peaks and not sites:
        return None
    ordered = sorted(peaks.items(), key=lambda kv: (kv[0].startswith("cpu"), kv[0]))  # GPUs first
    devices: dict[str, DeviceMemory] = {}
    for label, p in ordered:
        device = DeviceMemory(peak_allocated_mb=round(p["allocated"] / 2**20, 3))
        if p["reserved"] and not label.startswith(_DEVICE_NAMES[0]):  # only a caching allocator reserves
            device["peak_reserved_mb"] = round(p["reserved"] / 2**20, 3)
        devices[label] = device
    main = next(iter(devices.values()), DeviceMemory())
    main_peak = ordered[0][1] if ordered else {}
    return Memory(
        peak_allocated_mb=main.get("peak_allocated_mb"),
        peak_reserved_mb=main.get("peak_reserved_mb"),
        peak_allocated_bytes=main_peak.get("allocated"),
        devices=devices,
        peak_source=source,
        top_allocation_sites=sites,
    )


def _snapshot_peaks(snapshot: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Replay ``device_traces`` backwards from the end state the ``segments`` describe."""
    peaks: dict[str, dict[str, int]] = {}
    segments = snapshot.get("segments") or []
    for device, trace in enumerate(snapshot.get("device_traces") or []):
        allocated = sum(
            b.get("size", 0)
            for s in segments
            if s.get("device") == device
            for b in s.get("blocks", [])
            if str(b.get("state", "")).startswith("active")
        )
        reserved = sum(s.get("total_size", 0) for s in segments if s.get("device") == device)
        peak_a, peak_r = allocated, reserved
        for entry in reversed(trace):
            action, size = entry.get("action"), int(entry.get("size", 0))
            if action == "alloc":
                allocated -= size
            elif action == "free_completed":
                allocated += size
            elif action in ("segment_alloc", "segment_map"):  # map/unmap: expandable segments
                reserved -= size
            elif action in ("segment_free", "segment_unmap"):
                reserved += size
            peak_a, peak_r = max(peak_a, allocated), max(peak_r, reserved)
        peaks[f"device:{device}"] = {"allocated": peak_a, "reserved": peak_r}
    return peaks


def _site(frames: Sequence[Mapping[str, Any]]) -> str | None:
    """The innermost Python frame of an allocation, preferring the user's own code."""
    first_python = None
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if not filename.endswith(".py"):
            continue
        label = f"{frame.get('name')} ({filename}:{frame.get('line')})"
        if first_python is None:
            first_python = label
        if is_user_file(filename):
            return label
    return first_python


def _allocation_sites(snapshot: Mapping[str, Any], limit: int) -> list[AllocationSite]:
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_stack: dict[int, str] = {}  # snapshots share one frames list between identical stacks
    for trace in snapshot.get("device_traces") or []:
        for entry in trace:
            if entry.get("action") != "alloc":
                continue
            frames = entry.get("frames") or []
            site = by_stack.get(id(frames))
            if site is None:
                site = by_stack[id(frames)] = _site(frames) or "(no Python frame)"
            sites[site][0] += 1
            sites[site][1] += int(entry.get("size", 0))
    ranked = sorted(sites.items(), key=lambda kv: kv[1][1], reverse=True)[:limit]
    return [{"site": site, "allocations": n, "mb": round(size / 2**20, 3)} for site, (n, size) in ranked]
