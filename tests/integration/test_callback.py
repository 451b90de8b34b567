"""A real Lightning Trainer on CPU: windows, steps, files and directories as promised."""

from __future__ import annotations

import re
import socket
import sys
import threading

import pytest
import torch
from conftest import (
    MARKER,
    MarkerModel,
    load_trace,
    loader,
    make_trainer,
    marker_steps,
    overlaps_without_nesting,
    trace_files,
)

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.schedule import Schedule
from vt_lightning.export.layout import TRACE_PATTERN


def _fit(tmp_path, max_steps=12, **schedule):
    cb = VizTraceCallback(**schedule)
    model = MarkerModel()
    trainer = make_trainer(tmp_path, [cb], max_steps=max_steps)
    trainer.fit(model, loader())
    return cb, model, trainer


@pytest.mark.parametrize(
    "schedule, max_steps",
    [
        (dict(wait=1, warmup=1, active=2, repeat=2), 12),
        (dict(skip_first=3, wait=0, warmup=1, active=1, repeat=3), 12),
        (dict(wait=2, warmup=0, active=1, repeat=0), 10),  # repeat=0: until training ends
    ],
)
def test_one_trace_per_window_with_exactly_the_active_batches(tmp_path, schedule, max_steps):
    cb, _model, _trainer = _fit(tmp_path, max_steps=max_steps, **schedule)
    expected = [w for w in Schedule(**schedule).windows_until(max_steps) if w.end <= max_steps]
    files = trace_files(tmp_path)
    assert len(files) == len(expected)
    for window, path in zip(expected, files, strict=True):
        trace = load_trace(path)
        meta = trace["vt_lightning"]
        assert meta["window"] == window.index
        assert meta["steps"] == list(window.active_steps)
        assert meta["partial"] is False
        # Python events come from the active batches and no other batch.
        assert marker_steps(trace) == set(window.active_steps)
        steps = sorted(
            int(e["name"].split("#")[1]) for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")
        )
        assert steps == list(window.active_steps)
    assert sys.getprofile() is None and threading.getprofile() is None
    assert cb._controller.python.installed_hooks() == []
    assert not torch.autograd.profiler._is_profiler_enabled


def test_files_land_in_one_run_directory_per_window_under_the_logger_dir(tmp_path):
    cb, _, _trainer = _fit(tmp_path, max_steps=12, wait=1, warmup=1, active=2, repeat=2)
    version_dir = tmp_path / "lightning_logs" / "version_0"
    assert cb.output_dir == version_dir
    run_dirs = sorted(p for p in version_dir.iterdir() if p.is_dir())
    assert [p.name for p in run_dirs] == ["window_000-batches_2-3", "window_001-batches_6-7"]
    host = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname())
    for run_dir, span in zip(run_dirs, ("0000000002", "0000000006"), strict=True):
        names = sorted(p.name for p in run_dir.iterdir())
        assert f"{host}_0.{span}.pt.trace.json.gz" in names
        assert not [n for n in names if n.endswith(".tmp")]
        match = TRACE_PATTERN.match(f"{host}_0.{span}.pt.trace.json.gz")
        assert match and match.group(1) == f"{host}_0" and match.group(2) == f".{span}"


def test_dirpath_overrides_the_logger_dir(tmp_path):
    target = tmp_path / "elsewhere"
    cb = VizTraceCallback(wait=0, warmup=1, active=1, repeat=1, dirpath=str(target))
    make_trainer(tmp_path / "root", [cb], max_steps=4).fit(MarkerModel(), loader())
    assert [p.parent.name for p in trace_files(target)] == ["window_000-batches_1-1"]
    assert not trace_files(tmp_path / "root")


def test_trace_obeys_the_plugin_contract(tmp_path):
    _fit(tmp_path, max_steps=6, wait=1, warmup=1, active=2, repeat=1)
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    keys = list(trace)
    assert keys[-1] == "traceEvents"
    for key in ("schemaVersion", "deviceProperties", "baseTimeNanoseconds", "vt_lightning"):
        assert key in trace
    for event in trace["traceEvents"]:
        assert isinstance(event.get("name"), str)
        if event.get("ph") == "X":
            assert isinstance(event["cat"], str) and "ts" in event and "dur" in event
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"FEE", "cpu_op", "user_annotation"} <= cats
    assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])
    assert not [e for e in trace["traceEvents"] if e["name"].startswith("vt_lightning::clock")]  # markers used up
    meta = trace["vt_lightning"]
    assert meta["version"] and meta["overflow"] is False
    assert meta["tracer"]["tracer_entries"] == 1_000_000
    assert set(meta["calibration"]) >= {"offset_us", "uncertainty_us", "drift_us", "method"}


def test_python_ops_nest_inside_their_python_caller(tmp_path):
    _fit(tmp_path, max_steps=6, wait=1, warmup=1, active=2, repeat=1)
    trace = load_trace(trace_files(tmp_path)[0])
    markers = [e for e in trace["traceEvents"] if e.get("cat") == "FEE" and MARKER.match(e["name"])]
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::tanh"]
    assert len(markers) == 2 and len(ops) == 2
    for marker, op in zip(sorted(markers, key=lambda e: e["ts"]), sorted(ops, key=lambda e: e["ts"]), strict=True):
        assert marker["tid"] == op["tid"]
        assert marker["ts"] <= op["ts"] and op["ts"] + op["dur"] <= marker["ts"] + marker["dur"]


def test_no_hook_outside_windows(tmp_path):
    # The tracer says which of its hooks are in place: the profile hook on <= 3.11, its
    # sys.monitoring tool on 3.12+ (where sys.getprofile() shows nothing either way).
    seen: list[object] = []
    cb = VizTraceCallback(wait=2, warmup=1, active=2, repeat=1)

    class Probe(MarkerModel):
        def training_step(self, batch, batch_idx):
            hooks = cb._controller.python.installed_hooks() if cb._controller.python is not None else []
            seen.append((self.trainer.fit_loop.total_batch_idx, hooks, sys.getprofile(), threading.getprofile()))
            return super().training_step(batch, batch_idx)

    make_trainer(tmp_path, [cb], max_steps=8).fit(Probe(), loader())
    assert [step for step, *_ in seen] == list(range(8))
    for step, hooks, hook, thread_hook in seen:
        if step in (3, 4):
            assert hooks, step
        else:
            assert hooks == [] and hook is None and thread_hook is None, (step, hooks)
    assert not cb._controller.python.hooks_installed()


def test_sanity_check_and_validation_batches_do_not_count(tmp_path):
    cb = VizTraceCallback(wait=1, warmup=0, active=2, repeat=2)
    trainer = make_trainer(
        tmp_path, [cb], max_steps=8, limit_val_batches=2, num_sanity_val_steps=2, val_check_interval=2
    )
    trainer.fit(MarkerModel(), loader(), loader(n=8))
    metas = [load_trace(p)["vt_lightning"] for p in trace_files(tmp_path)]
    assert [m["steps"] for m in metas] == [[1, 2], [4, 5]]


def test_window_cut_short_by_max_steps_keeps_the_steps_it_got(tmp_path):
    cb, _, _ = _fit(tmp_path, max_steps=4, wait=1, warmup=1, active=4, repeat=1)
    (path,) = trace_files(tmp_path)
    meta = load_trace(path)["vt_lightning"]
    assert meta["steps"] == [2, 3] and meta["partial"] is True
    assert sys.getprofile() is None and cb._controller.python.installed_hooks() == []


def test_every_thread_nests_strictly_as_perfetto_requires(tmp_path):
    # Steps, Lightning-view ranges and record_functions start inside the Python call that opens
    # them; the merge cuts such calls so nothing overlaps without nesting (Perfetto would drop it).
    class WithRanges(MarkerModel):
        def training_step(self, batch, batch_idx):
            with torch.autograd.profiler.record_function("user-range"):
                return super().training_step(batch, batch_idx)

    cb = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1)
    make_trainer(tmp_path, [cb], max_steps=6).fit(WithRanges(), loader())
    trace = load_trace(trace_files(tmp_path)[0])
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"user-range", "ProfilerStep#3"} <= names and any(n.startswith("[pl][module]") for n in names)
    assert overlaps_without_nesting(trace) == []
    assert trace["vt_lightning"]["nesting"]["cut_at_annotations"] > 0
    cut = [e for e in trace["traceEvents"] if "vt_lightning.dur" in e.get("args", {})]
    assert cut and all(e["dur"] <= e["args"]["vt_lightning.dur"] for e in cut)


def test_quiet_batches_cost_one_comparison_and_allocate_nothing(tmp_path):
    import itertools
    import tracemalloc

    cb = VizTraceCallback(skip_first=1000, wait=1, warmup=1, active=1)
    trainer = make_trainer(tmp_path, [cb], max_steps=700)
    trainer.fit(MarkerModel(), loader(n=4 * 700))  # the global batch count is now in the hundreds
    cb._controller.next_look = 10**6  # as during a long quiet stretch
    start, end = cb.on_train_batch_start, cb.on_train_batch_end
    for _ in range(10):  # warm up attribute caches
        start(trainer, None, None, 0)
        end(trainer, None, None, None, 0)
    repeat = itertools.repeat

    def growth(calls: int) -> tuple[int, int]:
        """(peak, kept) bytes allocated over ``calls`` quiet batches."""
        tracemalloc.start()
        for _ in repeat(None, 10):
            start(trainer, None, None, 0)
            end(trainer, None, None, None, 0)
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for _ in repeat(None, calls):
            start(trainer, None, None, 0)
            end(trainer, None, None, None, 0)
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return peak - base, current - base

    if sys.version_info >= (3, 11):
        assert growth(1000)[0] == growth(0)[0]  # the hooks allocate nothing
    else:
        # Python 3.10 heap-allocates frames and its peak wanders by a few hundred bytes between
        # runs; what must hold is that quiet batches keep nothing: 10,000 of them keep < 1 KB
        # (one int per batch would be 280 KB). The first thousand keep ~1.2 KB once (3.10's free
        # lists filling; the same after 1e3, 1e4 or 1e5 batches), so they run first.
        growth(1_000)
        assert growth(10_000)[1] - growth(10)[1] < 1024
    assert trainer.fit_loop.total_batch_idx > 256  # beyond CPython's small-int cache
