"""Filters keep what a user reads them to keep, and the package's own calls never reach the trace:
the rules on synthetic stacks and a worker's events, and the options' checks."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import PACKAGE

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.filters import PythonFilter, filter_python_events
from vt_lightning.analysis.workers import ThreadCalls, place_events, worker_to_main_us


def test_a_filter_path_that_matches_nothing_warns_naming_the_argument(tmp_path):
    with pytest.warns(UserWarning, match="`include_files` entry .* matches no file"):
        VizTraceCallback(include_files=[str(tmp_path / "no_such_dir")])


# ---------------------------------------------------------------- pure


def _call(name, ts, dur, tid=1):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "cat": "fee"}


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
