"""What the memory snapshot's tests of both tiers check: the frames of an entry, and a snapshot read
as ``python -m torch.cuda._memory_viz`` and its web page read it."""

from __future__ import annotations

from torch.cuda import _memory_viz


def names(entry):
    return [f["name"] for f in entry["frames"]]


def check_memory_viz(snapshot):
    """What ``python -m torch.cuda._memory_viz stats|trace`` does, in process; plus the page's rules."""
    stats = _memory_viz.segsum(snapshot)  # asserts that blocks tile segments and totals add up
    _memory_viz.trace(snapshot)
    html = _memory_viz.trace_plot(snapshot)
    assert "snapshot.pickle" in html
    for trace in snapshot["device_traces"]:
        for i, entry in enumerate(trace):
            assert {"action", "addr", "size", "stream", "time_us", "frames"} <= entry.keys()
            assert "category" not in entry  # the web page crashes on categories without "unknown"
            for frame in entry["frames"]:
                assert isinstance(frame["filename"], str) and isinstance(frame["name"], str)
                assert isinstance(frame["line"], int)
            # a free is free_requested immediately followed by free_completed (the page folds them)
            if entry["action"] == "free_requested":
                assert trace[i + 1]["action"] == "free_completed" and trace[i + 1]["addr"] == entry["addr"]
            if entry["action"] == "free_completed":
                assert trace[i - 1]["action"] == "free_requested"
    # Every block the page's "Allocator State History" replays must lie inside a segment.
    for device, trace in enumerate(snapshot["device_traces"]):
        segs = sorted(
            (s["address"], s["address"] + s["total_size"]) for s in snapshot["segments"] if s["device"] == device
        )
        for entry in trace:
            if entry["action"] in ("alloc", "free_completed"):
                lo, hi = entry["addr"], entry["addr"] + entry["size"]
                assert any(a <= lo and hi <= b for a, b in segs), entry
    return stats
