"""The user's own code and environment never crash, hang or lose a run (issue 15).

Where a fault could crash or hang a process, the run happens in a subprocess
(``tests/scripts/fault/train.py``) whose exit status and wall time are asserted.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import orjson
import pytest
import torch
from conftest import MarkerModel, hooks_left, load_trace, loader, make_trainer, trace_files
from support.paths import REPO, SCRIPTS

from vt_lightning import VizTraceCallback
from vt_lightning.export.atomic import remove_stale_temporaries
from vt_lightning.export.layout import host_name
from vt_lightning.recording.rivals import guard_installed
from vt_lightning.recording.spool import PREFIX, Spool, default_spool_base, remove_dead_spools

SCRIPT = SCRIPTS / "fault" / "train.py"


def run_script(config: dict, timeout: float = 180, cwd: str | None = None) -> tuple[dict, float, str]:
    """Run one scenario; return (report, wall seconds, output). Fails on a crash or a hang."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    wall = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{output[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, output


def assert_clean(report: dict) -> None:
    assert not report["torch_profiler_enabled"]
    assert report["sys_getprofile"] is None and report["threading_getprofile"] is None
    assert not report["guard_installed"]


# ---------------------------------------------------------------- 1. a user's torch profiler


@pytest.mark.parametrize(
    "start, end, order",
    [
        (2, 2, "before"),  # around a warmup step
        (1, 2, "after"),  # from the wait step into the warmup
        (3, 3, "before"),  # around the first active step
        (4, 4, "after"),  # around a middle active step
        (4, 6, "before"),  # from mid-window past its end
    ],
)
def test_a_users_torch_profiler_at_any_moment_never_crashes_training(tmp_path, start, end, order):
    # Before this fix the same runs died with SIGSEGV (exit status -11) when the window stopped.
    user_trace = str(tmp_path / "user.json")
    report, wall, _output = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 1, "warmup": 2, "active": 3, "repeat": 2},
            "torch_profiler": [start, end, order, user_trace],
            "max_steps": 14,
        }
    )
    assert wall < 120
    assert report["train_batches"] == list(range(14))
    yields = [w for w in report["warnings"] if "a torch profiler started during a window" in w]
    assert len(yields) == 1, report["warnings"]
    with open(user_trace, "rb") as f:
        user_events = orjson.loads(f.read())["traceEvents"]
    assert any(e.get("name") == "aten::tanh" for e in user_events)  # the user's profiler worked
    # The yielded window is dropped; the next one is recorded as usual.
    assert [m["steps"] for m in report["metadata"]] == [[9, 10, 11]]
    assert_clean(report)


def test_a_users_torch_profiler_started_while_a_window_is_exported(tmp_path):
    # Window 0 ends at batch 5 and is exported on the writer thread while the user's profiler,
    # started at batch 6, records; window 1 (warmup from batch 7) meets it and is skipped.
    user_trace = str(tmp_path / "user.json")
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 1, "warmup": 2, "active": 3, "repeat": 2},
            "torch_profiler": [6, 8, "before", user_trace],
            "max_steps": 14,
        }
    )
    assert wall < 120 and report["train_batches"] == list(range(14))
    assert [m["steps"] for m in report["metadata"]] == [[3, 4, 5]]
    assert len([w for w in report["warnings"] if "already recording" in w]) == 1
    with open(user_trace, "rb") as f:
        assert any(e.get("name") == "aten::tanh" for e in orjson.loads(f.read())["traceEvents"])
    assert_clean(report)


# ---------------------------------------------------------------- 9. cProfile / sys.setprofile mid-window


def test_cprofile_started_mid_window_keeps_working_and_training_goes_on(tmp_path):
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 1, "warmup": 1, "active": 4, "repeat": 2},
            "cprofile": [3, 5],
            "max_steps": 14,
        }
    )
    assert wall < 120
    assert report["train_batches"] == list(range(14))
    # cProfile saw every step it ran over: the window's stop did not cut it off (3.11), and its
    # start did not raise "Another profiling tool is already active" (3.12+).
    assert report["cprofile_saw"] == ["batch_3", "batch_4", "batch_5"]
    assert len([w for w in report["warnings"] if "cProfile started during a window" in w]) == 1
    assert [m["steps"] for m in report["metadata"]] == [[8, 9, 10, 11]]
    assert_clean(report)


def _counted(i: int) -> int:
    return i * 2


@pytest.mark.parametrize(
    "when",
    [
        "warmup",  # in another callback, at the batch start of the window's warmup
        "first_active",  # in another callback, just before ours starts the first active batch
        "second_active",  # in another callback, while our tracer records
        "training_step",  # inside training_step, while our tracer records
    ],
)
def test_the_users_own_viztracer_records_everything_and_the_window_yields(tmp_path, when):
    from lightning.pytorch.callbacks import Callback
    from viztracer import VizTracer

    start_at = {"warmup": 1, "first_active": 2, "second_active": 3, "training_step": 3}[when]
    user: dict = {}

    class Model(MarkerModel):
        def training_step(self, batch, batch_idx):
            step = self.trainer.fit_loop.total_batch_idx
            if when == "training_step" and step == start_at:
                user["tracer"] = VizTracer(verbose=0)
                user["tracer"].start()
            if step in (3, 4):
                for i in range(1000):
                    _counted(i)
            return super().training_step(batch, batch_idx)

    class StartsViztracer(Callback):  # runs before ours: it comes first in the list
        def on_train_batch_start(self, trainer, *args):
            if when != "training_step" and trainer.fit_loop.total_batch_idx == start_at:
                user["tracer"] = VizTracer(verbose=0)
                user["tracer"].start()

    cb = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1)
    with pytest.warns(RuntimeWarning, match="VizTracer"):
        make_trainer(tmp_path, [StartsViztracer(), cb], max_steps=6).fit(Model(), loader(n=64))
    tracer = user["tracer"]
    tracer.stop()
    out = tmp_path / "user.json"
    tracer.save(str(out))
    names = [e.get("name", "") for e in orjson.loads(out.read_bytes())["traceEvents"]]
    assert sum(name.startswith("_counted") for name in names) == 2000  # before: 0 or 1000
    assert cb.results == [] and cb.windows_skipped == 1  # our window yielded to it
    assert not guard_installed() and sys.getprofile() is None
    # The user's VizTracer (theirs, not ours) installs a thread hook at construction on Python
    # <= 3.11 that its stop() leaves, and registers itself in builtins: the test takes both back,
    # so that the next test in this process starts clean.
    if getattr(threading.getprofile(), "__self__", None) is tracer:
        threading.setprofile(None)
    if builtins.__dict__.get("__viz_tracer__") is tracer:
        del builtins.__dict__["__viz_tracer__"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+: sys.setprofile does not displace VizTracer")
def test_a_profile_hook_set_mid_window_is_kept_and_the_window_yields(tmp_path):
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 1, "warmup": 1, "active": 4, "repeat": 1},
            "setprofile": [3, 5],
            "max_steps": 8,
        }
    )
    assert wall < 120
    assert report["train_batches"] == list(range(8))
    assert report["hook_still_set"] and report["hook_calls"] > 0
    assert len([w for w in report["warnings"] if "sys.setprofile hook" in w]) == 1
    assert report["metadata"] == []
    assert_clean(report)


# ---------------------------------------------------------------- 2. spool


def test_the_spool_is_on_disk_by_default_and_spool_dir_moves_it(tmp_path):
    report, _, _ = run_script(
        {"root": str(tmp_path / "a"), "callback": {"wait": 0, "warmup": 0, "active": 1}, "max_steps": 3}
    )
    assert report["spool_base"] == default_spool_base() and not report["spool_base"].startswith("/dev/shm")
    spool_dir = tmp_path / "my spool"
    report, _, _ = run_script(
        {
            "root": str(tmp_path / "b"),
            "callback": {"wait": 0, "warmup": 0, "active": 1, "spool_dir": str(spool_dir)},
            "max_steps": 3,
        }
    )
    assert report["spool_base"] == str(spool_dir) and Path(report["spool"]).parent == spool_dir
    assert len(report["windows_written"]) == 1
    assert list(spool_dir.iterdir()) == []  # its own spool directory is gone after the run


def test_a_full_spool_drops_the_window_naming_the_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(Spool, "free_bytes", lambda self: 10 * 2**20)
    spool_dir = tmp_path / "small-shm"
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2, spool_dir=str(spool_dir))
    model = MarkerModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=4).fit(model, loader())
    assert model.train_batches == [0, 1, 2, 3]
    full = [str(w.message) for w in caught if "spool directory" in str(w.message)]
    assert len(full) == 1 and str(spool_dir) in full[0] and "10 MB free" in full[0]
    assert "could not write the window" not in " ".join(str(w.message) for w in caught)
    assert not trace_files(tmp_path)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_dead_spools_are_removed_by_pid_and_age_never_a_live_ones(tmp_path):
    sleeper = _sleeper()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    try:
        host = host_name()
        old = time.time() - 3600
        made = {
            "dead_old": tmp_path / f"{PREFIX}{host}-{dead_pid}-aaaa",
            "dead_young": tmp_path / f"{PREFIX}{host}-{dead_pid}-bbbb",
            "live_old": tmp_path / f"{PREFIX}{host}-{sleeper.pid}-cccc",
            "other_host": tmp_path / f"{PREFIX}otherhost-{dead_pid}-dddd",
            "not_ours": tmp_path / "something-else",
        }
        for name, path in made.items():
            path.mkdir()
            (path / "w0.python.json").write_text("{}")
            if name != "dead_young":
                os.utime(path, (old, old))
        assert remove_dead_spools(str(tmp_path)) == 1
        assert not made["dead_old"].exists()
        assert all(made[k].exists() for k in ("dead_young", "live_old", "other_host", "not_ours"))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_killed_trainers_spool_is_cleaned_at_the_next_setup(tmp_path):
    spool_dir = tmp_path / "spool"
    config = {
        "root": str(tmp_path / "run"),
        "callback": {"wait": 0, "warmup": 0, "active": 2, "repeat": 0, "spool_dir": str(spool_dir)},
        "max_steps": 10,
        "kill_self_at": 5,
    }
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), json.dumps(config)], capture_output=True, timeout=180, env=env)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - start < 120
    (left,) = spool_dir.iterdir()  # the killed run's spool directory stayed behind
    old = time.time() - 3600
    os.utime(left, (old, old))
    report, _, _ = run_script({**config, "kill_self_at": None, "max_steps": 3})
    assert not left.exists()
    assert len(report["windows_written"]) == 2  # batches 0-1 and 2
    assert list(spool_dir.iterdir()) == []


# ---------------------------------------------------------------- 2b. a fault of ours


def test_a_fault_of_ours_mid_window_is_one_warning_and_exit_status_0(tmp_path):
    """A fault in an inner recording call while the window records (every tracer and hook on):
    the hook's boundary drops that window and says so once, the next window is written, nothing
    stays installed, and the process exits 0."""
    report, _, output = run_script(
        {
            "root": str(tmp_path),
            "max_steps": 10,
            "callback": {"wait": 1, "warmup": 1, "active": 2, "repeat": 2, "memory_snapshot": False},
            "fault_in": ["vt_lightning.recording.window:ProfilingWindow.step_end", 0],
        }
    )
    assert report["train_batches"] == list(range(10))
    faults = [w for w in report["warnings"] if "profiling failed" in w]
    assert faults == [
        "vt_lightning: profiling failed in on_train_batch_end (RuntimeError: injected into "
        "ProfilingWindow.step_end); the window it was recording, if any, was dropped with nothing of "
        "it left installed, and training goes on."
    ], report["warnings"]
    assert [Path(p).parent.name for p in report["windows_written"]] == ["window_001-batches_6-7"]
    assert_clean(report)
    assert report["monitoring_tools"] == [None] * len(report["monitoring_tools"]), report["monitoring_tools"]
    assert "Traceback" not in output


# ---------------------------------------------------------------- 3. a stuck writer


def test_a_stuck_writer_never_blocks_training_for_longer_than_writer_timeout(tmp_path):
    # Windows on every batch; the writer process is frozen (SIGSTOP, like a hung filesystem) once
    # window 0 is written. Windows 1 and 2 fill the queue, window 3 waits writer_timeout=2 s for room.
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 0, "warmup": 0, "active": 1, "repeat": 0, "writer_timeout": 2},
            "stop_writer_at": [1],
            "max_steps": 8,
        }
    )
    assert report["train_batches"] == list(range(8))
    assert report["fit_seconds"] < 30 and wall < 90
    stuck = [w for w in report["warnings"] if "writer_timeout=2 s" in w]
    assert "window 3 is dropped" in stuck[0]
    # Dropped windows are not reported again; at most one more line says the last windows, still
    # being written when fit ended, were dropped rather than wait again.
    assert stuck == report["warnings"] and len(stuck) <= 2, report["warnings"]
    (frozen,) = report["stopped_writers"]
    with pytest.raises(ProcessLookupError):
        os.kill(frozen, 0)  # killed and reaped
    steps = sorted(s for m in report["metadata"] for s in m["steps"])
    assert steps[0] == 0 and 3 not in steps
    assert_clean(report)


def test_a_run_waits_for_a_stuck_writer_once_in_all(tmp_path):
    # A hung filesystem: the writer is frozen at batch 1, and whatever writes next is frozen at batch
    # 5. Before, fit waited writer_timeout at window 3's start and again at its end (2 x 10 s); the
    # allowance is one writer_timeout per run, after which windows are written by the fallback thread
    # and never waited for.
    report, _, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 0, "warmup": 0, "active": 1, "repeat": 0, "writer_timeout": 10},
            "stop_writer_at": [1, 5],
            "max_steps": 8,
        }
    )
    assert report["train_batches"] == list(range(8))
    assert report["fit_seconds"] < 18, report["fit_seconds"]  # one 10 s wait, not two
    assert report["stopped_writers"] and len(report["stopped_writers"]) == 1  # no second writer process
    assert any("window 3 is dropped" in w for w in report["warnings"]), report["warnings"]
    assert_clean(report)


def test_a_writer_stuck_at_the_end_of_fit_holds_it_for_writer_timeout_at_most(tmp_path):
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 1, "warmup": 0, "active": 1, "repeat": 0, "writer_timeout": 3},
            "stop_writer_at": [3],
            "max_steps": 4,
        }
    )
    assert report["train_batches"] == [0, 1, 2, 3]
    assert report["fit_seconds"] < 3 + 20 and wall < 90
    assert len([w for w in report["warnings"] if "did not finish the last window" in w]) == 1
    assert len(report["warnings"]) == 1, report["warnings"]
    (frozen,) = report["stopped_writers"]
    with pytest.raises(ProcessLookupError):
        os.kill(frozen, 0)
    assert [m["steps"] for m in report["metadata"]] == [[1]]  # window 3 was dropped, window 1 kept


# ---------------------------------------------------------------- 4. metadata scales with what ran


def test_a_window_of_a_billion_batches_costs_only_the_batches_run(tmp_path):
    # With the schedule's batch lists in the metadata, this run needed 24 GB; the address-space
    # limit turns any such allocation into a MemoryError instead of an OOM kill.
    report, wall, _ = run_script(
        {
            "root": str(tmp_path),
            "callback": {"wait": 0, "warmup": 1, "active": 10**9},
            "max_steps": 20,
            "rlimit_as_gb": 12,
        }
    )
    assert wall < 120 and report["max_rss_mb"] < 2000
    (meta,) = report["metadata"]
    assert meta["steps"] == list(range(1, 20)) and meta["partial"] is True
    assert meta["scheduled_steps"] == [1, 10**9] and meta["warmup_steps"] == [0, 0]


# ---------------------------------------------------------------- 6. orphans


def test_a_writer_killed_mid_write_leaves_no_temporary_after_the_next_run(tmp_path):
    run_dir = tmp_path / "window_009-batches_90-90"  # a window of an earlier run
    run_dir.mkdir()
    code = (
        "import sys, time; from vt_lightning.export.atomic import atomic_write\n"
        "def slow(f):\n    f.write(b'half'); f.flush(); print('writing', flush=True); time.sleep(60)\n"
        f"atomic_write({str(run_dir / 'h_0.0000000000.pt.trace.json.gz')!r}, slow)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writers = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env) for _ in range(2)]
    try:
        for w in writers:
            assert w.stdout.readline().strip() == b"writing"
        writers[0].send_signal(signal.SIGKILL)  # killed mid-write, like an OOM kill
        writers[0].wait()
        temporaries = sorted(p.name for p in run_dir.iterdir())
        assert len(temporaries) == 2 and all(n.endswith(".tmp") for n in temporaries)
        cb = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=str(tmp_path))
        make_trainer(tmp_path, [cb], max_steps=1).fit(MarkerModel(), loader())
        left = [p.name for p in run_dir.iterdir()]
        assert left == [n for n in temporaries if f"-{writers[1].pid}." in n]  # the live writer's stays
    finally:
        for w in writers:
            w.kill()
            w.wait()
    assert remove_stale_temporaries(tmp_path) == 1  # and goes once its writer is gone
    assert not list(run_dir.iterdir())


# ---------------------------------------------------------------- 7. a planted module


def test_the_writer_process_never_imports_from_the_working_directory(tmp_path):
    marker = tmp_path / "PLANTED_CODE_RAN"
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    (workdir / "orjson.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n")
    report, _, output = run_script(
        {"root": str(tmp_path / "run"), "callback": {"wait": 0, "warmup": 0, "active": 1, "repeat": 2}, "max_steps": 4},
        cwd=str(workdir),
    )
    assert not marker.exists()
    assert len(report["windows_written"]) == 2
    assert "writer process stopped" not in output and "could not write" not in output


# ---------------------------------------------------------------- 8 and 10. shared directories


def test_two_runs_sharing_a_dirpath_keep_each_others_windows(tmp_path):
    shared = tmp_path / "shared"
    configs = [
        {
            "root": str(tmp_path / name),
            # no time budget: back-to-back windows on a loaded machine would outgrow it, and this test
            # is about names, not budgets
            "callback": {
                "wait": 0,
                "warmup": 0,
                "active": 1,
                "repeat": 6,
                "dirpath": str(shared),
                "budget_time_share": None,
            },
            "max_steps": 6,
        }
        for name in ("a", "b")
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), json.dumps(c)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        for c in configs
    ]
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    files = trace_files(shared)
    said = [(len(r["windows_written"]), r["warnings"]) for r in reports]
    assert len(files) == 12, said  # 6 windows each, none overwritten
    by_pid: dict[int, list[int]] = {}
    for path in files:
        meta = load_trace(path)["vt_lightning"]
        by_pid.setdefault(meta["pid"], []).extend(meta["steps"])
    assert sorted(sorted(v) for v in by_pid.values()) == [list(range(6))] * 2


def test_a_resumed_run_keeps_the_crashed_runs_partial_window(tmp_path):
    first = VizTraceCallback(wait=1, warmup=0, active=2, dirpath=str(tmp_path / "traces"))
    make_trainer(tmp_path, [first], max_steps=2).fit(MarkerModel(), loader())  # "crashed" inside it
    (partial,) = trace_files(tmp_path / "traces")
    before = partial.read_bytes()
    again = VizTraceCallback(wait=1, warmup=0, active=2, dirpath=str(tmp_path / "traces"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [again], max_steps=4).fit(MarkerModel(), loader())
    assert partial.read_bytes() == before
    (second,) = [p for p in trace_files(tmp_path / "traces") if p != partial]
    # A cut window is named by the batches it holds, so the resumed run's full window does not even
    # meet the crashed run's directory; a clash of equal names is the next tests' subject.
    assert (partial.parent.name, second.parent.name) == ("window_000-batches_1-1", "window_000-batches_1-2")
    assert not [w for w in caught if "run directory already taken" in str(w.message)]


def test_a_window_directory_planted_as_a_symlink_is_never_followed(tmp_path):
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "window_000-batches_1-1").symlink_to(attacker, target_is_directory=True)
    cb = VizTraceCallback(wait=1, warmup=0, active=1, dirpath=str(traces))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=2).fit(MarkerModel(), loader())
    assert list(attacker.iterdir()) == []
    (trace,) = trace_files(traces)
    assert trace.parent.name == "window_000-batches_1-1.2" and not trace.parent.is_symlink()
    assert len([w for w in caught if "run directory already taken" in str(w.message)]) == 1


# ---------------------------------------------------------------- 11. honest overflow advice


def test_following_the_overflow_advice_once_does_not_overflow_again(tmp_path):
    def run(entries: int, root: Path) -> VizTraceCallback:
        cb = VizTraceCallback(wait=1, warmup=1, active=3, tracer_entries=entries)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_trainer(root, [cb], max_steps=6).fit(MarkerModel(), loader())
        return cb

    (small,) = run(1000, tmp_path / "a").results
    assert small.overflow and small.suggested_tracer_entries
    (again,) = run(small.suggested_tracer_entries, tmp_path / "b").results
    assert not again.overflow
    assert again.python_events <= small.suggested_tracer_entries


# ---------------------------------------------------------------- 5. interrupts at every step


def _injection_targets() -> list[tuple[object, str]]:
    """Every call start/step/stop/close makes into the tracers, hooks and patches."""
    import torch.profiler.profiler as torch_profiler
    from viztracer import VizTracer

    import vt_lightning.controller.windows as windows
    import vt_lightning.recording.window as window
    from vt_lightning.controller.controller import WindowController
    from vt_lightning.recording.lightning_hooks import LightningViewHooks
    from vt_lightning.recording.pytracer import PythonTracer
    from vt_lightning.recording.rivals import RivalGuard
    from vt_lightning.recording.torchtracer import TorchTracer

    return [
        (windows, "open_window"),
        (WindowController, "_close"),
        (WindowController, "_hand_off"),
        (window.ProfilingWindow, "warmup"),
        (window.ProfilingWindow, "activate"),
        (window.ProfilingWindow, "step_begin"),
        (window.ProfilingWindow, "step_end"),
        (window.ProfilingWindow, "check_rivals"),
        (window.ProfilingWindow, "close"),
        (window.ProfilingWindow, "_stop_side_tools"),
        (window, "sample_pair"),
        (window, "emit_markers"),
        (TorchTracer, "prepare"),
        (TorchTracer, "start"),
        (TorchTracer, "check"),
        (TorchTracer, "step_begin"),
        (TorchTracer, "step_end"),
        (TorchTracer, "stop"),
        (TorchTracer, "_stop_session"),
        (torch_profiler._KinetoProfile, "prepare_trace"),
        (torch_profiler._KinetoProfile, "start_trace"),
        (torch_profiler._KinetoProfile, "stop_trace"),
        (torch.autograd.profiler.record_function, "__enter__"),
        (torch.autograd.profiler.record_function, "__exit__"),
        (PythonTracer, "start"),
        (PythonTracer, "rival"),
        (PythonTracer, "stop"),
        (PythonTracer, "dump"),
        (PythonTracer, "_release_thread_hook"),
        (VizTracer, "start"),
        (VizTracer, "stop"),
        (VizTracer, "clear"),
        (LightningViewHooks, "install"),
        (LightningViewHooks, "remove"),
        (RivalGuard, "install"),
        (RivalGuard, "remove"),
    ]


class Injector:
    """Raises ``exc`` just before (or just after) the ``at``-th call to any target."""

    def __init__(self, monkeypatch, exc: type[BaseException]) -> None:
        self.exc = exc
        self.calls: list[str] = []
        self.at: int | None = None
        self.after = False
        self.armed = False
        for owner, name in _injection_targets():
            original = getattr(owner, name)
            monkeypatch.setattr(owner, name, self._wrap(original, f"{getattr(owner, '__name__', owner)}.{name}"))

    def _wrap(self, original, label):
        injector = self

        ours = label.startswith(
            (
                "VizTraceCallback.",
                "WindowController.",
                "ProfilingWindow.",
                "vt_lightning.",
                "TorchTracer.",
                "PythonTracer.",
                "LightningViewHooks.",
                "RivalGuard.",
            )
        )

        def wrapper(*args, **kwargs):
            if (
                not injector.armed
                or threading.current_thread() is not threading.main_thread()
                or (not ours and not sys._getframe(1).f_globals.get("__name__", "").startswith("vt_lightning"))
            ):  # torch's and VizTracer's own calls count only where vt_lightning makes them
                return original(*args, **kwargs)
            index = len(injector.calls)
            injector.calls.append(label)
            if index == injector.at and not injector.after:
                injector.armed = False
                raise injector.exc(f"before {label}")
            result = original(*args, **kwargs)
            if index == injector.at and injector.after:
                injector.armed = False
                raise injector.exc(f"after {label}")
            return result

        return wrapper


def _leftovers(cb: VizTraceCallback, model) -> list[str]:
    problems = hooks_left(model)
    if cb._controller.python is not None and (cb._controller.python._lock.locked() or cb._controller.python.running):
        problems.append("python tracer lock held or running")
    try:
        zombie, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        zombie = 0
    if zombie:
        problems.append(f"unreaped child process {zombie}")
    return problems


# Seen on torch 2.4, 2.6 and 2.7 (the lowest declared versions, noxfile.py), not on 2.13: after the
# first fault injected here, every later window of the process is skipped, and torch's profiler stays
# unusable in this pytest process ("Can't disable Kineto profiler when it's not running" in later
# files). Versions 2.8-2.12 were not tried.
KINETO_RECOVERS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.skipif(not KINETO_RECOVERS, reason="torch < 2.13 does not recover from a fault mid-window")
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_at_any_step_of_start_step_stop_and_close_leaves_nothing_behind(tmp_path, monkeypatch, exc):
    # 63 calls here, each interrupted before and after: 126 runs per exception type.
    injector = Injector(monkeypatch, exc)

    def fit(root: Path, at: int | None, after: bool) -> tuple[VizTraceCallback, MarkerModel, bool]:
        cb = VizTraceCallback(wait=0, warmup=1, active=2, memory_snapshot=False)
        model = MarkerModel()
        trainer = make_trainer(root, [cb], max_steps=4)
        injector.calls, injector.at, injector.after, injector.armed = [], at, after, True
        previous = signal.getsignal(signal.SIGINT)
        interrupted = False
        try:
            trainer.fit(model, loader())
        except SystemExit:  # Lightning turns Ctrl+C into exit(1), after on_exception
            interrupted = True
        finally:
            injector.armed = False
            signal.signal(signal.SIGINT, previous)
        return cb, model, interrupted

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb, model, interrupted = fit(tmp_path / "clean", None, False)
        clean_calls = list(injector.calls)
        assert not interrupted and len(cb.results) == 1
        assert len(clean_calls) > 40, clean_calls  # every phase is covered
        assert {
            "VizTracer.start",
            "VizTracer.stop",
            "_KinetoProfile.prepare_trace",
            "_KinetoProfile.start_trace",
            "_KinetoProfile.stop_trace",
            "record_function.__enter__",
            "LightningViewHooks.install",
            "LightningViewHooks.remove",
            "RivalGuard.install",
            "PythonTracer.dump",
        } <= set(clean_calls)
        failures = []
        for at in range(len(clean_calls)):
            for after in (False, True):
                cb, model, interrupted = fit(tmp_path / f"i{at}{after:d}", at, after)
                problems = _leftovers(cb, model)
                if exc is KeyboardInterrupt and not interrupted:
                    problems.append("the interrupt did not reach Lightning")
                if exc is RuntimeError and (interrupted or model.train_batches != [0, 1, 2, 3]):
                    problems.append("a profiling error stopped training")
                if problems:
                    failures.append(f"{'after' if after else 'before'} call {at} ({clean_calls[at]}): {problems}")
        assert not failures, "\n".join(failures)
        cb, _, interrupted = fit(tmp_path / "again", None, False)  # and the next window records
        assert not interrupted and len(cb.results) == 1
