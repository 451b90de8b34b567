"""Filters keep what a user reads them to keep, and the package's own calls never reach the trace."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as lp
import pytest
from conftest import (
    MarkerModel,
    load_trace,
    loader,
    make_trainer,
    marker_steps,
    overlaps_without_nesting,
    recorded_name,
    trace_files,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.filters import PythonFilter, filter_python_events
from vt_lightning.analysis.merge import PYTHON_CATEGORY
from vt_lightning.analysis.workers import ThreadCalls, place_events, worker_to_main_us

TESTS = str(Path(__file__).parent)
LIGHTNING = os.path.dirname(lp.__file__)
PACKAGE = os.path.dirname(os.path.abspath(__import__("vt_lightning").__file__))


def _python_calls(trace):
    return [e for e in trace["traceEvents"] if e.get("cat") == PYTHON_CATEGORY and e.get("ph") == "X"]


def _run(tmp_path, **options):
    cb = VizTraceCallback(wait=0, warmup=1, active=2, repeat=1, memory_snapshot=False, **options)
    make_trainer(tmp_path, [cb], max_steps=4).fit(MarkerModel(), loader())
    (path,) = trace_files(tmp_path)
    return load_trace(path)


def _files(calls):
    out = set()
    for event in calls:
        name = event["name"]
        if name.endswith(")") and " (" in name:
            out.add(name.rsplit(" (", 1)[1].rsplit(":", 1)[0])
    return out


def test_include_files_keeps_the_users_calls_wherever_their_callers_live(tmp_path):
    trace = _run(tmp_path, include_files=[TESTS])
    calls = _python_calls(trace)
    assert marker_steps(trace) == {1, 2}
    assert any(e["name"].startswith(recorded_name("MarkerModel.training_step") + " (") for e in calls)
    python_files = _files(calls)
    assert python_files and all(f.startswith(TESTS + os.sep) for f in python_files)
    # the torch ops the kept calls issue are still there, nested under them
    tanh = [e for e in trace["traceEvents"] if e.get("name") == "aten::tanh"]
    assert len(tanh) == 2
    assert overlaps_without_nesting(trace) == []


def test_exclude_files_drops_only_the_excluded_calls(tmp_path):
    trace = _run(tmp_path, exclude_files=[LIGHTNING])
    calls = _python_calls(trace)
    assert marker_steps(trace) == {1, 2}
    assert any(e["name"].startswith(recorded_name("MarkerModel.training_step") + " (") for e in calls)
    assert not any(f.startswith(LIGHTNING + os.sep) for f in _files(calls))
    assert overlaps_without_nesting(trace) == []


@pytest.mark.parametrize("depth, markers", [(1, set()), (2, {1, 2})])
def test_max_stack_depth_counts_from_the_lightning_module_hook(tmp_path, depth, markers):
    trace = _run(tmp_path, max_stack_depth=depth)
    calls = _python_calls(trace)
    assert any(e["name"].startswith(recorded_name("MarkerModel.training_step") + " (") for e in calls)  # depth 1
    assert marker_steps(trace) == markers  # batch_<n> is called by training_step: depth 2
    assert trace["vt_lightning"]["python_filter"]["dropped_by_filters"] > 0


def test_the_packages_own_calls_are_not_in_the_trace(tmp_path):
    trace = _run(tmp_path)
    calls = [e for e in trace["traceEvents"] if e.get("cat") == PYTHON_CATEGORY]
    assert marker_steps(trace) == {1, 2}
    assert not [e for e in calls if e.get("ph") != "X"]  # no unclosed "B" events
    own = [e["name"] for e in calls if f"{PACKAGE}{os.sep}" in e["name"]]
    assert own == []
    for name in ("_close_window", "ProfilingWindow.close", "PythonTracer.stop", "step_begin"):
        assert not [e for e in calls if name in e["name"]]
    assert trace["vt_lightning"]["python_filter"]["dropped_own"] > 0


@pytest.mark.unit
def test_a_filter_path_that_matches_nothing_warns_naming_the_argument(tmp_path):
    with pytest.warns(UserWarning, match="`include_files` entry .* matches no file"):
        VizTraceCallback(include_files=[str(tmp_path / "no_such_dir")])


# ---------------------------------------------------------------- pure


def _call(name, ts, dur, tid=1):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "cat": "fee"}


@pytest.mark.unit
def test_filter_rules_on_a_synthetic_stack():
    lib, user, own = "/lib/pkg", "/proj", "/own/vt"
    events = [
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "MainThread"}},
        _call(f"loop ({lib}/loop.py:1)", 0, 100),
        _call(f"Model.training_step ({user}/m.py:5)", 10, 50),
        _call(f"helper ({lib}/h.py:3)", 12, 30),
        _call(f"user_fn ({user}/u.py:9)", 14, 10),
        _call("builtins.len", 15, 1),
        _call(f"Callback.hook ({own}/cb.py:2)", 70, 20),
        _call(f"record ({lib}/rec.py:4)", 72, 5),
    ]
    base = dict(library=(lib + os.sep,), own=(own + os.sep,))

    def names(rules):
        _, kept, _ = filter_python_events([dict(e) for e in events], rules)
        return [e["name"].split(" (")[0] for calls in kept.values() for e in calls if e["ph"] == "X"]

    assert names(PythonFilter(**base)) == ["loop", "Model.training_step", "helper", "user_fn", "builtins.len"]
    assert names(PythonFilter(include=(user + os.sep,), **base)) == ["Model.training_step", "user_fn", "builtins.len"]
    assert names(PythonFilter(exclude=(lib + os.sep,), **base)) == ["Model.training_step", "user_fn", "builtins.len"]
    assert names(PythonFilter(max_depth=2, **base)) == ["loop", "Model.training_step", "helper"]
    # metadata events pass through untouched
    others, _, stats = filter_python_events([dict(e) for e in events], PythonFilter(max_depth=1, **base))
    assert others == events[:1] and stats.own == 2 and stats.filtered == 3


_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "B", "i", "M"]),
        "name": st.sampled_from(["f (/u/a.py:1)", f"g ({PACKAGE}/x.py:2)", "builtins.len", "thread_name"]),
        "pid": st.integers(1, 2),
        "tid": st.integers(1, 3),
    },
    optional={
        "ts": st.floats(min_value=0, max_value=100, allow_nan=False),
        "dur": st.floats(min_value=0, max_value=50, allow_nan=False),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=15), st.lists(_event, max_size=25), st.sampled_from([-1, 1]))
@pytest.mark.unit
def test_a_workers_events_grouped_as_they_are_placed_filter_as_if_they_followed(
    main: list[dict[str, Any]], worker: list[dict[str, Any]], max_depth: int
) -> None:
    # The writer groups a DataLoader worker's events while it places them on the main clock, so
    # the filter does not walk them again: what it keeps, and in which order, must not change.
    clock = worker_to_main_us([(0.0, 0), (5000.0, 5_000_000)], [(0.0, 7_000), (9000.0, 9_007_000)])
    grouped: ThreadCalls = ({}, [])
    placed = place_events([dict(e) for e in worker], clock, {3}, grouped)
    rules = PythonFilter(max_depth=max_depth)
    flat = filter_python_events([dict(e) for e in main] + [dict(e) for e in placed], rules)
    by_groups = filter_python_events([dict(e) for e in main], rules, grouped)
    assert by_groups == flat
