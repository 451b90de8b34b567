"""The window pipeline off the training thread: dump child, writer process, fallbacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import MarkerModel, load_trace, loader, make_trainer, trace_files
from lightning.pytorch.callbacks import Callback

from vt_lightning import VizTraceCallback
from vt_lightning.export.writer_process import WriterError, WriterProcess


def _no_zombies() -> None:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return
    assert pid == 0, f"an unreaped child process {pid} was left behind"


def test_windows_are_finished_by_a_separate_writer_process(tmp_path, monkeypatch):
    pids: list[int] = []
    call = WriterProcess.call

    def spy(self, request):
        if request != "ping":
            pids.append(self.pid)
        return call(self, request)

    monkeypatch.setattr(WriterProcess, "call", spy)
    cb = VizTraceCallback(wait=1, warmup=0, active=2, repeat=2)
    make_trainer(tmp_path, [cb], max_steps=6).fit(MarkerModel(), loader())
    assert len(pids) == 2 and len(set(pids)) == 1 and os.getpid() not in pids  # one process, two windows
    assert len(trace_files(tmp_path)) == 2
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # closed with the run
    _no_zombies()


def test_a_writer_process_that_dies_is_replaced_by_the_writer_thread(tmp_path):
    cb = VizTraceCallback(wait=1, warmup=0, active=1, repeat=3)

    class KillWriter(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.fit_loop.total_batch_idx == 2:
                cb._controller.writer.drain()  # window 0 is written: the process exists
                os.kill(cb._controller.writer.process.pid, signal.SIGKILL)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb, KillWriter()], max_steps=6).fit(MarkerModel(), loader())
    assert len([w for w in caught if "writer process stopped" in str(w.message)]) == 1
    steps = sorted(s for p in trace_files(tmp_path) for s in load_trace(p)["vt_lightning"]["steps"])
    assert steps == [1, 3, 5]  # no window lost
    _no_zombies()


def test_the_writer_process_reports_a_failed_window_and_keeps_serving(tmp_path):
    writer = WriterProcess()
    try:
        with pytest.raises(WriterError, match="AttributeError"):
            writer.call(object())  # not a job
        assert writer.call("ping") == "pong"
    finally:
        writer.close()
    assert not writer.alive()


_FORK_DURING_SPAWN = """
import json, os, threading, time
from vt_lightning.export import writer_process

order, held = [], threading.Event()

def start_writer_process():  # what WriterProcess() does on the writer thread, slowed down
    with writer_process._SPAWNING:
        held.set()
        time.sleep(0.3)
        order.append("writer process started")

thread = threading.Thread(target=start_writer_process)
thread.start()
held.wait()
pid = os.fork()  # a DataLoader worker, or the tracer's dump child, on the training thread
if pid == 0:
    os._exit(0)
order.append("forked")
os.waitpid(pid, 0)
thread.join()
print(json.dumps(order))
"""


def test_a_fork_waits_until_the_writer_process_has_started(tmp_path):
    """A child forked while Popen runs would inherit Popen's exec-status pipe and keep Popen (and so
    the writer) waiting until that child exits; forks wait the few ms Popen takes instead."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_DURING_SPAWN], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["writer process started", "forked"]
