"""No wait on a child process is unbounded (issue 40: 4): a dump child that does not finish (stopped,
or deadlocked in ``PyOS_AfterFork_Child`` on Python 3.10) is killed and reaped at its bound, its
window is dropped with one warning, and training goes on."""

from __future__ import annotations

import os
import signal
import time
import warnings

import pytest
from conftest import MarkerModel, loader, make_trainer, trace_files

from vt_lightning import VizTraceCallback
from vt_lightning.controller import handoff
from vt_lightning.recording import children
from vt_lightning.recording.children import DumpChildFailed, DumpTimeout, wait_for_dump
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig


def _is_our_child(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


# Set only while ``PythonTracer.dump`` runs: the child it forks stops itself (SIGSTOP) before it
# writes a byte, so no dump can finish before the test acts on it.
_stop_forked_child = [False]


def _stop_self_if_asked() -> None:
    if _stop_forked_child[0]:
        os.kill(os.getpid(), signal.SIGSTOP)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_stop_self_if_asked)


def _stopping_dumps(monkeypatch) -> list[int]:
    """Every dump child stops itself as soon as it is forked; returns their pids. The dump forks on
    every interpreter here (3.10 would otherwise dump in-process: FORK_CAN_DEADLOCK)."""
    monkeypatch.setattr(children, "FORK_CAN_DEADLOCK", False)
    stopped: list[int] = []
    dump = PythonTracer.dump

    def dump_and_stop(self, path, *, hold=False):
        _stop_forked_child[0] = True
        try:
            result = dump(self, path, hold=hold)
        finally:
            _stop_forked_child[0] = False
        if isinstance(result, int):
            stopped.append(result)
        return result

    monkeypatch.setattr(PythonTracer, "dump", dump_and_stop)
    return stopped


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_stopped_dump_child_is_killed_and_reaped_at_its_bound(tmp_path, monkeypatch):
    stopped = _stopping_dumps(monkeypatch)
    tracer = PythonTracer(PythonTracerConfig(tracer_entries=10_000))
    tracer.start()
    sum(range(10))
    tracer.stop()
    pid = tracer.dump(str(tmp_path / "w.json"))
    assert stopped == [pid]
    start = time.monotonic()
    with pytest.raises(DumpTimeout, match=r"did not finish in 0\.5 s"):
        wait_for_dump(pid, timeout=0.5)
    assert time.monotonic() - start < 5
    assert not _is_our_child(pid)  # reaped: no zombie, no stopped copy of this process
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_windows_whose_dump_child_hangs_are_dropped_with_one_warning_and_training_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(children, "DUMP_TIMEOUT_S", 1.0)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)  # no window held to the end: each forks
    stopped = _stopping_dumps(monkeypatch)
    model = MarkerModel()
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, budget_time_share=None)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=10).fit(model, loader())
    assert time.monotonic() - start < 60
    assert model.train_batches == list(range(10))
    assert len(stopped) == 2
    dropped = [str(w.message) for w in caught if "did not finish" in str(w.message)]
    assert len(dropped) == 1, [str(w.message) for w in caught]
    assert dropped[0].startswith("vt_lightning: window dropped: the VizTracer dump process did not finish in 1 s")
    assert trace_files(tmp_path) == []
    for pid in stopped:
        assert not _is_our_child(pid)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_where_a_fork_can_deadlock_the_window_is_dumped_in_process(tmp_path, monkeypatch):
    monkeypatch.setattr(children, "FORK_CAN_DEADLOCK", True)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)
    forks: list[int] = []
    fork = os.fork

    def counted_fork():
        pid = fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted_fork)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, budget_time_share=None)
    make_trainer(tmp_path, [cb], max_steps=10).fit(MarkerModel(), loader())
    assert forks == []
    assert len(trace_files(tmp_path)) == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_dump_child_that_crashes_is_named_as_the_cause_not_the_spool(tmp_path, monkeypatch):
    stopped = _stopping_dumps(monkeypatch)
    tracer = PythonTracer(PythonTracerConfig(tracer_entries=10_000))
    tracer.start()
    sum(range(10))
    tracer.stop()
    pid = tracer.dump(str(tmp_path / "w.json"))
    assert stopped == [pid]
    os.kill(pid, signal.SIGSEGV)  # what VizTracer's C dump does on a function name that is not UTF-8
    os.kill(pid, signal.SIGCONT)
    with pytest.raises(DumpChildFailed, match="died of SIGSEGV") as caught:
        wait_for_dump(pid, timeout=30)
    assert not isinstance(caught.value, DumpTimeout)
    assert not _is_our_child(pid)
