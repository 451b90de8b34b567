"""A window that closes near the end of a CPU run is finished in the training process when training
stops, with no writer process (``handoff.finishes_at_end``): on busy cores the process's start-up
is a third of what the window costs. Any wait by training releases the hold. The rule and the
writer's hold, on fake processes and windows."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from vt_lightning.controller import handoff
from vt_lightning.controller.handoff import BackgroundWriter, finishes_at_end
from vt_lightning.export.job import WindowResult


@pytest.mark.parametrize(
    "cpu_bound, started, left, step_s, held",
    [
        (True, False, 16, 0.035, True),  # the short run of benchmarks/short_run.py: 0.6 s to its end
        (True, False, 0, 0.035, True),  # the window's last batch is the run's last
        (True, False, 200, 0.035, False),  # 7 s of steps to go: the window's files would come too late
        (True, True, 16, 0.035, False),  # a writer process runs already: nothing to save
        (False, False, 16, 0.035, False),  # an accelerator: the writer started ahead, on a spare core
        (True, False, None, 0.035, False),  # the run's end unknown (max_time, an iterable without length)
        (True, False, 16, None, False),  # no step measured yet
    ],
)
def test_only_a_cpu_window_near_a_known_end_is_held(cpu_bound, started, left, step_s, held):
    assert finishes_at_end(cpu_bound, started, left, step_s) is held


def test_the_rule_follows_its_switches(monkeypatch):
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)
    assert not finishes_at_end(True, False, 16, 0.035)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 5.0)
    monkeypatch.setattr(handoff, "HAND_OFF_START_ON_CPU", False)  # the writer starts ahead: none to skip
    assert not finishes_at_end(True, False, 16, 0.035)


# ---------------------------------------------------------------- the writer's side, with fakes


class _FakeProcess:
    """Stands in for ``WriterProcess``: records the jobs it was given."""

    started: ClassVar[list[_FakeProcess]] = []

    def __init__(self) -> None:
        self.jobs: list[Any] = []
        self.pid = -1
        _FakeProcess.started.append(self)

    def call(self, job: Any) -> WindowResult:
        self.jobs.append(job)
        return _result(job)

    def kill(self) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


def _result(job: Any) -> WindowResult:
    return WindowResult(Path(job.run_dir) / "w.pt.trace.json.gz", 1, 1, 0, 0, overflow=False)


class _Closed:
    """A closed window whose raw dumps are complete at once."""

    def __init__(self, index: int) -> None:
        self.job = SimpleNamespace(
            run_dir=Path(f"run{index}"), metadata={"window": index}, publish_to=None, torch_raw=None, python_raw=None,
            extras={}, claim=None,
        )  # fmt: skip
        self.collected = threading.Event()
        self.in_process: bool | None = None  # how VizTracer's held dump was written
        self.dropped = threading.Event()

    def collect(self, *, in_process: bool = False) -> None:
        self.in_process = in_process
        self.collected.set()

    def drop(self) -> None:
        self.dropped.set()


@pytest.fixture
def writer(monkeypatch):
    _FakeProcess.started = []
    here: list[tuple[str, bool]] = []  # (thread name, collector enabled) of each in-process finish

    def finish_here(job):
        here.append((threading.current_thread().name, gc.isenabled()))
        return _result(job)

    monkeypatch.setattr(handoff, "WriterProcess", _FakeProcess)
    monkeypatch.setattr(handoff, "finish_window", finish_here)
    monkeypatch.setattr(handoff, "deliver", lambda job, result, in_writer: result)
    created = BackgroundWriter(max_in_flight=2, use_process=True, timeout=10)
    created.finished_here = here  # type: ignore[attr-defined]
    yield created
    created.close()


def _settled(future: Future[Any], within: float = 0.3) -> bool:
    try:
        future.result(timeout=within)
    except Exception:
        return future.done()
    return True


def test_a_held_window_waits_for_the_end_and_is_finished_on_the_writer_thread_without_a_process(writer):
    closed = _Closed(0)
    answer = writer.hand_off(closed, at_end=True)
    assert not _settled(answer) and not closed.collected.is_set()  # held: nothing done while training runs
    assert writer.drain() is True  # fit ends
    assert isinstance(answer.result(timeout=0), WindowResult)
    assert closed.collected.is_set() and _FakeProcess.started == []  # no writer process, ever
    assert closed.in_process is True  # VizTracer's dump written here too: no fork of the finished run
    assert [(name.startswith("vt_lightning-writer"), enabled) for name, enabled in writer.finished_here] == [
        (True, False)  # on the writer thread, with the collector paused
    ]
    assert gc.isenabled()  # and running again afterwards


def test_a_later_window_releases_the_held_one_to_the_writer_process(writer):
    first = _Closed(0)
    held = writer.hand_off(first, at_end=True)
    later = writer.hand_off(_Closed(1))  # further from the end (a repeat): this one starts the process
    assert _settled(held, within=10) and _settled(later, within=10)
    assert len(_FakeProcess.started) == 1
    assert [job.metadata["window"] for job in _FakeProcess.started[0].jobs] == [0, 1]
    assert writer.finished_here == []
    assert first.in_process is False  # training goes on: its dump is forked, not written on a thread of it


def test_training_waiting_for_room_releases_the_held_window(writer):
    writer.max_in_flight = 1
    held = writer.hand_off(_Closed(0), at_end=True)
    waited, room = writer.wait_for_room()  # the next window opens: it may not wait for the run's end
    assert room and waited < 5
    assert held.done() and len(_FakeProcess.started) == 1 and writer.finished_here == []


def test_an_abandoned_writer_drops_its_held_window_without_finishing_it(writer):
    closed = _Closed(0)
    held = writer.hand_off(closed, at_end=True)
    for _ in range(500):  # until the writer thread holds it (else the abandon merely cancels it)
        if held.running():
            break
        time.sleep(0.01)
    assert held.running() and not held.done()
    writer.abandon()
    with pytest.raises(handoff.WriterAbandoned):
        held.result(timeout=10)
    assert writer.finished_here == [] and _FakeProcess.started == []
    # The future is settled at the abandon; the held thread wakes after it and drops the window.
    assert closed.dropped.wait(10) and not closed.collected.is_set()  # its calls leave VizTracer's buffer unwritten
    assert writer.drain() is True


def test_an_abandoned_writer_drops_a_held_window_still_queued(writer):
    busy = threading.Event()
    stuck = writer.submit(busy.wait, 10)  # the writer thread is busy: the held window stays queued
    queued = _Closed(1)
    held = writer.hand_off(queued, at_end=True)
    assert not held.running()
    writer.abandon()
    busy.set()
    assert held.cancelled() and queued.dropped.is_set() and not queued.collected.is_set()  # dropped by abandon itself
    assert _settled(stuck, within=10)
