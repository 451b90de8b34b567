"""The Lightning view's pure rewrite: categories, the framework key, idempotence, a trace with no
module ranges (the hooks and the real plugin: tests/integration/test_lightning_view.py)."""

from __future__ import annotations

import copy

from support.lightning_view import synthetic_trace, view

from vt_lightning.constants import FRAMEWORK_KEY, FRAMEWORK_LIGHTNING


def test_rewrite_categories_and_framework_key_order():
    trace = synthetic_trace()
    summary = view(trace)
    assert list(trace)[-1] == "traceEvents"
    assert list(trace).index(FRAMEWORK_KEY) < list(trace).index("traceEvents")
    assert trace[FRAMEWORK_KEY] == FRAMEWORK_LIGHTNING
    cats = {(e["name"], e["cat"]) for e in trace["traceEvents"]}
    assert ("[pl][module]torch.nn.modules.container.Sequential: net", "cpu_op") in cats
    assert ("[pl][profile]run_training_batch", "cpu_op") in cats
    # untouched: GPU mirror of a record_function, other annotations, ProfilerStep, Python events
    assert ("[pl][module]torch.nn.modules.linear.Linear: net.0", "gpu_user_annotation") in cats
    assert ("some_user_range", "user_annotation") in cats
    assert ("ProfilerStep#1", "user_annotation") in cats
    assert ("python_call", "FEE") in cats
    assert summary == {"modules": 3, "stages": 2, "demoted": 0, "synthesized_stages": 0, "framework": 1}
    assert trace["vt_lightning"]["lightning_view"] == summary
    events = trace["traceEvents"]
    modules = [
        e["name"].split(": ", 1)[1] for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("[pl][module]")
    ]
    assert sorted(modules) == ["net", "net.0", "net.1"]


def test_rewrite_is_idempotent():
    trace = synthetic_trace()
    view(trace)
    once = copy.deepcopy(trace)
    view(trace)
    assert trace["traceEvents"] == once["traceEvents"]
    assert list(trace) == list(once)


def test_no_module_events_leaves_trace_alone():
    trace = synthetic_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if "[pl][module]" not in e["name"]]
    before = copy.deepcopy(trace)
    summary = view(trace)
    assert summary["framework"] == 0
    assert FRAMEWORK_KEY not in trace  # would hide torch's Module view for nothing
    assert trace["traceEvents"] == before["traceEvents"]
    assert list(trace)[-1] == "traceEvents"
    view({})  # no events at all: no crash
