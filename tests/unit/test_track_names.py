"""Track names by rank and role (analysis/track_names.py) on a hand-made window: kineto's names,
Python's, duplicate thread names, a thread with none, global instants."""

from __future__ import annotations

from typing import Any

from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.analysis.track_names import name_tracks, thread_role


def _m(kind: str, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _x(pid: Any, tid: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": 1.0, "dur": 1.0}


def test_every_process_and_thread_is_named_by_rank_and_role_and_no_instant_is_global() -> None:
    events = [
        _m("process_name", 500, 0, name="python"),
        _m("process_labels", 500, 0, labels="CPU"),
        _m("process_sort_index", 500, 0, sort_index=500),
        _m("thread_sort_index", 500, 500, sort_index=500),
        _m("thread_name", 500, 500, name="MainThread"),
        _m("thread_name", 500, 510, name="pt_autograd_0"),
        _m("thread_name", 500, 511, name="pt_gloo_runloop"),
        _m("thread_name", 500, 512, name="Thread-3 (_pin_memory_loop)"),
        _m("thread_name", 500, 9_000_500, name="MainThread · torch ranges"),
        _m("process_name", 0, 0, name="GPU 0"),
        _m("process_name", 600, 0, name="rank 2 · DataLoader worker 0"),
        _m("thread_name", 600, 600, name="MainThread"),
        *(_x(500, tid) for tid in (500, 510, 513)),
        _x(600, 600),
        _x("Spans", "PyTorch Profiler"),
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "T", "ts": 0.0},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 9.0},
    ]
    trace = WindowTrace.of({"vt_lightning": {"pid": 500, "global_rank": 2}, "traceEvents": events})
    name_tracks(trace, 2)
    out = trace.as_dict()["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in out if e.get("name") == "process_name"}
    assert processes == {500: "rank 2 · main process", 0: "rank 2 · GPU 0", 600: "rank 2 · DataLoader worker 0"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in out if e.get("name") == "thread_name"}
    assert threads == {
        (500, 500): "main thread",
        (500, 510): "torch autograd",
        (500, 511): "gloo",
        (500, 512): "DataLoader pin memory",
        (500, 9_000_500): "main thread · torch ranges",
        (500, 513): "thread 513",  # no name recorded: named by its tid, never left blank
        (600, 600): "main thread",
    }
    assert not [e for e in out if e.get("name") == "process_labels"]
    sorts = [(e["pid"], e["args"]["sort_index"]) for e in out if e.get("name") == "process_sort_index"]
    assert sorts == [(500, 2001), (500, 2001)]  # the rank's main process first (workers keep theirs)
    first = {(e["pid"], e["tid"]) for e in out if e.get("name") == "thread_sort_index" and e["args"]["sort_index"] == 1}
    assert first == {(500, 500), (600, 600)}
    instants = [e for e in out if e.get("ph") == "i"]
    assert {(e["s"], e["pid"], e["tid"]) for e in instants} == {("p", "Spans", "PyTorch Profiler")}


def test_thread_roles() -> None:
    assert thread_role("MainThread") == "main thread"
    assert thread_role("MainThread · torch ranges 2") == "main thread · torch ranges 2"
    assert thread_role("QueueFeederThread") == "DataLoader queue feeder"
    assert thread_role("my_logger_thread") == "my_logger_thread"
