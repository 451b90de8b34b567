"""The memory view (analysis/summary_devices.py): curve, peak, the sites live at the peak and the
step bounds, from torch's ``[memory]`` events and the window's snapshot, bounded at 100,000 events
(the real run's view: tests/integration/test_memory.py)."""

from __future__ import annotations

import orjson

from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot
from vt_lightning.analysis.summary_devices import downsample, memory_summary, memory_view, replay

MIB = 2**20
USER = "/home/me/model.py"


def _mem(ts: float, addr: int, nbytes: int, total: int) -> dict:
    return {
        "ph": "i",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "s": "t",
        "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Total Reserved": 0, "Device Type": 0},
    }


def _call(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "FEE", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_the_sites_live_at_the_peak_not_the_most_allocated_over_the_window() -> None:
    """``churn`` allocates 3 x 4 MiB over the window, one at a time; ``big_buffer`` holds 8 MiB
    at the peak: the peak's sites are big_buffer first, with churn's one live block."""
    events = [
        _call(f"churn ({USER}:3)", 0.0, 100.0),
        _mem(10.0, 0x1000, 4 * MIB, 4 * MIB),
        _mem(20.0, 0x1000, -4 * MIB, 0),
        _mem(30.0, 0x1000, 4 * MIB, 4 * MIB),
        _mem(40.0, 0x1000, -4 * MIB, 0),
        _mem(50.0, 0x1000, 4 * MIB, 4 * MIB),
        _call(f"big_buffer ({USER}:12)", 200.0, 50.0),
        _mem(210.0, 0x9000000, 8 * MIB, 12 * MIB),
        _mem(300.0, 0x9000000, -8 * MIB, 4 * MIB),
    ]
    snapshot = build_cpu_snapshot(events)
    memory = memory_summary(events, snapshot)
    assert memory is not None
    assert memory["peak_allocated_bytes"] == 12 * MIB and memory["peak_ts_us"] == 210.0
    assert memory["top_allocation_sites"][0]["site"].startswith("churn")  # 12 MiB over the window
    assert memory["top_sites_at_peak"] == [
        {"function": "big_buffer", "file": USER, "line": 12, "origin": "user", "bytes": 8 * MIB, "allocations": 1},
        {"function": "churn", "file": USER, "line": 3, "origin": "user", "bytes": 4 * MIB, "allocations": 1},
    ]
    view = memory_view(events, {"3": [0.0, 150.0], "4": [150.0, 320.0]}, memory)
    assert view is not None and view["steps"] == {"3": [0.0, 150.0], "4": [150.0, 320.0]}
    cpu = view["devices"]["cpu"]
    assert cpu["series"] == ["ts_us", "allocated"] and "peak_reserved_bytes" not in cpu
    assert cpu["points"][5] == [210.0, 12 * MIB] and cpu["peak_bytes"] == 12 * MIB
    assert cpu["top_sites_at_peak"] == memory["top_sites_at_peak"]  # the main device's, as in the summary


def test_a_cuda_snapshot_replays_forwards_from_its_end_state() -> None:
    cpp = {"filename": "c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "malloc"}
    user = {"filename": USER, "line": 7, "name": "forward"}
    snapshot = {
        "segments": [{"device": 0, "total_size": 20 * MIB, "blocks": [{"size": 4 * MIB, "state": "active_allocated"}]}],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 0, "size": 20 * MIB, "time_us": 1, "frames": [cpp]},
                {"action": "alloc", "addr": 0, "size": 10 * MIB, "time_us": 2, "frames": [cpp, user]},
                {"action": "alloc", "addr": 10 * MIB, "size": 4 * MIB, "time_us": 3, "frames": [cpp]},
                {"action": "free_completed", "addr": 0, "size": 10 * MIB, "time_us": 4, "frames": []},
            ]
        ],
    }
    samples = replay(snapshot, 0)
    assert samples == [
        (1.0, 0, 20 * MIB),
        (2.0, 10 * MIB, 20 * MIB),
        (3.0, 14 * MIB, 20 * MIB),
        (4.0, 4 * MIB, 20 * MIB),
    ]
    memory = memory_summary([], snapshot)
    assert memory is not None and memory["devices"] == {"cuda:0": {"peak_allocated_mb": 14.0, "peak_reserved_mb": 20.0}}
    assert memory["peak_ts_us"] is None  # the allocator's clock is not the trace's
    assert memory["top_sites_at_peak"][0]["function"] == "forward"  # live at the 14 MiB peak, freed later
    assert memory["top_sites_at_peak"][1] == {
        "function": "malloc",
        "file": None,
        "line": None,
        "origin": "other",
        "bytes": 4 * MIB,
        "allocations": 1,
    }


def test_the_curve_keeps_the_peak_and_every_dip_in_at_most_1200_points() -> None:
    samples = [(float(t), (t * 7919) % 1000, 0) for t in range(100_000)]
    samples[54_321] = (54_321.0, 5000, 0)
    samples[77_777] = (77_777.0, -5, 0)
    kept = downsample(samples)
    assert len(kept) <= 1200 and kept == sorted(kept)
    assert (54_321.0, 5000, 0) in kept and (77_777.0, -5, 0) in kept
    assert downsample(samples[:10]) == samples[:10]


def test_a_view_of_100000_allocation_events_is_small() -> None:
    events = []
    total = 0
    for k in range(50_000):
        events.append(_mem(2.0 * k, 0x1000 + 64 * (k % 97), 1024, total + 1024))
        events.append(_mem(2.0 * k + 1, 0x1000 + 64 * (k % 97), -1024, total))
    events.insert(0, _call(f"loop ({USER}:3)", 0.0, 200_000.0))
    view = memory_view(events, {"1": [0.0, 100_000.0]})
    assert view is not None and view["devices"]["cpu"]["events"] == 100_000
    assert len(view["devices"]["cpu"]["points"]) <= 1200
    assert len(orjson.dumps(view)) < 40_000
