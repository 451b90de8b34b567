"""Memory snapshots, the pure parts: the CPU snapshot built from a merged trace, its file, the CUDA
recorder on a fake ``torch.cuda.memory``."""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import pickletools
import random
import time
from typing import ClassVar

import pytest
import torch
from support.memory import check_memory_viz, names
from torch.cuda import _memory_viz

from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot, parse_frame
from vt_lightning.export.atomic import write_snapshot
from vt_lightning.export.layout import oom_file_name
from vt_lightning.recording.memory import CudaMemoryRecorder, MemorySnapshotError, dump_oom_snapshot, is_cuda_oom

PID, MAIN, OTHER = 100, 100, 101


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def call(name, ts, dur, tid=MAIN, cat="FEE"):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}


def mem(ts, addr, nbytes, tid=MAIN, device_type=0, device_id=-1):
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": PID,
        "tid": tid,
        "ts": ts,
        "args": {
            "Total Reserved": 0,
            "Total Allocated": 0,
            "Bytes": nbytes,
            "Device Id": device_id,
            "Device Type": device_type,
            "Addr": addr,
        },
    }


class CountedTime(float):
    """A timestamp that counts every comparison made with it: the work of a sweep, the same on every
    machine (a wall-clock limit measures the machine). A plain float compared with one is counted
    too: Python tries the subclass's reflected comparison first."""

    comparisons = 0

    def _counted(op):
        def compare(self, other):
            CountedTime.comparisons += 1
            return op(float(self), other)

        return compare

    __lt__ = _counted(float.__lt__)
    __le__ = _counted(float.__le__)
    __gt__ = _counted(float.__gt__)
    __ge__ = _counted(float.__ge__)
    __eq__ = _counted(float.__eq__)
    __ne__ = _counted(float.__ne__)
    __hash__ = float.__hash__
    del _counted


def comparisons_to_snapshot(events):
    """``build_cpu_snapshot(events)`` with counted timestamps: (snapshot, comparisons made)."""
    counted = [{**e, "ts": CountedTime(e["ts"])} for e in events]
    CountedTime.comparisons = 0
    snap = build_cpu_snapshot(counted)
    return snap, CountedTime.comparisons


def sweep_bound(events):
    """Comparisons a sort-and-sweep may make on ``events``: a few per event per level of a sort.
    A scan of every call for every [memory] event makes (calls x events) / threads, far more."""
    return 4 * len(events) * math.ceil(math.log2(len(events)))


def actions(snapshot, device=0):
    return [(e["action"], e["addr"]) for e in snapshot["device_traces"][device]]


# Opcodes that torch/utils/viz/MemoryViz.js (pytorch.org/memory_viz) knows how to unpickle.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# build_cpu_snapshot
# ---------------------------------------------------------------------------------------------


def test_no_memory_events_means_no_snapshot():
    assert build_cpu_snapshot([]) is None
    assert build_cpu_snapshot([call("f (/a.py:1)", 0, 10), {"ph": "M", "name": "thread_name"}]) is None
    # [memory] events that carry nothing usable count as none
    assert build_cpu_snapshot([mem(1, 0x1000, 0), {"ph": "i", "name": "[memory]", "args": {}}]) is None


@pytest.mark.parametrize(
    "name, frame",
    [
        ("forward (/src/model.py:12)", {"filename": "/src/model.py", "line": 12, "name": "forward"}),
        ("Linear.forward (/a b/(x)/m.py:7)", {"filename": "/a b/(x)/m.py", "line": 7, "name": "Linear.forward"}),
        ("<lambda> (/x.py:3)", {"filename": "/x.py", "line": 3, "name": "<lambda>"}),
        ("<module> (<string>:1)", {"filename": "<string>", "line": 1, "name": "<module>"}),
        ("builtins.sum", {"filename": "??", "line": 0, "name": "builtins.sum"}),
        ("aten::addmm", {"filename": "??", "line": 0, "name": "aten::addmm"}),
        ("ProfilerStep#3", {"filename": "??", "line": 0, "name": "ProfilerStep#3"}),
    ],
)
def test_frames_parse_viztracer_names(name, frame):
    assert parse_frame(name) == frame


def test_frames_are_the_enclosing_calls_innermost_first():
    events = [
        call("step (/t/train.py:10)", 0, 100),
        call("forward (/t/model.py:20)", 10, 50),
        call("builtins.sum", 20, 10),
        call("aten::add", 22, 5, cat="cpu_op"),
        call("backward (/t/model.py:40)", 70, 20),
        mem(5, 0x1000, 64),  # in step only
        mem(15, 0x2000, 128),  # in step > forward
        mem(23, 0x3000, 32),  # in step > forward > builtins.sum > aten::add
        mem(75, 0x2000, -128),  # freed in backward
        mem(150, 0x4000, 16),  # outside every call
    ]
    snap = build_cpu_snapshot(events)
    trace = snap["device_traces"][0]
    assert [(e["action"], e["addr"], e["size"]) for e in trace] == [
        ("alloc", 0x1000, 64),
        ("alloc", 0x2000, 128),
        ("alloc", 0x3000, 32),
        ("free_requested", 0x2000, 128),
        ("free_completed", 0x2000, 128),
        ("alloc", 0x4000, 16),
    ]
    assert names(trace[0]) == ["step"]
    assert trace[1]["frames"] == [
        {"filename": "/t/model.py", "line": 20, "name": "forward"},
        {"filename": "/t/train.py", "line": 10, "name": "step"},
    ]
    assert names(trace[2]) == ["aten::add", "builtins.sum", "forward", "step"]
    assert trace[2]["frames"][1] == {"filename": "??", "line": 0, "name": "builtins.sum"}
    assert names(trace[3]) == names(trace[4]) == ["backward", "step"]  # stack of the free
    assert trace[5]["frames"] == []
    assert [e["time_us"] for e in trace] == [5, 15, 23, 75, 75, 150]
    assert all(e["stream"] == 0 for e in trace)
    check_memory_viz(snap)


def test_call_boundaries_are_inclusive_and_same_start_nests_longest_outside():
    events = [
        call("outer (/a.py:1)", 10, 20),
        call("inner (/a.py:2)", 10, 5),  # same start, shorter: nested inside outer
        mem(10, 0x10, 8),  # at both starts
        mem(15, 0x20, 8),  # at inner's end
        mem(30, 0x30, 8),  # at outer's end
        mem(30.6, 0x40, 8),  # just after
    ]
    trace = build_cpu_snapshot(events)["device_traces"][0]
    assert [names(e) for e in trace] == [["inner", "outer"], ["inner", "outer"], ["outer"], []]
    assert trace[3]["time_us"] == 31


def test_calls_that_do_not_nest_are_never_reported_after_they_end():
    # Clock jitter between the tracers can make a child outlive its parent or overlap a sibling.
    events = [
        call("a (/a.py:1)", 0, 10),
        call("b (/a.py:2)", 5, 20),  # starts inside a, ends after it
        mem(8, 0x10, 8),
        mem(12, 0x20, 8),  # a has ended, b has not
        call("c (/a.py:3)", 30, 5),
        mem(31, 0x30, 8),
    ]
    trace = build_cpu_snapshot(events)["device_traces"][0]
    assert [names(e) for e in trace] == [["b", "a"], ["b"], ["c"]]


def test_siblings_that_overlap_by_jitter_do_not_pile_up():
    # Every call ends a hair after the next one starts (timeline scaling): none contains another.
    events = [call("step (/t.py:1)", 0, 1e9)]
    events += [call(f"f{i} (/a.py:{i})", i * 10.0, 10.001) for i in range(60_000)]
    events += [mem(i * 100.0 + 5, 0x1000 + i * 64, 64) for i in range(6_000)]
    snap, comparisons = comparisons_to_snapshot(events)
    # A stack of dead siblings would compare each event with every earlier call: 1.8e8 here.
    assert comparisons <= sweep_bound(events), (comparisons, sweep_bound(events))
    trace = snap["device_traces"][0]
    assert [names(e) for e in trace[:3]] == [["f0", "step"], ["f10", "step"], ["f20", "step"]]
    # an event inside the overlap sees both siblings, the later one first
    trace = build_cpu_snapshot([*events[:3], mem(10.0005, 0x10, 8)])["device_traces"][0]
    assert names(trace[0]) == ["f1", "f0", "step"]


def test_threads_only_see_their_own_calls():
    events = [
        call("main_work (/m.py:1)", 0, 100, tid=MAIN),
        call("loader_work (/l.py:1)", 0, 100, tid=OTHER),
        call("other_pid (/p.py:1)", 0, 100, tid=MAIN) | {"pid": PID + 1},
        mem(10, 0x10, 8, tid=MAIN),
        mem(10, 0x20, 16, tid=OTHER),
        mem(20, 0x10, -8, tid=OTHER),  # freed on the other thread: its stack
        mem(30, 0x30, 4, tid=999),  # a thread without Python calls
    ]
    trace = build_cpu_snapshot(events)["device_traces"][0]
    by_addr = {(e["action"], e["addr"]): names(e) for e in trace}
    assert by_addr[("alloc", 0x10)] == ["main_work"]
    assert by_addr[("alloc", 0x20)] == ["loader_work"]
    assert by_addr[("free_completed", 0x10)] == ["loader_work"]
    assert by_addr[("alloc", 0x30)] == []


def test_entries_follow_time_whatever_the_input_order():
    events = [mem(30, 0x10, -8), mem(10, 0x10, 8), mem(20, 0x20, 4), mem(20, 0x30, 4), call("f (/a.py:1)", 0, 50)]
    rng = random.Random(0)
    expected = None
    for _ in range(5):
        shuffled = events[:]
        rng.shuffle(shuffled)
        got = [(e["action"], e["addr"]) for e in build_cpu_snapshot(shuffled)["device_traces"][0]]
        assert [a for a, _ in got] == ["alloc", "alloc", "alloc", "free_requested", "free_completed"]
        assert got[0] == ("alloc", 0x10) and got[-1] == ("free_completed", 0x10)
        expected = expected or sorted(got[1:3])
        assert sorted(got[1:3]) == expected
    # Equal times keep the trace's order: a free and the reuse of its address in the same microsecond.
    same_us = [mem(10, 0x10, 8), mem(20, 0x10, -8), mem(20, 0x10, 16)]
    assert actions(build_cpu_snapshot(same_us)) == [
        ("alloc", 0x10), ("free_requested", 0x10), ("free_completed", 0x10), ("alloc", 0x10)
    ]  # fmt: skip


def test_frees_of_memory_allocated_before_the_window_do_not_break_anything():
    events = [
        call("step (/t.py:1)", 0, 100),
        mem(10, 0x5000, -4096),  # allocated before the window: no alloc event
        mem(20, 0x6000, 64),
        mem(30, 0x6000, -64),
        mem(40, 0x5000, 1024),  # the address is reused within the window
    ]
    snap = build_cpu_snapshot(events)
    assert actions(snap) == [
        ("free_requested", 0x5000),
        ("free_completed", 0x5000),
        ("alloc", 0x6000),
        ("free_requested", 0x6000),
        ("free_completed", 0x6000),
        ("alloc", 0x5000),
    ]
    assert snap["device_traces"][0][0]["size"] == 4096
    assert snap["vt_lightning"]["frees_without_alloc"] == 1
    check_memory_viz(snap)
    # Only frees: nothing live, still a valid snapshot.
    only_frees = build_cpu_snapshot([mem(1, 0x10, -8), mem(2, 0x20, -8)])
    assert [s["allocated_size"] for s in only_frees["segments"]] == [0, 0]
    check_memory_viz(only_frees)


def test_an_alloc_at_a_live_address_closes_the_lost_free():
    snap = build_cpu_snapshot([mem(1, 0x10, 8), mem(2, 0x10, 32), mem(3, 0x10, -32)])
    assert actions(snap) == [
        ("alloc", 0x10), ("free_requested", 0x10), ("free_completed", 0x10),
        ("alloc", 0x10), ("free_requested", 0x10), ("free_completed", 0x10),
    ]  # fmt: skip
    assert [e["size"] for e in snap["device_traces"][0]] == [8, 8, 8, 32, 32, 32]
    assert snap["vt_lightning"]["allocs_without_free"] == 1
    check_memory_viz(snap)


def test_segments_hold_the_allocations_live_at_the_end():
    events = [
        call("keep (/k.py:5)", 0, 10),
        mem(1, 0x1000, 0x100),  # live at end
        mem(2, 0x1100, 0x100),  # touches the first: same segment, freed
        mem(4, 0x9000, 0x40),  # its own segment, live at end
        mem(5, 0x1100, -0x100),
    ]
    snap = build_cpu_snapshot(events)
    segs = sorted(snap["segments"], key=lambda s: s["address"])
    assert [(s["address"], s["total_size"], s["allocated_size"]) for s in segs] == [
        (0x1000, 0x200, 0x100),
        (0x9000, 0x40, 0x40),
    ]
    first = segs[0]["blocks"]
    assert [(b["address"], b["size"], b["state"]) for b in first] == [
        (0x1000, 0x100, "active_allocated"),
        (0x1100, 0x100, "inactive"),
    ]
    assert first[0]["requested_size"] == 0x100 and names(first[0]) == ["keep"]
    for seg in segs:
        assert seg["device"] == 0 and seg["stream"] == 0
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    stats = check_memory_viz(snap)
    assert "total_allocated: 320.0B" in stats


def test_devices_get_one_trace_each_cpu_last():
    events = [mem(1, 0x10, 8), mem(2, 0x7000, 512, device_type=1, device_id=0), mem(3, 0x10, -8)]
    snap = build_cpu_snapshot(events)
    assert snap["vt_lightning"]["devices"] == ["cuda:0", "cpu"]
    assert actions(snap, 0) == [("alloc", 0x7000)]
    assert [a for a, _ in actions(snap, 1)] == ["alloc", "free_requested", "free_completed"]
    assert {s["device"] for s in snap["segments"]} == {0, 1}
    check_memory_viz(snap)


def test_frames_are_shared_so_the_pickle_stays_small():
    events = [call("f (/a.py:1)", 0, 100)] + [mem(1 + i, 0x1000 + 64 * i, 64) for i in range(50)]
    trace = build_cpu_snapshot(events)["device_traces"][0]
    assert all(e["frames"] is trace[0]["frames"] for e in trace)


def test_large_windows_are_handled_in_a_sweep():
    # 2e4 Python calls and 2e3 [memory] events, shuffled, on two threads: a scan of the calls for each
    # event would make 2e7 comparisons, a sort and a sweep about 1e6.
    rng = random.Random(1)
    events = []
    for tid in (MAIN, OTHER):
        for i in range(5_000):
            ts = i * 20.0
            events.append(call(f"outer{i % 97} (/a/m{i % 5}.py:{i % 40})", ts, 18.0, tid=tid))
            events.append(call("builtins.len", ts + 2.0, 5.0, tid=tid))
    live = []
    for i in range(2_000):
        tid = (MAIN, OTHER)[i % 2]
        ts = i * 50.0 + 3.0
        if live and i % 3 == 0:
            addr, size = live.pop(rng.randrange(len(live)))
            events.append(mem(ts, addr, -size, tid=tid))
        else:
            addr, size = 0x10000 + i * 0x1000, 64 * (1 + i % 30)
            live.append((addr, size))
            events.append(mem(ts, addr, size, tid=tid))
    rng.shuffle(events)
    snap, comparisons = comparisons_to_snapshot(events)
    assert comparisons <= sweep_bound(events), (comparisons, sweep_bound(events))
    trace = snap["device_traces"][0]
    assert len(trace) == 2_000 + sum(1 for e in trace if e["action"] == "free_completed")
    for entry in trace[:100]:
        k, r = divmod(entry["time_us"], 20)  # call k spans [20k, 20k+18], its builtins.len [20k+2, 20k+7]
        assert names(entry) == (["builtins.len"] if 2 <= r <= 7 else []) + [f"outer{k % 97}"]
    _memory_viz.segsum(snap)


# ---------------------------------------------------------------------------------------------
# write_snapshot and the file format
# ---------------------------------------------------------------------------------------------


def test_write_snapshot_is_protocol_4_and_uses_only_opcodes_the_web_viewer_reads(tmp_path):
    snap = build_cpu_snapshot(
        [call("f (/a.py:1)", 0, 100), mem(1, 0x7F00_0000_1000, 70_000), mem(2, 0x10, 8), mem(3, 0x10, -8)]
    )
    path = tmp_path / "w.memory_snapshot.pickle"
    write_snapshot(path, snap)
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04"
    used = {op.name for op, _, _ in pickletools.genops(io.BytesIO(data))}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES
    assert pickle.loads(data) == snap
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left behind


def test_write_snapshot_leaves_nothing_when_pickling_fails(tmp_path):
    path = tmp_path / "bad.memory_snapshot.pickle"
    with pytest.raises(Exception):
        write_snapshot(path, {"segments": [], "device_traces": [], "oops": lambda: None})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# CudaMemoryRecorder and the out-of-memory snapshot, with fakes
# ---------------------------------------------------------------------------------------------


class FakeCudaMemory:
    def __init__(self, monkeypatch, fail_start=False, fail_disable=False, fail_snapshot=False, clear=True):
        self.calls = []
        self.fail_start, self.fail_disable, self.fail_snapshot = fail_start, fail_disable, fail_snapshot
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self.record)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", self.snapshot)
        if clear:
            monkeypatch.setattr(torch.cuda.memory, "_record_memory_history_impl", self.impl_new)
        else:
            monkeypatch.setattr(torch.cuda.memory, "_record_memory_history_impl", self.impl_old)

    @staticmethod
    def impl_new(enabled="all", context="all", stacks="all", max_entries=0, device=None, clear_history=False):
        pass

    @staticmethod
    def impl_old(enabled="all", context="all", stacks="all", max_entries=0, device=None):
        pass

    def record(self, enabled="all", **kwargs):
        self.calls.append(("record", enabled, kwargs))
        if enabled is None and self.fail_disable:
            raise RuntimeError("disable failed")
        if enabled is not None and self.fail_start:
            raise RuntimeError("CUDA error: no kernel image")

    def snapshot(self):
        self.calls.append(("snapshot",))
        if self.fail_snapshot:
            raise RuntimeError("snapshot failed")
        return {"segments": [], "device_traces": [[]], "fake": True}


def test_recorder_starts_snapshots_and_stops_in_order(monkeypatch):
    fake = FakeCudaMemory(monkeypatch)
    rec = CudaMemoryRecorder(max_entries=1234)
    rec.start()
    assert rec.recording
    snap = rec.snapshot()
    rec.stop()
    assert snap["fake"] is True
    assert fake.calls == [
        ("record", "all", {"context": "all", "stacks": "all", "max_entries": 1234, "clear_history": True}),
        ("snapshot",),
        ("record", None, {}),
    ]
    assert not rec.recording
    rec.stop()  # a second stop does nothing
    assert len(fake.calls) == 3
    rec.start()  # and the recorder can serve the next window
    rec.start()  # starting twice records once
    assert [c[1] for c in fake.calls if c[0] == "record"] == ["all", None, "all"]


def test_recorder_does_not_pass_clear_history_to_torch_without_it(monkeypatch):
    fake = FakeCudaMemory(monkeypatch, clear=False)
    CudaMemoryRecorder(10).start()
    assert fake.calls == [("record", "all", {"context": "all", "stacks": "all", "max_entries": 10})]


def test_stop_or_snapshot_without_start(monkeypatch):
    fake = FakeCudaMemory(monkeypatch)
    rec = CudaMemoryRecorder(10)
    rec.stop()
    with pytest.raises(MemorySnapshotError, match="not recorded"):
        rec.snapshot()
    assert fake.calls == []


def test_a_failed_start_leaves_recording_off_and_says_why(monkeypatch):
    fake = FakeCudaMemory(monkeypatch, fail_start=True)
    rec = CudaMemoryRecorder(10)
    with pytest.raises(MemorySnapshotError, match=r"could not start CUDA memory history.*no kernel image"):
        rec.start()
    assert not rec.recording
    assert [c[1] for c in fake.calls] == ["all", None]  # it tried, then made sure it is off
    rec.stop()
    assert len(fake.calls) == 2
    # Even when turning it off fails too, the start error is the one reported.
    fake2 = FakeCudaMemory(monkeypatch, fail_start=True, fail_disable=True)
    with pytest.raises(MemorySnapshotError, match="no kernel image") as info:
        CudaMemoryRecorder(10).start()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert [c[1] for c in fake2.calls] == ["all", None]


def test_snapshot_and_stop_failures_are_reported(monkeypatch):
    fake = FakeCudaMemory(monkeypatch, fail_snapshot=True, fail_disable=True)
    rec = CudaMemoryRecorder(10)
    rec.start()
    with pytest.raises(MemorySnapshotError, match="could not take the CUDA memory snapshot: snapshot failed"):
        rec.snapshot()
    assert rec.recording  # still recording: the window's stop() must still turn it off
    with pytest.raises(MemorySnapshotError, match="could not stop CUDA memory history: disable failed"):
        rec.stop()
    assert not rec.recording
    rec.stop()  # nothing more to do
    assert [c[0] for c in fake.calls] == ["record", "snapshot", "record"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10", None])
def test_recorder_needs_a_positive_int(bad):
    with pytest.raises(ValueError, match="max_entries"):
        CudaMemoryRecorder(bad)


class _FakeTracer:
    """Stands in for both tracers of a ProfilingWindow; logs what the window asks of it."""

    new_thread_names: ClassVar[dict] = {}  # PythonTracer: threads started (and maybe ended) in the window

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getattr__(self, method):
        if method.startswith("__"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.log.append(f"{self.name}.{method}")

    def clock_us(self):
        return time.perf_counter() * 1e6

    @staticmethod
    def make_range(name):
        return contextlib.nullcontext()

    def base_time_ns(self):
        return 0


def _window(log, recorder):
    from vt_lightning.analysis.schedule import Window
    from vt_lightning.recording.window import ProfilingWindow

    return ProfilingWindow(
        Window(index=0, warmup_start=0, active_start=1, end=3),
        _FakeTracer(log, "python"),
        _FakeTracer(log, "torch"),
        memory_recorder=recorder,
    )


def test_recorder_in_a_profiling_window(monkeypatch, tmp_path):
    """The window starts it after torch, snapshots it before stopping it, and stops it on abort."""
    fake = FakeCudaMemory(monkeypatch)
    log = fake.calls
    from vt_lightning.export.job import Destination

    window = _window(log, CudaMemoryRecorder(5))
    window.step_begin(1)
    window.step_end(1)
    destination = Destination(tmp_path / "run", "t.pt.trace.json.gz", {}, 1, "m.memory_snapshot.pickle")
    closed = window.close(str(tmp_path), destination)
    assert closed is not None and closed.job.memory_snapshot["fake"] is True
    sequence = [c if isinstance(c, str) else c[0] if c[0] == "snapshot" else f"record({c[1]})" for c in log]
    assert sequence.index("torch.start") < sequence.index("record(all)") < sequence.index("python.start")
    assert sequence.index("python.stop") < sequence.index("snapshot") < sequence.index("record(None)")
    assert sequence.index("record(None)") < sequence.index("torch.stop")
    assert sequence.count("record(None)") == 1
    window.abort()  # after close: the recorder is already off
    assert [c for c in log if not isinstance(c, str) and c[0] == "record"][-1][1] is None
    assert sum(1 for c in log if not isinstance(c, str) and c[:2] == ("record", None)) == 1


def test_a_recorder_that_cannot_start_leaves_nothing_recording(monkeypatch):
    fake = FakeCudaMemory(monkeypatch, fail_start=True)
    problems = []
    window = _window(fake.calls, CudaMemoryRecorder(5))
    window.on_problem = lambda key, message: problems.append(message)
    window.step_begin(1)  # the window goes on without the snapshot
    assert window.memory_recorder is None and "python.start" in fake.calls
    assert len(problems) == 1 and "memory history could not start" in problems[0]
    window.abort()
    records = [c[1] for c in fake.calls if not isinstance(c, str) and c[0] == "record"]
    assert records == ["all", None]  # the failed start, then its own clean-up; abort adds nothing


def test_oom_snapshot_is_written_under_its_own_name(monkeypatch, tmp_path):
    fake = FakeCudaMemory(monkeypatch)
    name = oom_file_name("vm_0.0000000004.memory_snapshot.pickle")
    assert name == "vm_0.0000000004.oom.memory_snapshot.pickle"
    assert oom_file_name("snap.pickle") == "snap.oom.pickle"
    rec = CudaMemoryRecorder(10)
    rec.start()
    path = dump_oom_snapshot(tmp_path / "run" / name, rec)
    assert path == tmp_path / "run" / name
    assert pickle.loads(path.read_bytes())["fake"] is True
    assert rec.recording  # the window still owns the recording and stops it itself
    # Without a recorder: the allocator's state as torch has it.
    path2 = dump_oom_snapshot(tmp_path / "plain.oom.memory_snapshot.pickle")
    assert pickle.loads(path2.read_bytes())["fake"] is True
    assert [c[0] for c in fake.calls] == ["record", "snapshot", "snapshot"]


def test_oom_snapshot_failures_are_reported(monkeypatch, tmp_path):
    FakeCudaMemory(monkeypatch, fail_snapshot=True)
    with pytest.raises(MemorySnapshotError, match="out-of-memory snapshot"):
        dump_oom_snapshot(tmp_path / "x.pickle")
    assert not (tmp_path / "x.pickle").exists()


def test_is_cuda_oom():
    assert is_cuda_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_cuda_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    try:
        try:
            raise torch.cuda.OutOfMemoryError("oom")
        except Exception as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert is_cuda_oom(outer)
    assert not is_cuda_oom(RuntimeError("shape mismatch"))
    assert not is_cuda_oom(None)
