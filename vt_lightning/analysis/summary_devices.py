"""The device parts of a window's summary: GPU busy time and idle gaps, memory peaks and
allocation sites. Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Container, Mapping, Sequence
from typing import Any

from vt_lightning.analysis.schema import AllocationSite, DeviceMemory, Gpu, IdleGap, LiveSite, Memory
from vt_lightning.analysis.spans import Span, clip, difference, ms, span_of, union
from vt_lightning.analysis.trace import Calls
from vt_lightning.analysis.usercode import function_origin, is_user_file

KERNEL_CATEGORIES = frozenset({"kernel"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
TOP_GAPS = 5
TOP_SITES = 10


def gpu_summary(
    events: Sequence[Mapping[str, Any]], window: Span, calls: Calls, command: Container[str] = (), limit: int = TOP_GAPS
) -> Gpu | None:
    """Busy % over the window and the largest idle gaps, each with the training thread's call in it
    (``command``: the window's ``python -c`` functions, ``usercode.function_origin``)."""
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
        "idle_gaps": [_gap(gap, ordered, command) for gap in gaps[:limit]],
    }


def _gap(gap: Span, calls: Sequence[tuple[float, float, str]], command: Container[str]) -> IdleGap:
    mid = (gap[0] + gap[1]) / 2
    innermost = None
    user = None
    for start, end, name in calls:  # outer first (``nest.outer_first``): the last cover is innermost
        if start > mid:
            break
        if end > mid:
            innermost = name
            if function_origin(name, command)[0] == "user":
                user = name
    return {
        "start_us": round(gap[0], 3),
        "ms": ms(gap[1] - gap[0]),
        "python": innermost,
        "user_python": user,
    }


_DEVICE_NAMES = {0: "cpu", 1: "cuda"}
MAX_BUCKETS = 600  # a curve keeps each time bucket's lowest and highest sample: <= 1,200 points
EVENTS_SOURCE = "torch [memory] events"
Sample = tuple[float, int, int]  # time (µs), allocated bytes, reserved bytes


def _device_label(args: Mapping[str, Any]) -> str:
    kind, index = args.get("Device Type", 0), args.get("Device Id", -1)
    name = _DEVICE_NAMES.get(kind, f"device_type_{kind}")
    return name + (f":{index}" if isinstance(index, int) and index >= 0 else "")


def memory_samples(events: Sequence[Mapping[str, Any]]) -> dict[str, list[Sample]]:
    """Per device, torch's ``[memory]`` totals in time order (ts on the trace's timeline)."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for event in events:
        args = event.get("args") or {}
        allocated, ts = args.get("Total Allocated"), event.get("ts")
        if event.get("ph") == "i" and event.get("name") == "[memory]" and isinstance(allocated, int):
            reserved = args.get("Total Reserved")
            out[_device_label(args)].append((float(ts or 0.0), allocated, reserved if isinstance(reserved, int) else 0))
    for samples in out.values():
        samples.sort(key=lambda s: s[0])
    return dict(out)


def downsample(samples: Sequence[Sample], buckets: int = MAX_BUCKETS) -> list[Sample]:
    """At most ``2 * buckets`` samples: each time bucket's lowest and highest, so the peak and dips survive."""
    if len(samples) <= 2 * buckets:
        return list(samples)
    t0 = samples[0][0]
    width = (samples[-1][0] - t0) / buckets or 1.0
    out: list[Sample] = []
    lo = hi = samples[0]
    current = 0
    for sample in samples[1:]:
        bucket = min(int((sample[0] - t0) / width), buckets - 1)
        if bucket != current:
            out += [lo] if lo is hi else sorted((lo, hi))
            lo = hi = sample
            current = bucket
        elif sample[1] < lo[1]:
            lo = sample
        elif sample[1] > hi[1]:
            hi = sample
    out += [lo] if lo is hi else sorted((lo, hi))
    return out


def _snapshot_labels(snapshot: Mapping[str, Any]) -> list[str]:
    traces = snapshot.get("device_traces") or []
    labels = (snapshot.get("vt_lightning") or {}).get("devices") or []  # a CPU snapshot's (memory_snapshot.py)
    return [labels[d] if d < len(labels) else f"cuda:{d}" for d in range(len(traces))]


def replay(snapshot: Mapping[str, Any], device: int) -> list[Sample]:
    """The allocated and reserved bytes after each entry of ``device``'s allocator trace, replayed forwards
    from the state its end implies."""
    trace = (snapshot.get("device_traces") or [])[device]
    segments = [s for s in snapshot.get("segments") or [] if s.get("device") == device]
    allocated = sum(
        b.get("size", 0) for s in segments for b in s.get("blocks", []) if str(b.get("state", "")).startswith("active")
    )
    reserved = sum(s.get("total_size", 0) for s in segments)
    signs = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1), "segment_map": (0, 1)}
    signs |= {"segment_free": (0, -1), "segment_unmap": (0, -1)}  # map/unmap: expandable segments
    steps = [(signs.get(e.get("action"), (0, 0)), int(e.get("size", 0)), float(e.get("time_us", 0))) for e in trace]
    allocated -= sum(a * size for (a, _), size, _ in steps)  # back to the state before the first entry
    reserved -= sum(r * size for (_, r), size, _ in steps)
    samples: list[Sample] = []
    for (a, r), size, time_us in steps:
        allocated, reserved = allocated + a * size, reserved + r * size
        samples.append((time_us, allocated, reserved))
    return samples


def live_at(trace: Sequence[Mapping[str, Any]], entries: int) -> list[Mapping[str, Any]]:
    """The allocations live after the first ``entries`` entries of an allocator trace."""
    live: dict[Any, Mapping[str, Any]] = {}
    for entry in trace[:entries]:
        if entry.get("action") == "alloc":
            live[entry.get("addr")] = entry
        elif entry.get("action") == "free_completed":
            live.pop(entry.get("addr"), None)
    return list(live.values())


def memory_summary(
    events: Sequence[Mapping[str, Any]], snapshot: Mapping[str, Any] | None, limit: int = TOP_SITES
) -> Memory | None:
    """Peaks per device (``[memory]`` events, else the snapshot), the top allocation sites, and those live
    at the main device's peak (found in the snapshot's own replay: CUDA's times are the allocator's)."""
    curves = memory_samples(events)
    source = EVENTS_SOURCE
    labels = _snapshot_labels(snapshot) if snapshot else []
    if not curves and snapshot:
        curves = {label: samples for d, label in enumerate(labels) if (samples := replay(snapshot, d))}
        source = "memory snapshot replay"
    sites = _allocation_sites(snapshot, limit) if snapshot else []
    if not curves and not sites:
        return None
    ordered = sorted(curves, key=lambda label: (label.startswith("cpu"), label))  # GPUs first
    devices: dict[str, DeviceMemory] = {}
    peaks = {label: max(curves[label], key=lambda s: s[1]) for label in ordered}
    for label in ordered:
        device = DeviceMemory(peak_allocated_mb=round(peaks[label][1] / 2**20, 3))
        reserved = max(s[2] for s in curves[label])
        if reserved and not label.startswith(_DEVICE_NAMES[0]):  # only a caching allocator reserves
            device["peak_reserved_mb"] = round(reserved / 2**20, 3)
        devices[label] = device
    main = next(iter(devices.values()), DeviceMemory())
    memory = Memory(
        peak_allocated_mb=main.get("peak_allocated_mb"),
        peak_reserved_mb=main.get("peak_reserved_mb"),
        peak_allocated_bytes=peaks[ordered[0]][1] if ordered else None,
        devices=devices,
        peak_source=source,
        top_allocation_sites=sites,
        peak_ts_us=round(peaks[ordered[0]][0], 3) if ordered and source == EVENTS_SOURCE else None,
    )
    if snapshot and ordered and ordered[0] in labels:
        d = labels.index(ordered[0])
        trace = snapshot["device_traces"][d]
        if (snapshot.get("vt_lightning") or {}).get("time") and source == EVENTS_SOURCE:  # ours: the trace's clock
            entries = bisect_right([float(e.get("time_us", 0)) for e in trace], round(peaks[ordered[0]][0]))
        else:
            samples = replay(snapshot, d)
            entries = max(range(len(samples)), key=lambda i: samples[i][1], default=-1) + 1
        memory["top_sites_at_peak"] = live_sites(live_at(trace, entries), limit)
    return memory


def memory_view(
    events: Sequence[Mapping[str, Any]], steps: Mapping[str, list[float]], memory: Memory | None = None
) -> dict[str, Any] | None:
    """The memory view side file (docs/files.md); None without ``[memory]`` events."""
    devices: dict[str, Any] = {}
    for label, samples in memory_samples(events).items():
        peak = max(samples, key=lambda s: s[1])
        cpu = label.startswith(_DEVICE_NAMES[0])
        device: dict[str, Any] = {"events": len(samples), "peak_bytes": peak[1], "peak_ts_us": round(peak[0], 3)}
        if not cpu:
            device["peak_reserved_bytes"] = max(s[2] for s in samples)
        device["series"] = ["ts_us", "allocated"] + ([] if cpu else ["reserved"])
        device["points"] = [[round(s[0], 3), s[1]] + ([] if cpu else [s[2]]) for s in downsample(samples)]
        if memory and "top_sites_at_peak" in memory and label == next(iter(memory["devices"]), None):
            device["top_sites_at_peak"] = memory["top_sites_at_peak"]
        devices[label] = device
    return {"schema": 1, "steps": dict(steps), "devices": devices} if devices else None


def live_sites(entries: Sequence[Mapping[str, Any]], limit: int = TOP_SITES) -> list[LiveSite]:
    """Live allocations grouped by site: the innermost user frame, else Python frame, else op."""
    sites: dict[tuple[str, str | None, int | None, str], list[int]] = defaultdict(lambda: [0, 0])
    by_stack: dict[int, tuple[str, str | None, int | None, str]] = {}
    for entry in entries:
        frames = entry.get("frames") or []
        key = by_stack.get(id(frames))
        if key is None:
            key = by_stack[id(frames)] = _live_site(frames)
        sites[key][0] += int(entry.get("size", 0))
        sites[key][1] += 1
    ranked = sorted(sites.items(), key=lambda kv: kv[1][0], reverse=True)[:limit]
    return [
        {"function": f, "file": file, "line": line, "origin": origin, "bytes": size, "allocations": n}
        for (f, file, line, origin), (size, n) in ranked
    ]


def _live_site(frames: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, int | None, str]:
    first_python = None
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if filename.endswith(".py"):
            found = (str(frame.get("name")), filename, frame.get("line"))
            if is_user_file(filename):
                return (*found, "user")
            first_python = first_python or found
    if first_python is not None:
        return (*first_python, "other")
    return (str(frames[0].get("name")) if frames else "(no frame)", None, None, "other")


def _allocation_sites(snapshot: Mapping[str, Any], limit: int) -> list[AllocationSite]:
    """Every allocation of the window by site (not only those live at the peak), most bytes first."""
    allocs = [e for trace in snapshot.get("device_traces") or [] for e in trace if e.get("action") == "alloc"]
    return [
        {
            "site": f"{site['function']} ({site['file']}:{site['line']})" if site["file"] else "(no Python frame)",
            "allocations": site["allocations"],
            "mb": round(site["bytes"] / 2**20, 3),
        }
        for site in live_sites(allocs, limit)
    ]
