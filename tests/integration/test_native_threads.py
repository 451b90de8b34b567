"""The wait before torch's profiler stops in a gloo process (recording/native_threads.py): a
gloo worker may still be ending a collective's profiler range after DDP has its result, and
stopping the profiler under it corrupted the heap on torch 2.4 and 2.5 (see the module)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from vt_lightning.recording import torchtracer
from vt_lightning.recording.native_threads import (
    collectives_on_gloo,
    running_threads,
    wait_for_native_threads,
)
from vt_lightning.recording.torchtracer import TorchTracer, TorchTracerConfig

PROC = Path("/proc/self/task")
needs_proc = pytest.mark.skipif(not PROC.is_dir(), reason="reads /proc (Linux)")


def fake_tasks(tmp_path: Path, states: dict[int, tuple[str, str]]) -> Path:
    """A /proc/self/task look-alike: tid -> (thread name, state letter)."""
    for tid, (name, state) in states.items():
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "stat").write_bytes(f"{tid} ({name}) {state} 1 2 3 4 5\n".encode())
    return tmp_path


def test_running_threads_are_those_in_state_R_outside_skip(tmp_path):
    tasks = fake_tasks(tmp_path, {1: ("python", "R"), 2: ("gloo", "R"), 3: ("kineto", "S"), 4: ("a) S (b", "R")})
    assert sorted(running_threads(skip={1}, task_dir=tasks)) == [2, 4]
    assert running_threads(skip={1, 2, 4}, task_dir=tasks) == []
    assert running_threads(skip=set(), task_dir=tmp_path / "gone") == []  # no /proc: nothing to wait for


def test_the_wait_gives_up_after_its_timeout_when_a_thread_keeps_running(tmp_path):
    tasks = fake_tasks(tmp_path, {1: ("python", "S"), 2: ("spinning", "R")})
    start = time.perf_counter()
    assert wait_for_native_threads(timeout_s=0.01, skip=set(), task_dir=tasks) is None
    assert time.perf_counter() - start < 1.0  # bounded: the window closes anyway
    waited = wait_for_native_threads(timeout_s=0.01, skip={2}, task_dir=tasks)
    assert waited is not None and waited < 0.01


@needs_proc
def test_the_wait_returns_only_once_a_busy_thread_has_stopped_running():
    # One hashlib call on a large buffer runs with the GIL released, on its own core, as a gloo worker
    # does: the thread is in state R from its start to its end. (After it, the thread must take the
    # GIL back before it can note the time, so its own end time may come a little after the wait's.)
    data = b"x" * (256 << 20)
    span: dict[str, float] = {}

    def busy() -> None:
        span["start"] = time.perf_counter()
        hashlib.sha256(data).digest()
        span["end"] = time.perf_counter()

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        time.sleep(0.02)  # lets it into the hash (this thread holds no GIL meanwhile)
        assert "end" not in span, "the busy thread ended before the wait began; the test proves nothing"
        waited = wait_for_native_threads(timeout_s=60.0, skip={threading.get_native_id()})
        returned = time.perf_counter()
        assert waited is not None, "a thread still ran after 60 s"
    finally:
        thread.join()
    hashing = span["end"] - span["start"]
    assert returned - span["start"] > 0.8 * hashing, (
        f"the wait returned {returned - span['start']:.3f} s into a {hashing:.3f} s hash: it did not wait"
    )


@needs_proc
def test_python_threads_are_not_waited_for_by_default():
    data = b"x" * (512 << 20)  # ~1 s of hashing: far longer than the wait for the native threads
    thread = threading.Thread(target=lambda: hashlib.sha256(data).digest())
    thread.start()
    try:
        waited = wait_for_native_threads(timeout_s=5.0)
        assert waited is not None
        assert thread.is_alive(), "the wait sat out a Python thread (never in a gloo collective's tail)"
    finally:
        thread.join()


def test_collectives_on_gloo_only_while_a_gloo_default_group_exists(tmp_path):
    assert not collectives_on_gloo()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert collectives_on_gloo()
    finally:
        dist.destroy_process_group()
    assert not collectives_on_gloo()


@pytest.mark.parametrize("gloo", [True, False], ids=["gloo", "no-gloo"])
def test_the_torch_profiler_stops_after_the_wait_only_where_collectives_run_on_gloo(monkeypatch, gloo):
    order: list[str] = []
    monkeypatch.setattr(torchtracer, "collectives_on_gloo", lambda: gloo)
    monkeypatch.setattr(torchtracer, "wait_for_native_threads", lambda: order.append("wait"))
    tracer = TorchTracer(TorchTracerConfig(profile_memory=False), cuda_available=False)
    stop_trace = tracer._profile.stop_trace

    def stop_and_note() -> None:
        order.append("stop")
        stop_trace()

    monkeypatch.setattr(tracer._profile, "stop_trace", stop_and_note)
    tracer.prepare()
    tracer.start()
    torch.ones(4).sum()
    tracer.stop()
    assert order == (["wait", "stop"] if gloo else ["stop"])
    assert not torchtracer.torch_profiler_active()
