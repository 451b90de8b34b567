"""PythonTracer (VizTracer behind start/stop windows) with no torch: runs on Python 3.10-3.13.

tests/conftest.py imports torch, so where torch is missing run this file alone:
``python -m pytest --noconftest tests/integration/test_pytracer.py``. Timing is measured elsewhere
(no timing assertions here); these tests check that no hook is left, which is what makes idle time
free.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from vt_lightning.recording import children
from vt_lightning.recording.children import wait_for_dump
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig, foreign_profiler

MONITORING = sys.version_info >= (3, 12)


def hooks() -> dict[str, Any]:
    """Every place a profiler can hook this thread (and threads started from now on)."""
    state: dict[str, Any] = {"sys.getprofile": sys.getprofile(), "threading.getprofile": threading.getprofile()}
    if MONITORING:
        state["monitoring tool 2"] = sys.monitoring.get_tool(sys.monitoring.PROFILER_ID)
        state["monitoring events 2"] = sys.monitoring.get_events(sys.monitoring.PROFILER_ID)
    return state


NO_HOOKS = {"sys.getprofile": None, "threading.getprofile": None}
if MONITORING:
    NO_HOOKS |= {"monitoring tool 2": None, "monitoring events 2": 0}


def _unhook_everything() -> None:
    sys.setprofile(None)
    threading.setprofile(None)
    if MONITORING and sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is not None:
        sys.monitoring.set_events(sys.monitoring.PROFILER_ID, 0)
        sys.monitoring.free_tool_id(sys.monitoring.PROFILER_ID)


@pytest.fixture(autouse=True)
def clean_hooks():
    # A VizTracer object resets threading.setprofile when it is deallocated: collect the ones earlier
    # tests made now, not in the middle of this test's window.
    gc.collect()
    assert hooks() == NO_HOOKS, "a hook was installed before the test"
    yield
    leftover = hooks()
    _unhook_everything()
    assert leftover == NO_HOOKS, "the test left a hook behind"


@pytest.fixture
def tracer():
    t = PythonTracer(PythonTracerConfig(tracer_entries=200_000))
    yield t
    t.stop()
    t.discard()


def named(name: str):
    """A fresh function called ``name``, so a trace tells which window ran it."""

    def template(n: int) -> int:
        return sum(range(n))

    renames = {"co_name": name, "co_qualname": name} if sys.version_info >= (3, 11) else {"co_name": name}
    code = template.__code__.replace(**renames)
    return types.FunctionType(code, template.__globals__, name)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def calls(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e.get("ph") == "X"]


def thread_names(data: dict[str, Any]) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in data["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


def test_no_hook_before_first_window_and_after_each(tracer, tmp_path):
    work = named("work")
    tracer.clock_us()  # builds the VizTracer, as the first window does before start()
    assert hooks() == NO_HOOKS
    for i in range(3):
        tracer.start()
        assert tracer.running
        if MONITORING:
            assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) == "viztracer"
        else:
            assert sys.getprofile() is not None
        work(10)
        tracer.stop()
        assert not tracer.running
        assert hooks() == NO_HOOKS, f"hook left after window {i}"
        wait_for_dump(tracer.dump(str(tmp_path / f"{i}.json")))
        assert hooks() == NO_HOOKS


def test_plain_viztracer_hooks_at_construction_only_up_to_311():
    """The pitfall PythonTracer avoids: a merely constructed VizTracer on <= 3.11 is already hooked."""
    from viztracer import VizTracer
    from viztracer.snaptrace import Tracer

    plain = VizTracer(verbose=0, register_global=False)
    try:
        if MONITORING:
            assert hooks() == NO_HOOKS
        else:
            assert sys.getprofile() is not None and threading.getprofile() == plain.threadtracefunc
    finally:
        if not MONITORING:
            Tracer.stop(plain, None)
        threading.setprofile(None)


def test_window_records_main_thread_and_thread_started_in_window(tracer, tmp_path):
    on_main, on_thread = named("on_main_thread"), named("on_window_thread")
    tracer.start()
    on_main(10)
    worker = threading.Thread(target=on_thread, args=(10,), name="window-worker")
    worker.start()
    worker.join()
    tracer.stop()
    wait_for_dump(tracer.dump(str(tmp_path / "w.json")))

    data = load(tmp_path / "w.json")
    assert list(data)[:2] == ["traceEvents", "viztracer_metadata"]
    assert data["viztracer_metadata"]["overflow"] is False
    by_name = {e["name"].split(" ")[0]: e for e in calls(data)}
    assert by_name["on_main_thread"]["tid"] == threading.main_thread().native_id
    assert by_name["on_window_thread"]["tid"] == worker.native_id
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in calls(data))
    names = thread_names(data)
    assert names[threading.main_thread().native_id] == "MainThread"
    assert worker.native_id in names


@pytest.mark.xfail(
    MONITORING,
    strict=True,
    reason=(
        "VizTracer 1.1.1 on 3.12+ (sys.monitoring) reads the name at the thread's first event, inside "
        "threading's _bootstrap before the thread is registered, so it records 'Dummy-N'"
    ),
)
def test_thread_started_in_window_keeps_its_name(tracer, tmp_path):
    tracer.start()
    worker = threading.Thread(target=named("on_window_thread"), args=(10,), name="window-worker")
    worker.start()
    worker.join()
    tracer.stop()
    wait_for_dump(tracer.dump(str(tmp_path / "w.json")))
    assert thread_names(load(tmp_path / "w.json"))[worker.native_id] == "window-worker"


def test_thread_started_in_window_has_its_name_noted_even_after_it_ended(tracer):
    tracer.start()
    worker = threading.Thread(target=named("on_window_thread"), args=(10,), name="short-lived")
    worker.start()
    worker.join()
    tracer.stop()
    assert tracer.new_thread_names[worker.native_id] == "short-lived"


def test_threads_alive_before_the_window_are_traced_during_it_and_unhooked_after(tracer, tmp_path):
    """A persistent pool's worker and a thread idle through the whole window: both end unhooked."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="persistent-pool")
    pool.submit(named("before_window"), 10).result()  # the worker thread exists before the window
    release_idle, idle_seen = threading.Event(), {}

    def idle_through_window():
        release_idle.wait(10)
        idle_seen["after"] = sys.getprofile()

    idle = threading.Thread(target=idle_through_window, name="idle")
    idle.start()
    try:
        tracer.start()
        pool.submit(named("pool_task_in_window"), 10).result()
        during = pool.submit(sys.getprofile).result()
        assert tracer.hooks_installed()
        tracer.stop()
        assert not tracer.hooks_installed()
        after = pool.submit(sys.getprofile).result()
        pool.submit(named("pool_task_after_window"), 10).result()
        release_idle.set()
        idle.join()
    finally:
        pool.shutdown()
        release_idle.set()
    if not MONITORING:
        assert during is not None
    assert after is None and idle_seen["after"] is None
    wait_for_dump(tracer.dump(str(tmp_path / "w.json")))
    data = load(tmp_path / "w.json")
    by_name = {e["name"].split(" ")[0]: e for e in calls(data)}
    assert "pool_task_in_window" in by_name and "pool_task_after_window" not in by_name
    assert "before_window" not in by_name
    assert by_name["pool_task_in_window"]["tid"] != threading.main_thread().native_id
    assert thread_names(data)[by_name["pool_task_in_window"]["tid"]].startswith("persistent-pool")


def test_thread_outliving_the_window_loses_the_hook(tracer, tmp_path):
    """On <= 3.11 the thread got VizTracer's C hook; stop() must take it off that thread too."""
    started, window_closed, seen = threading.Event(), threading.Event(), {}

    def long_lived():
        named("in_window")(10)
        seen["during"] = sys.getprofile()
        started.set()
        window_closed.wait(10)
        seen["after"] = sys.getprofile()
        named("after_window")(10)

    tracer.start()
    worker = threading.Thread(target=long_lived, name="long-lived")
    worker.start()
    assert started.wait(10)
    tracer.stop()
    window_closed.set()
    worker.join()
    if not MONITORING:
        assert seen["during"] is not None
    assert seen["after"] is None
    wait_for_dump(tracer.dump(str(tmp_path / "w.json")))
    names = {e["name"].split(" ")[0] for e in calls(load(tmp_path / "w.json"))}
    assert "in_window" in names and "after_window" not in names


def test_thread_started_in_window_but_running_after_it_is_not_hooked(tracer):
    go, seen = threading.Event(), {}

    def late():
        go.wait(10)
        seen["hook"] = sys.getprofile()

    tracer.start()
    worker = threading.Thread(target=late)
    worker.start()
    tracer.stop()
    go.set()
    worker.join()
    assert seen["hook"] is None


def test_discard_empties_the_buffer(tracer, tmp_path):
    tracer.start()
    named("discarded")(10)
    tracer.stop()
    tracer.discard()
    wait_for_dump(tracer.dump(str(tmp_path / "empty.json")))
    assert calls(load(tmp_path / "empty.json")) == []


def test_each_dump_holds_only_its_own_window(tracer, tmp_path):
    for i in range(3):
        named("between_windows")(10)
        tracer.start()
        named(f"window_{i}")(10)
        tracer.stop()
        named("between_windows")(10)
        wait_for_dump(tracer.dump(str(tmp_path / f"{i}.json")))
    for i in range(3):
        names = {e["name"].split(" ")[0] for e in calls(load(tmp_path / f"{i}.json"))}
        assert f"window_{i}" in names
        assert not any(n.startswith("window_") and n != f"window_{i}" for n in names)
        assert "between_windows" not in names


def test_foreign_profiler_none_when_free_and_after_our_window(tracer):
    assert foreign_profiler() is None
    tracer.start()
    tracer.stop()
    assert foreign_profiler() is None


def test_foreign_profiler_sees_sys_setprofile():
    def other_tool(frame, event, arg):
        return None

    sys.setprofile(other_tool)
    try:
        message = foreign_profiler()
    finally:
        sys.setprofile(None)
    assert message and "sys.setprofile" in message
    assert foreign_profiler() is None


def test_foreign_profiler_sees_threading_setprofile():
    def other_tool(frame, event, arg):
        return None

    threading.setprofile(other_tool)
    try:
        message = foreign_profiler()
    finally:
        threading.setprofile(None)
    assert message and "threading.setprofile" in message


@pytest.mark.skipif(not MONITORING, reason="sys.monitoring is 3.12+")
def test_foreign_monitoring_tool_is_seen_and_left_alone():
    mon = sys.monitoring
    mon.use_tool_id(mon.PROFILER_ID, "other")
    mon.set_events(mon.PROFILER_ID, mon.events.PY_START)
    try:
        message = foreign_profiler()
        assert message and "sys.monitoring" in message and "other" in message
        # Building our tracer (the first window does, after this check) must not free the other tool.
        PythonTracer(PythonTracerConfig(tracer_entries=1000)).clock_us()
        assert mon.get_tool(mon.PROFILER_ID) == "other"
        assert mon.get_events(mon.PROFILER_ID) == mon.events.PY_START
    finally:
        mon.set_events(mon.PROFILER_ID, 0)
        mon.free_tool_id(mon.PROFILER_ID)
    assert foreign_profiler() is None


def test_a_users_own_viztracer_counts_while_running_not_after():
    from viztracer import VizTracer

    theirs = VizTracer(verbose=0, register_global=False)
    try:
        theirs.start()
        assert sys.getprofile() is not None or MONITORING
        theirs.stop()
        if not MONITORING:
            # VizTracer leaves its thread hook behind after stop(); an idle VizTracer's is harmless.
            assert threading.getprofile() == theirs.threadtracefunc
        assert foreign_profiler() is None
    finally:
        theirs.stop()
        theirs.clear()
        threading.setprofile(None)


def test_a_registered_running_viztracer_is_foreign():
    from viztracer import VizTracer

    theirs = VizTracer(verbose=0)  # register_global=True, as the `viztracer` command does
    try:
        theirs.start()
        message = foreign_profiler()
        theirs.stop()
        assert message and "VizTracer" in message
    finally:
        theirs.stop()
        theirs.clear()
        threading.setprofile(None)
        import builtins

        builtins.__dict__.pop("__viz_tracer__", None)  # register_global() set it; do not leak it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_has_the_tracer_stopped(tracer):
    import warnings

    tracer.start()
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads
        pid = os.fork()
    if pid == 0:  # child: report and leave at once, no pytest teardown here
        try:
            os.close(read_end)
            report = {
                "running": tracer.running,
                "hooks": {k: str(v) if v else v for k, v in hooks().items()},
                "foreign": foreign_profiler(),
            }
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tracer.running  # the parent goes on recording
    tracer.stop()
    assert report == {"running": False, "hooks": NO_HOOKS, "foreign": None}


@pytest.mark.skipif(not MONITORING, reason="sys.monitoring is 3.12+")
def test_stop_unregisters_viztracers_monitoring_callbacks_and_keeps_anothers():
    # VizTracer's own stop() frees tool 2 but leaves its callbacks registered: the interpreter then
    # holds the tracer until finalization (where a compiled CUDA job crashed on 3.12.3).
    from vt_lightning.recording.thread_hooks import monitoring_callbacks_of

    mon = sys.monitoring
    tracer = PythonTracer(PythonTracerConfig(tracer_entries=1000))
    tracer.start()
    assert any("sys.monitoring" in hook for hook in tracer.installed_hooks())
    tracer.stop()
    assert tracer.installed_hooks() == []
    assert monitoring_callbacks_of(tracer._tracer, release=False) == 0

    # A slot some other code registered while the id was free is put back as it was.
    def theirs(*args):
        return None

    mon.register_callback(mon.PROFILER_ID, mon.events.PY_START, theirs)
    try:
        tracer.start()
        tracer.stop()
        assert mon.register_callback(mon.PROFILER_ID, mon.events.PY_START, None) is None  # VizTracer replaced it
        mon.register_callback(mon.PROFILER_ID, mon.events.PY_START, theirs)
        assert monitoring_callbacks_of(tracer._tracer, release=True) == 0
        assert mon.register_callback(mon.PROFILER_ID, mon.events.PY_START, None) is theirs
    finally:
        mon.register_callback(mon.PROFILER_ID, mon.events.PY_START, None)


@pytest.mark.skipif(MONITORING, reason="on 3.12+ sys.monitoring covers every thread: nothing is put on threads")
def test_our_own_writer_thread_is_not_hooked(tracer):
    """The background writer's idle pool thread (named vt_lightning-...) gets no hook in a window."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vt_lightning-writer")
    other = ThreadPoolExecutor(max_workers=1, thread_name_prefix="user-pool")
    try:
        pool.submit(int).result()
        other.submit(int).result()
        tracer.start()
        ours_during = pool.submit(sys.getprofile).result()
        theirs_during = other.submit(sys.getprofile).result()
        tracer.stop()
    finally:
        pool.shutdown()
        other.shutdown()
    assert ours_during is None and theirs_during is not None


# ---------------------------------------------------------------- a held window's dump (HeldDump)


def _names(path: Path) -> set[str]:
    return {e["name"].split(" ")[0] for e in calls(load(path))}


def _record(tracer: PythonTracer, name: str) -> None:
    """One window in which a function called ``name`` runs."""
    tracer.start()
    named(name)(10)
    tracer.stop()


def test_a_held_dump_writes_nothing_at_close_and_everything_when_written_in_process(tracer, tmp_path):
    _record(tracer, "held_work")
    held = tracer.dump(str(tmp_path / "held.json"), hold=True)
    assert not (tmp_path / "held.json").exists()  # nothing written, nothing forked at the close
    assert held.write(in_process=True) is None  # written on this thread: no child to reap
    assert "held_work" in _names(tmp_path / "held.json")
    _record(tracer, "later_work")
    wait_for_dump(tracer.dump(str(tmp_path / "later.json")))
    assert "held_work" not in _names(tmp_path / "later.json")  # the buffer was emptied by the write


def test_the_next_window_writes_a_held_dump_before_it_records(tracer, tmp_path):
    _record(tracer, "held_work")
    held = tracer.dump(str(tmp_path / "held.json"), hold=True)
    _record(tracer, "next_work")  # the buffer is needed again: the held calls are dumped first
    wait_for_dump(tracer.dump(str(tmp_path / "next.json")))
    pid = held.write(in_process=True)  # the job comes later: it reaps the child the start forked
    if children.FORK_CAN_DEADLOCK:  # 3.10: the start wrote the held calls in process, no child
        assert pid is None
    else:
        assert pid is not None
        wait_for_dump(pid)
    assert "held_work" in _names(tmp_path / "held.json") and "next_work" not in _names(tmp_path / "held.json")
    assert "next_work" in _names(tmp_path / "next.json") and "held_work" not in _names(tmp_path / "next.json")


def test_a_dropped_held_dump_is_never_written_and_leaves_the_buffer(tracer, tmp_path):
    _record(tracer, "held_work")
    held = tracer.dump(str(tmp_path / "held.json"), hold=True)
    held.drop()
    _record(tracer, "next_work")
    wait_for_dump(tracer.dump(str(tmp_path / "next.json")))
    assert not (tmp_path / "held.json").exists()
    assert _names(tmp_path / "next.json") >= {"next_work"} and "held_work" not in _names(tmp_path / "next.json")


def test_a_held_dump_written_on_the_writer_thread_keeps_the_next_window_out(tracer, tmp_path, monkeypatch):
    """A held window released mid-training is written by the writer thread while training goes on.
    The next window's start must wait for that write: recording first put its first calls into
    the held window's file and the write's ``clear()`` erased them from its own (seen on 3.10,
    where the dump runs in process and takes longest)."""
    from vt_lightning.recording import viztracer_dump

    _record(tracer, "held_work")
    held = tracer.dump(str(tmp_path / "held.json"), hold=True)
    claimed, go_on = threading.Event(), threading.Event()
    real_write, real_flush = viztracer_dump.write_dump, viztracer_dump.HeldDump.flush

    def slow_write(*args: Any, **kwargs: Any) -> Any:  # the writer thread has claimed the dump
        claimed.set()
        go_on.wait(timeout=30)
        return real_write(*args, **kwargs)

    def flush(self: Any) -> None:  # the next window found the held dump: let the write go on
        go_on.set()
        real_flush(self)

    monkeypatch.setattr(viztracer_dump, "write_dump", slow_write)
    monkeypatch.setattr(viztracer_dump.HeldDump, "flush", flush)
    pids: list[int | None] = []
    writer = threading.Thread(target=lambda: pids.append(held.write(in_process=False)))
    writer.start()
    assert claimed.wait(timeout=30)
    _record(tracer, "next_work")  # the next window, while the writer thread is mid-write
    go_on.set()
    writer.join(timeout=30)
    wait_for_dump(pids[0])
    wait_for_dump(tracer.dump(str(tmp_path / "next.json")))
    assert "held_work" in _names(tmp_path / "held.json") and "next_work" not in _names(tmp_path / "held.json")
    assert "next_work" in _names(tmp_path / "next.json") and "held_work" not in _names(tmp_path / "next.json")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_writes_its_parents_held_dump(tracer, tmp_path):
    """A DataLoader worker forked while a window is held inherits the buffer: the calls are the
    parent's to write, so the child's copy is emptied and the child's own window holds only its own."""
    _record(tracer, "held_work")
    held = tracer.dump(str(tmp_path / "held.json"), hold=True)
    pid = os.fork()
    if pid == 0:  # the child: record and dump its own window, as a worker does
        code = 1
        try:
            _record(tracer, "child_work")
            wait_for_dump(tracer.dump(str(tmp_path / "child.json")))
            code = 0 if not (tmp_path / "held.json").exists() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "held_work" not in _names(tmp_path / "child.json") and "child_work" in _names(tmp_path / "child.json")
    assert held.write(in_process=True) is None
    assert "held_work" in _names(tmp_path / "held.json") and "child_work" not in _names(tmp_path / "held.json")


# ---------------------------------------------------------------- VizTracer's thread key at exit (thread_keys)


def _getspecific() -> Any:
    import ctypes

    libc = ctypes.CDLL(None)
    libc.pthread_getspecific.restype = ctypes.c_void_p
    libc.pthread_getspecific.argtypes = [ctypes.c_uint]
    return libc.pthread_getspecific


@pytest.mark.skipif(sys.platform != "linux", reason="the key is found through glibc's pthread keys")
def test_the_key_noted_at_construction_holds_viztracers_thread_state():
    """Deleting the wrong key would break another library's thread state: the noted one is set in a
    thread exactly when VizTracer traced it."""
    from vt_lightning.recording import thread_keys

    before = thread_keys.noted_keys()
    own = PythonTracer(PythonTracerConfig(tracer_entries=123_457))  # a VizTracer of its own
    own.clock_us()  # builds it
    (key,) = [k for k in thread_keys.noted_keys() if k not in before]
    getspecific = _getspecific()
    seen: dict[str, Any] = {}
    work = named("thread_work")

    def record(label: str) -> None:
        work(10)
        seen[label] = getspecific(key)

    outside = threading.Thread(target=record, args=("outside a window",))
    outside.start()
    outside.join()
    own.start()
    inside = threading.Thread(target=record, args=("in a window",))
    inside.start()
    inside.join()
    own.stop()
    own.discard()
    assert seen == {"outside a window": None, "in a window": seen["in a window"]} and seen["in a window"]
