"""DataLoader workers traced only for a window's batches (issue 23; recording/workers.py).

Each test runs a real ``Trainer.fit`` in a subprocess (``SCRIPT`` below): 24 samples, batch size 2,
``limit_train_batches=10``, two epochs, ``num_workers=2``; one window, active on global batches 4-7
(dataset indices 8-15 in epoch 0), or on 8-11 across the epoch boundary. The dataset's
``vt_recognisable_getitem`` appends one line per sample to ``fetch-<pid>.txt``: the index, whether
a profile hook was installed in the worker right then, whether the user's ``worker_init_fn`` had
run, the wall time (ns) at entry, and whether Lightning's worker seeding had reseeded torch.
Spawned workers take seconds to start on a loaded machine, so only one test spawns.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vt_lightning.analysis.schedule import Schedule
from vt_lightning.analysis.workers import (
    global_batch,
    plan_ranges,
    range_of,
    upcoming_ranges,
    worker_to_main_us,
)
from vt_lightning.constants import SUMMARY_JSON_SUFFIX
from vt_lightning.export.atomic import scheduler_state
from vt_lightning.export.worker_dumps import wait_for_parts
from vt_lightning.recording.worker_plan import SharedPlan

pytestmark = pytest.mark.serial  # DataLoader workers started, killed and timed against training

RUN_TIMEOUT = 180  # s: a run takes ~5 s with forked workers, ~25 s spawned, on a loaded 2-core box
WINDOW_BATCHES = [4, 5, 6, 7]  # skip_first=0: inside epoch 0
WINDOW_INDICES = list(range(8, 16))  # batch size 2, no shuffling
ACROSS_EPOCHS = {"skip_first": 4}  # active batches 8-11: the last two of epoch 0, the first two of epoch 1
ACROSS_BATCHES = [8, 9, 10, 11]
ACROSS_INDICES = [0, 1, 2, 3, 16, 17, 18, 19]
CLOCK_TOLERANCE_US = 2000.0  # a worker's call vs the wall time it read on entry (measured: 1-2 µs)

SCRIPT = r"""
import json, os, sys, time
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset, get_worker_info

OUT = sys.argv[1]
CFG = json.loads(sys.argv[2])
INIT_RAN = {"value": False}


def user_worker_init(worker_id):
    INIT_RAN["value"] = True


def _profile_hook_installed():  # VizTracer's hook: sys.setprofile up to 3.11, sys.monitoring from 3.12
    if sys.version_info >= (3, 12):
        return sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is not None
    return sys.getprofile() is not None


class RecognisableDataset(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, index):
        return self.vt_recognisable_getitem(index)

    def vt_recognisable_getitem(self, index):
        entered = time.time_ns()
        if index == CFG["kill_at"]:
            # Die only once training has entered the batch named by "die_after" (its marker file):
            # a worker prefetches up to 4 batches ahead, so on a loaded machine it reached this one
            # before the window opened, and no window was written.
            deadline = time.monotonic() + 60
            marker = os.path.join(OUT, "training-reached")
            while CFG["die_after"] >= 0 and not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(3)
        profiled = int(_profile_hook_installed())
        seeded = int(torch.initial_seed() != get_worker_info().seed)  # Lightning's pl_worker_init_function
        with open(os.path.join(OUT, f"fetch-{os.getpid()}.txt"), "a") as f:
            f.write(f"{index} {profiled} {int(INIT_RAN['value'])} {entered} {seeded}\n")
        return torch.full((4,), float(index))


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == CFG["die_after"]:
            open(os.path.join(OUT, "training-reached"), "w").close()
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    if CFG["seed"]:
        pl.seed_everything(7, workers=True)
    loader = DataLoader(
        RecognisableDataset(), batch_size=2, num_workers=2, persistent_workers=CFG["persistent"],
        multiprocessing_context=CFG["method"], worker_init_fn=None if CFG["seed"] else user_worker_init,
    )
    callbacks = []
    if CFG["trace"]:
        from vt_lightning import VizTraceCallback

        callbacks.append(
            VizTraceCallback(skip_first=CFG["skip_first"], wait=3, warmup=1, active=4, repeat=1, memory_snapshot=False)
        )
    trainer = pl.Trainer(
        max_epochs=2, limit_train_batches=10, callbacks=callbacks, default_root_dir=OUT, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, accelerator="cpu", devices=1,
    )
    trainer.fit(Model(), loader)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump({"traces": [str(r.trace_path) for r in callbacks[0].results] if CFG["trace"] else []}, f)
"""


def run_fit(tmp: Path, **overrides: Any) -> dict[str, Any]:
    """Run the script; its exit status, output, wall time and the fetch records."""
    config = {
        "persistent": False,
        "method": "fork",
        "kill_at": -1,
        "die_after": -1,
        "trace": True,
        "seed": False,
        "skip_first": 0,
    }
    config.update(overrides)
    out = tmp / "out"
    out.mkdir(parents=True)
    script = tmp / "train_workers.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)}
    env.pop("VT_LIGHTNING", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), str(out), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=env,
    )
    fetches: dict[int, list[tuple[int, ...]]] = {}
    for path in out.glob("fetch-*.txt"):
        pid = int(path.stem.split("-")[1])
        fetches[pid] = [tuple(int(v) for v in line.split()) for line in path.read_text().splitlines()]
    results = out / "results.json"
    return {
        "code": proc.returncode,
        "output": proc.stdout + proc.stderr,
        "seconds": time.monotonic() - started,
        "fetches": fetches,
        "traces": json.loads(results.read_text())["traces"] if results.exists() else [],
        "out": out,
        "tmp": tmp,
    }


def trace_of(run: dict[str, Any]) -> dict[str, Any]:
    assert run["code"] == 0, run["output"][-3000:]
    assert len(run["traces"]) == 1, run["output"][-3000:]
    with gzip.open(run["traces"][0]) as f:
        return json.load(f)


def worker_processes(trace: dict[str, Any]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name" and "DataLoader worker" in e["args"]["name"]
    }


def fetched_batches(trace: dict[str, Any]) -> dict[int, list[int]]:
    """Worker pid -> the ``fetch batch N`` spans it has in the trace."""
    out: dict[int, list[int]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("fetch batch "):
            out.setdefault(e["pid"], []).append(int(e["name"].rsplit(" ", 1)[1]))
    return out


def profiled_indices(run: dict[str, Any]) -> list[int]:
    return sorted(line[0] for lines in run["fetches"].values() for line in lines if line[1])


def check_window_traced(run: dict[str, Any], batches: list[int], indices: list[int]) -> dict[str, Any]:
    """What every traced run shows: worker processes with the window's batches and calls, only those."""
    trace = trace_of(run)
    names = worker_processes(trace)
    assert set(names.values()) == {"rank 0 · DataLoader worker 0", "rank 0 · DataLoader worker 1"}
    sort_index = {
        e["pid"]: e["args"]["sort_index"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_sort_index" and isinstance(e.get("pid"), int)
    }
    main_pid = next(e["pid"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert all(sort_index[pid] > sort_index[main_pid] for pid in names)  # listed after the main process
    fetched = fetched_batches(trace)
    assert set(fetched) == set(names)
    assert sorted(b for per_worker in fetched.values() for b in per_worker) == batches
    # The workers' calls of the recognisable function: in the worker processes, one per sample of the
    # window's batches, and the profile hook was in place in the workers for exactly those samples.
    calls = [e for e in trace["traceEvents"] if "vt_recognisable_getitem" in str(e.get("name", ""))]
    assert {e["pid"] for e in calls} == set(names)
    assert len(calls) == len(indices)
    assert profiled_indices(run) == indices
    # Each call sits on the timeline where the worker's wall clock put it (the clocks are converted right).
    base_ns = int(trace["baseTimeNanoseconds"])
    placed = sorted(base_ns / 1000 + float(e["ts"]) for e in calls)
    entered = sorted(line[3] / 1000 for lines in run["fetches"].values() for line in lines if line[1])
    assert all(abs(a - b) < CLOCK_TOLERANCE_US for a, b in zip(placed, entered)), list(zip(placed, entered))
    return trace


@pytest.mark.parametrize(
    ("persistent", "schedule", "batches", "indices"),
    [(False, {}, WINDOW_BATCHES, WINDOW_INDICES), (True, ACROSS_EPOCHS, ACROSS_BATCHES, ACROSS_INDICES)],
    ids=["non-persistent", "persistent-across-epochs"],
)
def test_forked_workers_are_traced_for_the_window_batches_only(tmp_path, persistent, schedule, batches, indices):
    run = run_fit(tmp_path, persistent=persistent, **schedule)
    check_window_traced(run, batches, indices)
    lines = [line for lines in run["fetches"].values() for line in lines]
    assert len(lines) >= 2 * 20  # both epochs ran (20 batches' samples, plus what workers fetched ahead)
    assert all(line[2] == 1 for line in lines)  # the user's worker_init_fn ran in every worker, every epoch
    summary_path = next(Path(run["traces"][0]).parent.glob(f"*{SUMMARY_JSON_SUFFIX}"))
    workers = json.loads(summary_path.read_text())["workers"]
    assert sorted(b for w in workers["workers"] for b in w["batches"]) == batches
    assert all(w["busy_ms"] > 0 for w in workers["workers"])
    assert workers["top_python"][0]["origin"] == "user"
    assert any(e["function"].endswith("vt_recognisable_getitem") for e in workers["top_python"])
    assert workers["missing"] == []
    shown = subprocess.run(
        [sys.executable, "-m", "vt_lightning", "summary", str(run["out"])], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "rank 0 · DataLoader worker 1" in shown.stdout and "vt_recognisable_getitem" in shown.stdout


def test_spawned_persistent_workers_keep_lightnings_seeding(tmp_path):
    run = run_fit(tmp_path, persistent=True, method="spawn", seed=True)
    check_window_traced(run, WINDOW_BATCHES, WINDOW_INDICES)
    lines = [line for lines in run["fetches"].values() for line in lines]
    assert lines and all(line[4] == 1 for line in lines)  # pl_worker_init_function reseeded every worker


def test_no_worker_tracer_outside_windows(tmp_path):
    run = run_fit(tmp_path, skip_first=1000)  # the window never comes
    assert run["code"] == 0, run["output"][-3000:]
    assert run["traces"] == []
    assert run["fetches"] and profiled_indices(run) == []  # no profile hook in any worker, ever


def test_a_killed_worker_loses_only_its_own_events(tmp_path):
    """Worker 1 dies (``os._exit``) fetching batch 7, after it traced batch 5 and once training
    has reached the window's batch 5; worker 0 traced 4 and 6."""
    baseline = run_fit(tmp_path / "without", trace=False, kill_at=15, die_after=5)
    traced = run_fit(tmp_path / "with", kill_at=15, die_after=5)
    assert baseline["code"] != 0  # the DataLoader reports the dead worker: training fails...
    assert traced["code"] == baseline["code"], traced["output"][-3000:]  # ...the same way with the callback
    assert traced["seconds"] < 120
    dead = next(pid for pid, lines in traced["fetches"].items() if any(line[0] == 10 for line in lines))
    (path,) = traced["out"].glob("window_*/*.pt.trace.json.gz")  # the window is written, cut short
    with gzip.open(path) as f:
        trace = json.load(f)
    assert dead not in {e.get("pid") for e in trace["traceEvents"]}  # its events died with it
    names = worker_processes(trace)
    assert list(names.values()) == ["rank 0 · DataLoader worker 0"]  # the live worker's are there
    assert 4 in fetched_batches(trace)[next(iter(names))]
    missing = trace["vt_lightning"]["workers"]["missing"]
    assert len(missing) == 1 and str(dead) in missing[0] and "exited or was killed" in missing[0]


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet (a worker its DataLoader has not joined)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.exists() and scheduler_state(stat.read_bytes()) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    return child


def test_the_writer_waits_for_live_workers_and_not_for_dead_ones(tmp_path):
    """``wait_for_parts``: a complete part is taken, a dead (or exited, unreaped) worker's part is
    given up at once, a live worker's unfinished part after the bounded wait."""
    live = os.getpid()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = _zombie()
    try:
        pids = (live, dead.pid, live, zombie.pid)
        stems = [str(tmp_path / f"b4-r0-w{i}-p{pid}-1") for i, pid in enumerate(pids)]
        Path(f"{stems[0]}.meta.json").write_text("{}")
        started = time.monotonic()
        complete, notes = wait_for_parts(stems, wait_s=0.5)
        waited = time.monotonic() - started
    finally:
        zombie.wait()
    assert complete == [stems[0]]
    assert 0.4 < waited < 30
    assert any(str(dead.pid) in n and "exited or was killed" in n for n in notes)
    assert any(str(zombie.pid) in n and "exited or was killed" in n for n in notes)
    assert any(str(live) in n and "still busy" in n for n in notes)


def test_a_workers_clock_maps_onto_the_training_processs_through_the_monotonic_clock():
    """Each process's VizTracer clock has its own zero (a spawned worker's is its own import) and
    its own tick rate; both are read beside ``time.monotonic_ns``, which they share."""
    # Training process: VizTracer µs = monotonic µs - 1000 s. Worker: its µs 100 is monotonic
    # 1_005_000_100 µs, and it ticks 1e-4 fast (100_010 of its µs per 100_000 µs).
    main = [(1_000_000.0, 1_001_000_000_000), (1_100_000.0, 1_001_100_000_000)]
    worker = [(100.0, 1_005_000_100_000), (100_110.0, 1_005_100_100_000)]
    to_main = worker_to_main_us(worker, main)
    assert to_main(100.0) == pytest.approx(5_000_100.0, abs=1e-3)
    # Half-way through the worker's readings: the tick rate is corrected, not only the offset.
    assert to_main(50_105.0) == pytest.approx(5_050_100.0, abs=1e-3)


def test_the_plan_holds_the_next_windows_and_a_reader_sees_each_publication(tmp_path):
    schedule = Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=3)  # active 4-5, 8-9, 12-13
    assert upcoming_ranges(schedule, 0) == [(4, 6), (8, 10), (12, 14)]
    assert upcoming_ranges(schedule, 6) == [(8, 10), (12, 14)]
    assert upcoming_ranges(schedule, 5) == [(4, 6), (8, 10), (12, 14)]  # a window still going is kept
    assert plan_ranges([(8, 10)], pinned=[(30, 31)]) == [(30, 31), (8, 10)]
    writer = SharedPlan(str(tmp_path / "plan"), create=True)
    reader = SharedPlan(writer.path, create=False)
    writer.publish(20, 10, [(24, 26), (28, 30)])
    assert reader.read() == (20, 10, [(24, 26), (28, 30)])
    writer.publish(30, 10, [])
    assert reader.read() == (30, 10, [])
    # Task 4 of the epoch starting at batch 20 is batch 24; past the epoch's 10 batches, no batch.
    assert range_of([(24, 26)], global_batch(20, 10, 4)) == (24, 26)
    assert global_batch(20, 10, 10) is None
    reader.close()
    writer.close()
