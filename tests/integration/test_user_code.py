"""The user's code is in the trace whatever the options and patterns (issue 12), on a real Trainer:
thread pools made before the window, the env switch beside a coded callback, reuse, short and cut
runs, validation inside a window, and the validate / test / predict stages."""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from conftest import (
    MarkerModel,
    batch_marker,
    load_trace,
    loader,
    make_trainer,
    marker_steps,
    overlaps_without_nesting,
    recorded_name,
    trace_files,
)
from support import tbcheck

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.merge import PYTHON_CATEGORY

RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"


def _cb(**options) -> VizTraceCallback:
    options = {"wait": 0, "warmup": 1, "active": 2, "repeat": 1, "memory_snapshot": False, **options}
    return VizTraceCallback(**options)


def _dirs(root: Path) -> list[str]:
    return sorted(p.parent.name for p in trace_files(root))


# ---------------------------------------------------------------- 2. threads alive before the window


def test_a_pool_made_before_the_window_is_traced_in_it_and_unhooked_after(tmp_path):
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="persistent-pool")
    pool.submit(int).result()  # its thread exists before training starts

    class PoolModel(MarkerModel):
        def training_step(self, batch, batch_idx):
            step = self.trainer.fit_loop.total_batch_idx
            pool.submit(batch_marker(1000 + step), torch.ones(4)).result()
            return super().training_step(batch, batch_idx)

    try:
        cb = _cb(profile_memory=False)  # torch records other threads' ops only without it
        make_trainer(tmp_path, [cb], max_steps=4).fit(PoolModel(), loader())
        after_fit = pool.submit(sys.getprofile).result()
        pool_thread = pool.submit(lambda: threading.current_thread().native_id).result()
    finally:
        pool.shutdown()
    assert after_fit is None  # no hook stays on the pool's thread
    trace = load_trace(trace_files(tmp_path)[0])
    assert marker_steps(trace) >= {1001, 1002, 1, 2}
    on_pool = [e for e in trace["traceEvents"] if e.get("cat") == PYTHON_CATEGORY and e.get("tid") == pool_thread]
    assert {e["name"].split(" ")[0] for e in on_pool} >= {"batch_1001", "batch_1002"}
    names = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    assert names[pool_thread].startswith("persistent-pool")
    assert overlaps_without_nesting(trace) == []


# ---------------------------------------------------------------- 3. the env switch beside a coded callback


@pytest.mark.skipif(
    not any(ep.value.startswith("vt_lightning") for ep in entry_points(group="lightning.pytorch.callbacks_factory")),
    reason="vt_lightning is not installed (its entry point is what VT_LIGHTNING switches on)",
)
def test_env_switch_beside_a_coded_callback_does_not_crash_and_warns_once(tmp_path, monkeypatch):
    monkeypatch.setenv("VT_LIGHTNING", "1")
    monkeypatch.setenv("VT_LIGHTNING_ACTIVE", "1")
    coded = _cb()
    with pytest.warns(RuntimeWarning) as caught:
        trainer = make_trainer(tmp_path, [coded], max_steps=4)
        mine = [cb for cb in trainer.callbacks if isinstance(cb, VizTraceCallback)]
        assert len(mine) == 2  # the env one was added by Lightning's entry point
        trainer.fit(MarkerModel(), loader())
    duplicate = [str(w.message) for w in caught if "VT_LIGHTNING is set" in str(w.message)]
    assert len(duplicate) == 1 and "VizTraceCallback(skip_first=0, wait=0, warmup=1, active=2" in duplicate[0]
    assert _dirs(tmp_path) == ["window_000-batches_1-2"]  # the coded one's schedule, written once


# ---------------------------------------------------------------- 4. reuse


def test_a_callback_reused_on_a_second_trainer_profiles_it(tmp_path, caplog):
    cb = _cb()
    make_trainer(tmp_path / "first", [cb], max_steps=4).fit(MarkerModel(), loader())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=RANK_ZERO_LOGGER):
        make_trainer(tmp_path / "second", [cb], max_steps=4).fit(MarkerModel(), loader())
    assert _dirs(tmp_path / "second") == ["window_000-batches_1-2"]
    assert marker_steps(load_trace(trace_files(tmp_path / "second")[0])) == {1, 2}
    assert len(cb.results) == 1
    message = next(r.getMessage() for r in caplog.records if "window trace(s)" in r.getMessage())
    assert message.startswith("vt_lightning: 1 window trace(s) in ") and "second" in message


@pytest.mark.parametrize("copy_by", ["pickle", "deepcopy"])
def test_a_callback_pickles_and_deep_copies_before_and_after_a_fit(tmp_path, copy_by):
    """``ddp_spawn`` pickles the Trainer with its callbacks, HPO tools deep-copy them: a copy keeps
    the options and starts with no runtime state, and it profiles its own fit."""
    import copy
    import pickle

    def copied(cb: VizTraceCallback) -> VizTraceCallback:
        return pickle.loads(pickle.dumps(cb)) if copy_by == "pickle" else copy.deepcopy(cb)

    cb = _cb(wait=1, trigger_file=True)  # armed triggers: their watch and clock stay behind too
    fresh = copied(cb)
    assert fresh.options == cb.options and fresh._controller is not cb._controller
    make_trainer(tmp_path / "first", [cb], max_steps=4).fit(MarkerModel(), loader())
    assert len(cb.results) == 1
    again = copied(cb)  # after a fit: its tracer, writer, results and locks stay with the original
    assert again.options == cb.options and again.results == [] and again.output_dir is None
    for name, callback in (("fresh", fresh), ("again", again)):
        make_trainer(tmp_path / name, [callback], max_steps=4).fit(MarkerModel(), loader())
        assert _dirs(tmp_path / name) == ["window_000-batches_2-3"] and len(callback.results) == 1


def test_a_second_fit_on_the_same_trainer_counts_the_schedule_from_its_own_first_batch(tmp_path):
    cb = _cb(repeat=2, wait=1)  # windows: warmup 1 / active 2-3, warmup 5 / active 6-7 of each fit
    trainer = make_trainer(tmp_path, [cb], max_steps=4)
    model = MarkerModel()
    trainer.fit(model, loader())
    trainer.fit_loop.epoch_loop.max_steps = 8
    trainer.fit(model, loader())
    assert _dirs(tmp_path) == ["window_000-batches_2-3", "window_000-batches_6-7"]  # fit 2: batches 4-7


# ---------------------------------------------------------------- 5. short and cut runs


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"max_steps": 2}, "ended during the first window's warmup (its batches 1-1); recording starts at its batch 2"),
        ({"fast_dev_run": True}, "fit ran 1 training batch(es), and the first window's warmup starts at its batch 1"),
    ],
)
def test_a_run_too_short_for_any_window_says_so_in_one_line(tmp_path, caplog, kwargs, why):
    cb = VizTraceCallback(memory_snapshot=False)  # wait=1, warmup=1, active=3
    with caplog.at_level(logging.INFO, logger=RANK_ZERO_LOGGER):
        make_trainer(tmp_path, [cb], **{"max_steps": 10, **kwargs}).fit(MarkerModel(), loader())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vt_lightning:")]
    assert len(lines) == 1 and lines[0].startswith("vt_lightning: no window was recorded: ") and why in lines[0]
    assert trace_files(tmp_path) == []


def test_a_window_cut_by_max_steps_is_named_by_what_it_holds_and_warns_once(tmp_path):
    cb = _cb(active=5)  # scheduled active batches 1-5; max_steps=4 ends after batch 3
    with pytest.warns(RuntimeWarning) as caught:
        make_trainer(tmp_path, [cb], max_steps=4).fit(MarkerModel(), loader())
    cut = [str(w.message) for w in caught if "cut short" in str(w.message)]
    assert len(cut) == 1
    assert "holds batches 1-3 of the scheduled 1-5, because training ended first (max_steps" in cut[0]
    assert _dirs(tmp_path) == ["window_000-batches_1-3"]
    trace = load_trace(trace_files(tmp_path)[0])
    assert marker_steps(trace) == {1, 2, 3}
    assert trace["vt_lightning"]["partial"] is True and trace["vt_lightning"]["steps"] == [1, 2, 3]


# ---------------------------------------------------------------- 7. validation inside a window


def test_validation_inside_a_window_is_its_own_range_and_in_the_metadata(tmp_path):
    cb = _cb(active=3)  # active batches 1-3; validation runs after batch 1 (and after 3: window closed)
    trainer = make_trainer(tmp_path, [cb], max_steps=4, limit_val_batches=2, val_check_interval=2)
    trainer.fit(MarkerModel(), loader(), loader(n=8))
    trace = load_trace(trace_files(tmp_path)[0])
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    (validation,) = [e for e in events if e["name"] == "[pl][profile]validation"]
    (step,) = [e for e in events if e["name"] == "ProfilerStep#2"]
    assert step["ts"] <= validation["ts"] and validation["ts"] + validation["dur"] <= step["ts"] + step["dur"]
    ours = f"{recorded_name('MarkerModel.validation_step')} ({MarkerModel.validation_step.__code__.co_filename}:"
    inside = [e for e in events if e.get("cat") == PYTHON_CATEGORY and e["name"].startswith(ours)]
    assert len(inside) == 2
    assert all(validation["ts"] <= e["ts"] <= validation["ts"] + validation["dur"] for e in inside)
    (logged,) = trace["vt_lightning"]["validation"]
    assert logged["in_step"] == 2 and logged["duration_ms"] > 0
    assert validation["cat"] == "cpu_op"  # part of the Lightning view's stage timeline
    profile = tbcheck.parse_trace(trace_files(tmp_path)[0])  # the real plugin accepts the range
    assert tbcheck.OVERVIEW in set(tbcheck.views(profile))
    tbcheck.exercise_views(profile)
    assert overlaps_without_nesting(trace) == []


# ---------------------------------------------------------------- 8. other stages


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_other_stages_run_the_schedule_on_their_own_batches(tmp_path, stage):
    class AllStages(MarkerModel):
        def _eval(self, batch, batch_idx):
            (x,) = batch
            return batch_marker(batch_idx)(x).sum()

        validation_step = test_step = predict_step = _eval

    cb = _cb(stages=["fit", stage])
    trainer = make_trainer(tmp_path, [cb], max_steps=4, limit_val_batches=None)
    getattr(trainer, stage)(AllStages(), loader(n=24))
    assert _dirs(tmp_path) == [f"{stage}-window_000-batches_1-2"]
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    assert marker_steps(trace) == {1, 2}
    assert trace["vt_lightning"]["stage"] == stage
    assert {e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")} == {
        "ProfilerStep#1",
        "ProfilerStep#2",
    }
    profile = tbcheck.parse_trace(path)  # the real TensorBoard plugin loads it
    assert tbcheck.OVERVIEW in set(tbcheck.views(profile))
    tbcheck.exercise_views(profile)
    assert overlaps_without_nesting(trace) == []


def test_stages_left_out_are_not_profiled(tmp_path):
    cb = _cb()  # default: fit only
    make_trainer(tmp_path, [cb], limit_val_batches=None).validate(MarkerModel(), loader())
    assert trace_files(tmp_path) == []


def test_a_validate_run_too_short_for_any_window_says_so(tmp_path, caplog):
    cb = VizTraceCallback(memory_snapshot=False, stages=["validate"])  # first active batch: 2
    with caplog.at_level(logging.INFO, logger=RANK_ZERO_LOGGER):
        make_trainer(tmp_path, [cb], limit_val_batches=2).validate(MarkerModel(), loader())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vt_lightning:")]
    assert lines == [
        "vt_lightning: no window was recorded: validate ran 2 validate batch(es) and ended during the first "
        "window's warmup (its batches 1-1); recording starts at its batch 2. Lower `warmup`, or run more batches."
    ]
    assert trace_files(tmp_path) == []
