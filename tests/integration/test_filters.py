"""Filters keep what a user reads them to keep, and the package's own calls never reach the trace:
each filter option on a real Trainer's window."""

from __future__ import annotations

import os

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
from support.paths import PACKAGE, TESTS

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.merge import PYTHON_CATEGORY

USER_CODE = str(TESTS)  # conftest.py: MarkerModel, the user's code of these runs
LIGHTNING = os.path.dirname(lp.__file__)


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
    trace = _run(tmp_path, include_files=[USER_CODE])
    calls = _python_calls(trace)
    assert marker_steps(trace) == {1, 2}
    assert any(e["name"].startswith(recorded_name("MarkerModel.training_step") + " (") for e in calls)
    python_files = _files(calls)
    assert python_files and all(f.startswith(USER_CODE + os.sep) for f in python_files)
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
