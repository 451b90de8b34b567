"""The profiler never harms training (issue 8), the parts with no Trainer: a bad configuration names
its argument, and any events merge into a trace the plugin accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import encode_trace, merge_trace


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"active": 0}, "active"),
        ({"wait": -1}, "wait"),
        ({"repeat": -3}, "repeat"),
        ({"tracer_entries": 0}, "tracer_entries"),
        ({"min_duration": -1.0}, "min_duration"),
        ({"include_files": ["a"], "exclude_files": ["b"]}, "include_files"),
        ({"ranks": [-1]}, "ranks"),
        ({"ranks": []}, "ranks"),
        ({"ranks": [0, 0]}, "ranks"),
        ({"max_stack_depth": -2}, "max_stack_depth"),
        ({"memory_max_entries": 0}, "memory_max_entries"),
        ({"compression_level": 10}, "compression_level"),
        ({"profile_memory": "yes"}, "profile_memory"),
        ({"dirpath": ""}, "dirpath"),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        VizTraceCallback(**kwargs)


# ---------------------------------------------------------------- property test of the merge

names = st.text(min_size=0, max_size=8)
times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
torch_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "i", "M", "f", "s"]),
        "name": names,
        "pid": st.integers(1, 3),
        "tid": st.integers(1, 3),
        "ts": times,
    },
    optional={
        "cat": st.one_of(st.none(), st.sampled_from(["cpu_op", "user_annotation", "kernel"])),
        "dur": times,
        "args": st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1), max_size=2),
    },
)
python_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "i", "C", "M"]),
        "name": names,
        "pid": st.integers(1, 3),
        "tid": st.integers(1, 3),
        "ts": times,
        "dur": times,
    },
    optional={"cat": st.sampled_from(["FEE", "fee"]), "args": st.just({"name": "T"})},
)


@settings(max_examples=150, deadline=None)
@given(st.lists(torch_event, max_size=30), st.lists(python_event, max_size=30), st.floats(min_value=0, max_value=5))
def test_any_events_merge_into_a_trace_the_plugin_accepts(torch_events, python_events, uncertainty):
    import orjson

    torch_trace = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 1, "backend": "gloo"},
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": torch_events,
    }
    pair = ClockPair(python_us=0.0, wall_ns=1_700_000_000_000_000_000, round_trip_us=2 * uncertainty)
    merged = merge_trace(
        torch_trace, [dict(e) for e in python_events], Calibration(pair, pair, pair.wall_ns), {"version": "t"}
    )
    raw = encode_trace(merged)
    decoded = orjson.loads(raw)
    assert list(decoded)[-1] == "traceEvents"
    assert raw.rstrip().endswith(b"]}")  # nothing after the event list
    assert b'"rank": 1' in raw
    for event in decoded["traceEvents"]:
        assert isinstance(event["name"], str)
        if event["ph"] == "X":
            assert isinstance(event["cat"], str) and "ts" in event and "dur" in event
    non_meta_python = [e for e in python_events if e["ph"] != "M"]
    assert decoded["vt_lightning"]["python_events"] == len(non_meta_python)
    assert len(decoded["traceEvents"]) >= len(torch_events) - sum(
        e["ph"] == "M" and e["name"] == "thread_name" for e in torch_events
    ) + len(non_meta_python)
