"""The window pipeline off the training thread: dump child, writer process, fallbacks."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import MarkerModel, load_trace, loader, make_trainer, trace_files
from lightning.pytorch.callbacks import Callback
from support.paths import REPO, SCRIPTS, TESTS

from vt_lightning import VizTraceCallback
from vt_lightning.controller import run as runs
from vt_lightning.export.writer_process import WriterError, WriterProcess


def _no_zombies() -> None:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return
    assert pid == 0, f"an unreaped child process {pid} was left behind"


def test_windows_are_finished_by_a_separate_writer_process(tmp_path, monkeypatch, writer_process_per_window):
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


def test_a_writer_process_that_dies_is_replaced_by_the_writer_thread(tmp_path, writer_process_per_window):
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


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
def test_the_writer_process_loads_neither_torch_nor_site_packages_it_does_not_use():
    # It starts on training's cores at the first window of a CPU run: no torch, no Lightning, and no
    # ``site`` (an environment's .pth files may run any code there).
    writer = WriterProcess()
    try:
        assert writer.call("ping") == "pong"
        maps = Path(f"/proc/{writer.pid}/maps").read_text()
        argv = Path(f"/proc/{writer.pid}/cmdline").read_bytes().split(b"\0")
    finally:
        writer.close()
    assert "orjson" in maps  # what it needs was found on the explicit path
    assert "libtorch" not in maps and "/torch/" not in maps
    assert b"-S" in argv and b"-I" in argv


def _autogroup_nice(pid: int) -> int | None:
    """The nice of the process's scheduling group, or None where the kernel groups no sessions.

    None too where the file is not the kernel's "/autogroup-123 nice 19": sandboxed kernels (CI's)
    emulate /proc/<pid>/autogroup as a plain file that reads back what was written, or nothing.
    """
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
        line = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    kernel_format = re.fullmatch(r"/autogroup-\d+ nice (-?\d+)\s*", line)
    return int(kernel_format.group(1)) if enabled and kernel_format else None


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX priorities")
def test_the_writer_process_yields_the_cpu_to_training_even_in_its_own_session():
    # Its own session (Ctrl-C stays with training) is its own scheduling group where Linux groups
    # by session: there its nice alone is void and a busy writer slowed torch's threads 8x.
    writer = WriterProcess()
    try:
        assert writer.call("ping") == "pong"  # past its boot code
        assert os.getsid(writer.pid) != os.getsid(0)
        assert os.getpriority(os.PRIO_PROCESS, writer.pid) >= 10
        group = _autogroup_nice(writer.pid)
        if group is not None:
            assert group == 19
            assert _autogroup_nice(os.getpid()) != 19  # training's own group is left alone
    finally:
        writer.close()


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
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_DURING_SPAWN], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["writer process started", "forked"]


# ---------------------------------------------------------------- a writer killed after it published
KILLED_AFTER_PUBLISH = SCRIPTS / "fault" / "writer_killed_after_publish.py"


@pytest.mark.parametrize("point", ["trace", "answer"])
def test_a_writer_killed_after_publishing_is_retried_into_the_same_directory(tmp_path, point):
    """SIGKILL right after the writer published window 0's trace (or after it wrote everything, just
    before answering): the retry recognizes its own files. One directory per window, no "another
    run" warning, summaries beside the traces, nothing hidden left behind."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(KILLED_AFTER_PUBLISH), str(tmp_path), point],
        capture_output=True,
        text=True,
        timeout=180,
    )
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wall < 120
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len([w for w in report["warnings"] if "writer process stopped" in w]) == 1  # the kill happened
    assert not [w for w in report["warnings"] if "already taken" in w or "could not write" in w], report
    assert report["notes"] == [[], []]
    runs = sorted(p.parent.name for p in trace_files(tmp_path))
    assert runs == ["window_000-batches_1-1", "window_001-batches_3-3"]  # no window_000-….2
    assert [Path(p).parent.name for p in report["results"]] == runs
    for trace in trace_files(tmp_path):
        assert load_trace(trace)["vt_lightning"]["steps"] in ([1], [3])
        summary = json.loads(trace.with_name(trace.name.replace(".pt.trace.json.gz", ".summary.jsonc")).read_text())
        assert summary["window"]["trace"] == trace.name
    hidden = [p for p in tmp_path.rglob(".*") if "window_" in str(p.parent)]
    assert hidden == []  # no claim, no temporary


# ---------------------------------------------------------------- permissions follow the umask
_UMASK_RUN = """
import json, os, sys
from pathlib import Path
from typing import Any
sys.path.insert(0, {tests!r})
from conftest import MarkerModel, loader, make_trainer
from vt_lightning import VizTraceCallback
from vt_lightning.controller import handoff
from vt_lightning.export.atomic import atomic_write

root = Path({root!r})
handoff.USE_WRITER_PROCESS = {use_process!r}
handoff.FINISH_AT_END_WITHIN_S = 0.0  # the process itself writes (the fallback case: this process)
os.umask({umask!r})  # set after the package was imported, as a user's script may
cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2)
make_trainer(root, [cb], max_steps=2).fit(MarkerModel(), loader())
atomic_write(root / "after.bin", b"x")
os.umask(0o022)  # and changed again: the next file follows
atomic_write(root / "changed.bin", b"x")
modes = {{str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*") if "window_" in str(p)}}
for name in ("after.bin", "changed.bin"):
    modes[name] = (root / name).stat().st_mode & 0o777
print(json.dumps({{"modes": modes, "windows": len(cb.results)}}))
"""


@pytest.mark.parametrize("use_process, umask", [(False, 0o077), (True, 0o027)], ids=["fallback-077", "process-027"])
def test_files_and_directories_follow_the_umask_in_force_when_written(tmp_path, use_process, umask):
    code = _UMASK_RUN.format(tests=str(TESTS), root=str(tmp_path), use_process=use_process, umask=umask)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - start < 120
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["windows"] == 2
    modes = report["modes"]
    files = {name: mode for name, mode in modes.items() if "." in Path(name).name and not name.endswith(".bin")}
    directories = {name: mode for name, mode in modes.items() if name not in files and not name.endswith(".bin")}
    assert len(directories) == 2 and len(files) >= 6  # two windows: trace, memory snapshot, summary .json/.md
    assert set(files.values()) == {0o666 & ~umask}, files
    assert set(directories.values()) == {0o777 & ~umask}, directories
    assert modes["after.bin"] == 0o666 & ~umask and modes["changed.bin"] == 0o644


def _writer_starts(monkeypatch) -> tuple[list[int], Callback]:
    """Spies on writer-process starts: the global batch in progress at each (-1: before the first
    batch), and the callback that keeps that batch number (place it first)."""
    starts: list[int] = []
    batch = [-1]
    init = WriterProcess.__init__

    def spy(self, *args, **kwargs):
        starts.append(batch[0])
        init(self, *args, **kwargs)

    class Batches(Callback):
        def on_train_batch_start(self, trainer, pl_module, b, batch_idx):
            batch[0] = trainer.fit_loop.total_batch_idx

    monkeypatch.setattr(WriterProcess, "__init__", spy)
    return starts, Batches()


@pytest.mark.parametrize("limit", [dict(max_epochs=2), dict(max_steps=-1, max_epochs=3, accumulate_grad_batches=2)])
def test_an_epoch_bounded_run_with_no_window_in_it_starts_no_writer_process(tmp_path, monkeypatch, limit):
    # 16 batches an epoch; the first window warms up at batch 60, past the run's 32 or 48 batches.
    starts, batches = _writer_starts(monkeypatch)
    cb = VizTraceCallback(wait=60, warmup=1, active=1)
    make_trainer(tmp_path, [batches, cb], **{"max_steps": -1, **limit}).fit(MarkerModel(), loader())
    assert starts == [] and trace_files(tmp_path) == []


def test_an_epoch_bounded_run_starts_its_writer_at_train_start_when_the_window_lies_ahead(tmp_path, monkeypatch):
    # On an accelerator (faked: the decision alone), where a spare core hides the start-up.
    monkeypatch.setattr(runs, "trains_on_cpu", lambda run: False)
    starts, batches = _writer_starts(monkeypatch)
    cb = VizTraceCallback(wait=20, warmup=1, active=1)  # batch 21 of 32: within the run, 20 batches ahead
    make_trainer(tmp_path, [batches, cb], max_steps=-1, max_epochs=2).fit(MarkerModel(), loader())
    assert len(starts) == 1 and starts[0] < 20, starts  # started in the background before the window
    assert len(trace_files(tmp_path)) == 1


def test_a_cpu_run_starts_its_writer_at_the_first_hand_off_not_in_a_quiet_step(
    tmp_path, monkeypatch, writer_process_per_window
):
    starts, batches = _writer_starts(monkeypatch)
    cb = VizTraceCallback(wait=20, warmup=1, active=1)  # warmup 20, active 21: handed off after batch 21
    make_trainer(tmp_path, [batches, cb], max_steps=-1, max_epochs=2).fit(MarkerModel(), loader())
    assert len(starts) == 1 and starts[0] >= 21, starts
    assert len(trace_files(tmp_path)) == 1


# ---------------------------------------------------------------- a job is finished as handed over
class CollectingModel(MarkerModel):
    """Forces a garbage collection in every step, so the window records a ``[gc]`` pause."""

    def training_step(self, batch, batch_idx):
        import gc

        gc.collect()
        return super().training_step(batch, batch_idx)


def test_finishing_a_job_leaves_it_as_handed_over_so_a_retry_writes_the_same_trace(tmp_path, monkeypatch):
    """The writer thread finishes a job again when the writer process died mid-window: the second
    trace must place every event where the first did. The ``[gc]`` pauses travel inside the job
    (``extras``), and merging them once moved them in place, so a retry moved them again, by the
    calibration's whole offset."""
    from vt_lightning.controller import handoff
    from vt_lightning.export import pipeline

    monkeypatch.setattr(handoff, "USE_WRITER_PROCESS", False)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)
    jobs = []

    def keep(job):
        result = pipeline.finish_window(job)
        kept = {}  # its raw dumps, removed once the result is delivered
        for field in ("torch_raw", "python_raw"):
            kept[field] = tmp_path / Path(getattr(job, field)).name
            shutil.copyfile(getattr(job, field), kept[field])
        jobs.append(dataclasses.replace(job, **kept))
        return result

    monkeypatch.setattr(handoff, "finish_window", keep)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=1, dirpath=str(tmp_path / "logs"))
    make_trainer(tmp_path, [cb], max_steps=2).fit(CollectingModel(), loader())
    assert len(jobs) == 1 and len(cb.results) == 1
    first = load_trace(cb.results[0].trace_path)
    retry = pipeline.finish_window(dataclasses.replace(jobs[0], run_dir=tmp_path / "retry", job_id=""))
    second = load_trace(retry.trace_path)

    def pauses(trace):
        return [(e["ts"], e["dur"]) for e in trace["traceEvents"] if str(e.get("name", "")).startswith("[gc]")]

    assert pauses(first), "the window recorded no [gc] pause"
    assert pauses(second) == pauses(first)
    assert len(second["traceEvents"]) == len(first["traceEvents"])


def test_the_summary_from_the_traces_tables_is_the_one_the_written_trace_gives(tmp_path, monkeypatch):
    """The summary, the memory snapshot, the Lightning view and the workers' placement read the
    trace's per-thread tables, filed once by the merge (the DataLoader workers' calls as they were
    placed), never the whole event list: the summary written is the one the written trace gives
    read back (as ``vt-lightning summary`` reads it), also when a worker's calls are named like
    ``[pl][module]`` ranges, ``[memory]`` events sit on a worker's thread, and a training-process
    ``[memory]`` event follows the workers' calls."""
    import pickle

    import orjson
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from vt_lightning.analysis.steps import read_window
    from vt_lightning.analysis.summary import summarize
    from vt_lightning.analysis.workers import worker_summary
    from vt_lightning.controller import handoff
    from vt_lightning.export import pipeline

    monkeypatch.setattr(handoff, "USE_WRITER_PROCESS", False)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)
    jobs = []

    def keep(job):
        result = pipeline.finish_window(job)
        kept = tmp_path / "kept"
        kept.mkdir(exist_ok=True)
        copies = {f: kept / Path(getattr(job, f)).name for f in ("torch_raw", "python_raw")}
        for field, copy in copies.items():
            shutil.copyfile(getattr(job, field), copy)
        parts = job.extras["workers"]
        prefix = f"b{int(parts['first'])}-r{int(parts['rank'])}-"
        for name in os.listdir(parts["dir"]):
            if name.startswith(prefix):
                shutil.copyfile(os.path.join(parts["dir"], name), kept / name)
        extras = {**job.extras, "workers": {**parts, "dir": str(kept)}}
        jobs.append(dataclasses.replace(job, extras=extras, **copies))
        return result

    monkeypatch.setattr(handoff, "finish_window", keep)
    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4, num_workers=2, multiprocessing_context="fork")
    cb = VizTraceCallback(wait=1, warmup=0, active=2, repeat=1, dirpath=str(tmp_path / "logs"), memory_snapshot=True)
    make_trainer(tmp_path, [cb], max_steps=4).fit(MarkerModel(), data)
    assert len(jobs) == 1
    job = jobs[0]

    def finished_and_read_back(run_dir: Path) -> tuple[Any, dict[str, Any]]:
        result = pipeline.finish_window(dataclasses.replace(job, run_dir=run_dir, job_id=""))
        assert result.memory_path is not None and result.summary is not None, result.notes
        trace = load_trace(result.trace_path)
        read_back = summarize(trace, pickle.loads(Path(result.memory_path).read_bytes()))
        read_back["window"]["trace"] = job.trace_name
        workers = worker_summary(read_window(trace))
        assert workers is not None and workers["workers"], "the window's workers were not traced"
        read_back["workers"] = workers
        # Two keys come from the write, not the trace: the recorded source lines and the memory view's name.
        written = {**result.summary, "memory": dict(result.summary["memory"])}
        assert written.pop("sources")["files"], "the summary names the test's lines: they are recorded"
        assert (result.trace_path.parent / written["memory"].pop("view")).is_file()
        assert orjson.dumps(written) == orjson.dumps(read_back)  # sources: read from the files, not the trace
        return result, trace

    finished_and_read_back(tmp_path / "plain")

    # Look-alikes on a worker's thread: calls named as module ranges, [memory] instants.
    dump_path = sorted((tmp_path / "kept").glob("b*.json"))
    dump_path = next(p for p in dump_path if not p.name.endswith(".meta.json"))
    dump = orjson.loads(dump_path.read_bytes())
    call = next(e for e in dump["traceEvents"] if e.get("ph") == "X")
    lookalikes = [
        {**call, "name": "[pl][module]torch.nn.modules.linear.Linear: layer", "cat": "user_annotation"},
        {**call, "name": "[pl][profile][Strategy]SingleDeviceStrategy.training_step"},
        {**{k: call[k] for k in ("pid", "tid", "ts")}, "ph": "i", "name": "[memory]", "s": "t",
         "args": {"Addr": 987654321, "Bytes": 64, "Device Type": 0, "Device Id": -1}},
    ]  # fmt: skip
    dump["traceEvents"] += lookalikes
    dump_path.write_bytes(orjson.dumps(dump))
    # A training-process [memory] event after the workers' calls (the gc pauses follow them).
    python = orjson.loads(Path(job.python_raw).read_bytes())
    main_call = next(e for e in python["traceEvents"] if e.get("ph") == "X")
    late = {**{k: main_call[k] for k in ("pid", "tid", "ts")}, "ph": "i", "name": "[memory]", "s": "t",
            "args": {"Addr": 123456789, "Bytes": 32, "Device Type": 0, "Device Id": -1}}  # fmt: skip
    job = dataclasses.replace(job, extras={**job.extras, "gc": {"events": [late]}})
    result, trace = finished_and_read_back(tmp_path / "lookalikes")
    snapshot = pickle.loads(Path(result.memory_path).read_bytes())
    addresses = {e["addr"] for device in snapshot["device_traces"] for e in device}
    assert {123456789, 987654321} <= addresses
    module = next(e for e in trace["traceEvents"] if e["name"] == lookalikes[0]["name"] and e["pid"] == call["pid"])
    assert module["cat"] == "FEE"  # a worker's call, never a module range of the Lightning view


def _kept_job(tmp_path: Path, monkeypatch) -> Any:
    """A real window's job, its raw dumps copied aside so it can be finished again."""
    from vt_lightning.controller import handoff
    from vt_lightning.export import pipeline

    monkeypatch.setattr(handoff, "USE_WRITER_PROCESS", False)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", 0.0)
    jobs = []

    def keep(job):
        kept = {field: tmp_path / Path(getattr(job, field)).name for field in ("torch_raw", "python_raw")}
        for field, path in kept.items():
            shutil.copyfile(getattr(job, field), path)
        jobs.append(dataclasses.replace(job, **kept))
        return pipeline.finish_window(job)

    monkeypatch.setattr(handoff, "finish_window", keep)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=1, dirpath=str(tmp_path / "logs"))
    make_trainer(tmp_path, [cb], max_steps=2).fit(CollectingModel(), loader())
    assert len(jobs) == 1
    return jobs[0]


def _gzip_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "vt_lightning-gzip"]


def test_the_trace_is_compressed_beside_the_summary_and_a_summary_fault_keeps_the_trace(tmp_path, monkeypatch):
    """The trace's gzip runs on a thread of its own while the summary is made (where fit waits
    for a held window, on the core training left idle). A summary that fails is a note: the trace
    and the memory snapshot are written all the same, no summary file is, no thread is left."""
    import threading

    from vt_lightning.export import atomic, pipeline

    job = _kept_job(tmp_path, monkeypatch)
    compressed_on: list[str] = []
    real_gzip = atomic.gzip_bytes

    def spy(data: bytes, level: int) -> bytes:
        compressed_on.append(threading.current_thread().name)
        return real_gzip(data, level)

    monkeypatch.setattr(atomic, "gzip_bytes", spy)
    whole = pipeline.finish_window(dataclasses.replace(job, run_dir=tmp_path / "whole", job_id=""))
    assert compressed_on == ["vt_lightning-gzip"] and threading.current_thread().name != "vt_lightning-gzip"
    assert whole.summary_path is not None and whole.summary_path.exists()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("summary broke")

    monkeypatch.setattr(pipeline, "summarize", broken)
    run_dir = tmp_path / "no-summary"
    result = pipeline.finish_window(dataclasses.replace(job, run_dir=run_dir, job_id=""))
    assert "summary not written (RuntimeError: summary broke)" in result.notes
    assert result.summary_path is None and not list(run_dir.glob("*.summary.*"))
    assert load_trace(result.trace_path)["traceEvents"] == load_trace(whole.trace_path)["traceEvents"]
    assert result.memory_path is not None and result.memory_path.read_bytes() == whole.memory_path.read_bytes()
    assert not _gzip_threads()


def test_a_memory_snapshot_fault_is_a_note_and_keeps_the_trace_and_the_summary(tmp_path, monkeypatch):
    """The memory snapshot is one of the window's optional files: a fault building it, or writing
    it, is one note in the result; the trace and the summary are written all the same."""
    from vt_lightning.export import pipeline

    job = _kept_job(tmp_path, monkeypatch)
    whole = pipeline.finish_window(dataclasses.replace(job, run_dir=tmp_path / "whole", job_id=""))
    assert whole.memory_path is not None and not whole.notes

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("snapshot broke")

    for name in ("build_cpu_snapshot", "write_snapshot"):
        with monkeypatch.context() as patch:
            patch.setattr(pipeline, name, broken)
            run_dir = tmp_path / name
            result = pipeline.finish_window(dataclasses.replace(job, run_dir=run_dir, job_id=""))
        assert result.notes == ("memory snapshot not written (RuntimeError: snapshot broke)",), name
        assert result.memory_path is None and not list(run_dir.glob("*.memory_snapshot.pickle")), name
        assert load_trace(result.trace_path)["traceEvents"] == load_trace(whole.trace_path)["traceEvents"]
        assert result.summary_path is not None and result.summary_path.exists(), name


def test_a_compression_fault_writes_no_trace_and_leaves_no_thread(tmp_path, monkeypatch):
    """A gzip that fails on its thread fails the window as it did on the caller's: the error
    reaches the writer, and nothing is written (no trace, no snapshot, no summary, no temporary)."""
    from vt_lightning.export import atomic, pipeline

    job = _kept_job(tmp_path, monkeypatch)

    def broken(data: bytes, level: int) -> bytes:
        raise MemoryError("no room to compress")

    monkeypatch.setattr(atomic, "gzip_bytes", broken)
    run_dir = tmp_path / "failed"
    with pytest.raises(MemoryError, match="no room to compress"):
        pipeline.finish_window(dataclasses.replace(job, run_dir=run_dir, job_id=""))
    assert not run_dir.exists() or not list(run_dir.iterdir())
    assert not _gzip_threads()
