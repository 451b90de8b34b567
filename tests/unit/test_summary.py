"""Window summaries: the pure computation on synthetic traces (real runs:
tests/integration/test_summary.py)."""

from __future__ import annotations

import itertools
import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.breakdown import phase_segments
from vt_lightning.analysis.summary import (
    attribute_step,
    memory_summary,
    summarize,
)
from vt_lightning.analysis.usercode import code_origin, command_functions


def test_summary_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="`summary`"):
        VizTraceCallback(summary="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Pure functions on synthetic traces
# --------------------------------------------------------------------------------------------------

MAIN = (1, 1)


def _x(name: str, ts: float, dur: float, cat: str, thread: tuple = MAIN, **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": thread[0], "tid": thread[1]}
    if args:
        event["args"] = args
    return event


def test_each_instant_goes_to_the_innermost_stage() -> None:
    # optimizer_step wraps the closure (training_step, backward), as in automatic optimization.
    ranges = [(0.0, 10.0, "data_wait"), (12.0, 100.0, "optimizer"), (15.0, 45.0, "forward"), (50.0, 90.0, "backward")]
    parts = attribute_step((0.0, 110.0), ranges)
    assert parts == {"data_wait": 10.0, "forward": 30.0, "backward": 40.0, "optimizer": 18.0, "other": 12.0}


def test_code_origin_folds_packages_and_knows_user_code(tmp_path: Path) -> None:
    assert code_origin("/x/lib/python3.11/site-packages/torch/nn/modules/module.py") == ("package", "torch")
    assert code_origin("/x/dist-packages/lightning/pytorch/trainer/call.py") == ("package", "lightning")
    assert code_origin(None) == ("builtin", None)
    assert code_origin("<frozen posixpath>") == ("stdlib", None)
    assert code_origin(str(tmp_path / "train.py")) == ("user", None)
    import json

    assert code_origin(json.__file__) == ("stdlib", None)


COMMAND = """import functools
from dataclasses import dataclass

@dataclass
class Batch:
    size: int = 1

class Model:
    @functools.lru_cache
    def training_step(self, n):
        def inner():
            return [i for i in range(n)]
        return (lambda: inner())()
"""


def _code_names(code: types.CodeType) -> list[str]:
    """Every function ``code`` holds, named as VizTracer names its calls (tests/conftest.recorded_name)."""
    found = []
    for inner in code.co_consts:
        if isinstance(inner, types.CodeType):
            name = inner.co_qualname if sys.version_info >= (3, 11) else inner.co_name
            found += [f"{name} (<string>:{inner.co_firstlineno})", *_code_names(inner)]
    return found


def test_a_python_c_commands_functions_are_named_as_its_code_objects() -> None:
    """What `python -c` compiles: methods by qualified name, a decorated one from its decorator's line."""
    names = command_functions(COMMAND)
    assert set(_code_names(compile(COMMAND, "<string>", "exec"))) <= set(names)
    step = "Model.training_step" if sys.version_info >= (3, 11) else "training_step"
    assert f"{step} (<string>:9)" in names


def test_only_the_commands_own_string_functions_are_the_users() -> None:
    """``<string>`` is also where dataclasses put the methods they write: those stay library code."""
    step = "Model.training_step (<string>:9)"
    generated = "__create_fn__.<locals>.__init__ (<string>:2)"  # a dataclass's __init__
    events = [
        _x("ProfilerStep#1", 0.0, 100.0, "user_annotation"),
        _x("ProfilerStep#2", 100.0, 100.0, "user_annotation"),
        *(e for t in (0.0, 100.0) for e in (_x(step, t + 10, 50.0, "FEE"), _x(generated, t + 70, 20.0, "FEE"))),
        *(_x("gemm_kernel", t, 15.0, "kernel", thread=(0, 7)) for t in (0.0, 100.0)),  # idle while each step runs
    ]

    def origins(meta: dict[str, Any]) -> tuple[dict[str, str], set[str | None]]:
        summary = summarize({"vt_lightning": {"window": 0, **meta}, "traceEvents": events})
        gaps = {gap["user_python"] for gap in summary["gpu"]["idle_gaps"]}
        return {e["function"]: e["origin"] for e in summary["top_python"]["by_inclusive"]}, gaps

    told, gaps = origins({"command_functions": [step]})
    assert told == {"Model.training_step": "user", "__create_fn__.<locals>.__init__": "stdlib"}
    assert gaps == {step}  # the GPU waited in the user's function
    untold, gaps = origins({})  # not a `python -c` run: nobody's
    assert untold["Model.training_step"] == "stdlib" and gaps == {None}


def _cuda_trace() -> dict[str, Any]:
    """Two steps on the main thread; kernels on stream 7 of device 0, launched by correlation."""
    user = "/home/me/train.py"
    events = [
        _x("ProfilerStep#5", 0.0, 1000.0, "user_annotation"),
        _x("ProfilerStep#6", 1000.0, 1000.0, "user_annotation"),
        _x("[pl][profile][_TrainingEpochLoop].train_dataloader_next", 1000.0, 300.0, "cpu_op"),
        _x("[pl][profile][Strategy]S.training_step", 1300.0, 400.0, "cpu_op"),
        _x(f"load_batch ({user}:3)", 1000.0, 300.0, "FEE"),
        _x(f"training_step ({user}:10)", 1300.0, 400.0, "FEE"),
        _x(f"sync_metrics ({user}:20)", 1750.0, 200.0, "FEE"),
        _x("aten::linear", 1310.0, 50.0, "cpu_op"),
        _x("aten::addmm", 1320.0, 30.0, "cpu_op"),
        _x("cudaLaunchKernel", 1330.0, 5.0, "cuda_runtime", correlation=42),
        _x("aten::relu", 1400.0, 20.0, "cpu_op"),
        _x("cudaLaunchKernel", 1405.0, 5.0, "cuda_runtime", correlation=43),
        _x("gemm_kernel", 1340.0, 200.0, "kernel", thread=(0, 7), correlation=42),
        _x("relu_kernel", 1540.0, 100.0, "kernel", thread=(0, 7), correlation=43),
        _x("gemm_kernel", 100.0, 300.0, "kernel", thread=(0, 7), correlation=1),
    ]
    return {
        "vt_lightning": {"window": 3, "worker": "h_0", "span": "0000000005", "global_rank": 0},
        "traceEvents": events,
    }


def test_gpu_busy_percent_idle_gaps_and_kernel_time_per_op() -> None:
    summary = summarize(_cuda_trace())
    gpu = summary["gpu"]
    assert summary["window"]["device"] == "cuda"
    # Kernels cover 300 + 300 us of the 2000 us the two steps span.
    assert gpu["busy_percent"] == pytest.approx(30.0)
    assert gpu["wall_ms"] == pytest.approx(2.0)
    gaps = gpu["idle_gaps"]
    assert [g["ms"] for g in gaps] == pytest.approx([0.94, 0.36, 0.1])
    # The gap 1640..2000 us: the training thread was in sync_metrics (user code).
    assert gaps[1]["python"].startswith("sync_metrics") and gaps[1]["user_python"].startswith("sync_metrics")
    # The gap 400..1340 (midpoint 870): no Python call of the training thread covers it.
    assert gaps[0]["python"] is None
    by_kernel = {op["name"]: op["kernel_ms"] for op in summary["top_ops"]["by_kernel"]}
    # Per counted step (step 6, as the breakdown): addmm launched the 200 us gemm, relu the 100 us
    # kernel; the kernel of step 5 (which the breakdown leaves out) is not counted either.
    assert by_kernel["aten::addmm"] == pytest.approx(0.2)
    assert by_kernel["aten::relu"] == pytest.approx(0.1)
    assert "(no launching op)" not in by_kernel
    # Only step 6 counts (step 5 misses its fetch): data 300, forward 400, other 300.
    assert summary["steps"]["counted"] == [6]
    assert summary["breakdown_ms"] == {
        "data_wait": 0.3,
        "forward": 0.4,
        "backward": 0.0,
        "optimizer": 0.0,
        "other": 0.3,
    }


def test_breakdown_falls_back_on_lightning_methods_without_stage_ranges() -> None:
    site = "/v/lib/python3.11/site-packages/lightning/pytorch"
    events = [
        _x("ProfilerStep#1", 0.0, 100.0, "user_annotation"),
        _x("ProfilerStep#2", 100.0, 100.0, "user_annotation"),
        _x(f"_PrefetchDataFetcher.__next__ ({site}/loops/fetchers.py:120)", 100.0, 30.0, "FEE"),
        _x(f"_DataFetcher.__next__ ({site}/loops/fetchers.py:56)", 101.0, 28.0, "FEE"),
        _x(f"LightningModule.optimizer_step ({site}/core/module.py:1300)", 130.0, 60.0, "FEE"),
        _x(f"Strategy.training_step ({site}/strategies/strategy.py:380)", 131.0, 20.0, "FEE"),
        _x(f"Strategy.backward ({site}/strategies/strategy.py:200)", 160.0, 25.0, "FEE"),
    ]
    summary = summarize({"traceEvents": events})
    assert summary["steps"]["breakdown_source"] == "lightning methods (python calls)"
    assert summary["breakdown_ms"] == {
        "data_wait": 0.03,
        "forward": 0.02,
        "backward": 0.025,
        "optimizer": 0.015,
        "other": 0.01,
    }
    # Both fetcher calls are lightning's and start in the data wait: one folded line, with their
    # inclusive time counted once (30 µs, not 30 + 28).
    folded = {e["function"]: e for e in summary["top_python"]["by_inclusive"] if e["folded"]}
    assert folded["lightning · data wait (folded)"]["inclusive_ms"] == pytest.approx(0.03)
    assert folded["lightning · data wait (folded)"]["calls"] == 2


def test_top_python_is_the_training_threads() -> None:
    # A logger's background thread sleeping through the step is no time the step spent.
    user = "/home/me/model.py"
    events = [
        _x("ProfilerStep#1", 0.0, 100.0, "user_annotation"),
        _x(f"training_step ({user}:1)", 10.0, 60.0, "FEE"),
        _x("time.sleep", 0.0, 100.0, "FEE", thread=(1, 2)),
        _x(f"flush_loop ({user}:9)", 0.0, 100.0, "FEE", thread=(1, 2)),
    ]
    summary = summarize({"traceEvents": events})
    names = {e["function"] for key in ("by_self", "by_inclusive") for e in summary["top_python"][key]}
    assert names == {"training_step"}


def test_tables_rank_the_users_code_then_the_models_library_then_folded_frameworks(tmp_path) -> None:
    """Lightning's and torch's frames around every step (~100 % inclusive) fold to one line each;
    a litgpt model's functions are "the model's": listed, below the user's own, above the rest.
    Generated code (inductor's cache) is folded too, and never the user's."""
    site = "/v/lib/python3.11/site-packages"
    generated = tmp_path / "torchinductor_me" / "ab" / "cab12.py"
    user = "/home/me/train.py"
    events = [
        _x("ProfilerStep#1", 0.0, 1000.0, "user_annotation"),
        _x(f"_run_stage ({site}/lightning/pytorch/trainer/trainer.py:1000)", 0.0, 1000.0, "FEE"),
        _x(f"_call_lightning_module_hook ({site}/lightning/pytorch/trainer/call.py:160)", 1.0, 998.0, "FEE"),
        _x(f"training_step ({user}:20)", 2.0, 990.0, "FEE"),
        _x(f"Module._call_impl ({site}/torch/nn/modules/module.py:1750)", 3.0, 900.0, "FEE"),
        _x(f"GPT.forward ({site}/litgpt/model.py:80)", 4.0, 800.0, "FEE"),
        _x(f"Runner.call ({generated}:2071)", 5.0, 300.0, "FEE"),
        _x(f"Block.forward ({site}/litgpt/model.py:300)", 400.0, 300.0, "FEE"),
        _x(f"make_batch ({user}:5)", 950.0, 30.0, "FEE"),
    ]
    summary = summarize({"traceEvents": events})
    for ranking in (summary["top_python"]["by_inclusive"], summary["top_python"]["by_self"]):
        rows = [(e["function"], e["origin"], e["package"]) for e in ranking]
        users = [r for r in rows if r[1] == "user"]
        assert rows[: len(users)] == users and {r[0] for r in users} == {"training_step", "make_batch"}, rows
        models = [r for r in rows if r[2] == "litgpt"]
        assert rows[len(users) : len(users) + len(models)] == models, rows
        assert {r[0] for r in models} == {"GPT.forward", "Block.forward"}, rows
        listed = {r[0] for r in rows}
        assert not {"_run_stage", "_call_lightning_module_hook", "Module._call_impl", "Runner.call"} & listed, rows
    folded = {e["function"]: e for e in summary["top_python"]["by_inclusive"] if e["folded"]}
    # No stage range, no Lightning method nor user hook that marks one: no phases, one line per package.
    assert summary["steps"]["breakdown_source"] == "none"
    assert folded["lightning (folded)"]["inclusive_ms"] == pytest.approx(1.0)
    assert not [name for name in folded if "·" in name], folded
    assert folded["torch.compile generated code (folded)"]["origin"] == "generated"
    # The full ranking stays in the file: every function's self time, the frameworks' included.
    assert any("_call_lightning_module_hook" in key for key in summary["top_python"]["totals"]["ms"])


def test_framework_frames_fold_into_the_phase_their_call_started_in() -> None:
    """Lightning's frames in the forward and in the optimizer are two folded lines, each with the
    time of its own frames; the loop's frame that began before the step is ``other``; torch's frame
    in the backward pass is ``torch · backward``. The user's function still comes first."""
    site = "/v/lib/python3.11/site-packages"
    user = "/home/me/train.py"
    events = [
        _x("ProfilerStep#1", 0.0, 1000.0, "user_annotation"),
        _x("[pl][profile][LightningModule]LitModel.optimizer_step", 50.0, 850.0, "cpu_op"),
        _x("[pl][profile][Strategy]SingleDeviceStrategy.training_step", 100.0, 400.0, "cpu_op"),
        _x("[pl][profile][Strategy]SingleDeviceStrategy.backward", 500.0, 80.0, "cpu_op"),
        _x(f"_run_stage ({site}/lightning/pytorch/trainer/trainer.py:1000)", -10.0, 1020.0, "FEE"),
        _x(f"LightningModule.optimizer_step ({site}/lightning/pytorch/core/module.py:1300)", 50.0, 850.0, "FEE"),
        _x(f"Strategy.training_step ({site}/lightning/pytorch/strategies/strategy.py:380)", 100.0, 400.0, "FEE"),
        _x(f"_call_lightning_module_hook ({site}/lightning/pytorch/trainer/call.py:160)", 110.0, 380.0, "FEE"),
        _x(f"training_step ({user}:20)", 120.0, 360.0, "FEE"),
        _x(f"Tensor.backward ({site}/torch/_tensor.py:600)", 510.0, 60.0, "FEE"),
        _x(f"Optimizer.step ({site}/torch/optim/optimizer.py:480)", 600.0, 200.0, "FEE"),
        _x(f"_call_callback_hooks ({site}/lightning/pytorch/trainer/call.py:200)", 810.0, 40.0, "FEE"),
    ]
    summary = summarize({"traceEvents": events})
    assert summary["breakdown_ms"]["optimizer"] == pytest.approx(0.37)  # 850 - 400 - 80 µs
    for ranking in (summary["top_python"]["by_inclusive"], summary["top_python"]["by_self"]):
        assert ranking[0]["function"] == "training_step", ranking
    rows = {e["function"]: e for e in summary["top_python"]["by_inclusive"] if e["folded"]}
    row = {k: tuple(r[x] for x in ("inclusive_ms", "self_ms", "calls", "folded")) for k, r in rows.items()}
    assert row == {
        # optimizer_step (850 µs) with the callback hooks under it, counted once; self: 850 - 400
        # (training_step) - 60 (torch's backward) - 200 (torch's step) - 40 (the hooks) + 40 (theirs).
        "lightning · optimizer (folded)": (0.85, 0.19, 2, 2),
        # Strategy.training_step with the hook call under it; self 10 + 20 around the user's 360 µs.
        "lightning · forward (folded)": (0.4, 0.04, 2, 2),
        "lightning · other (folded)": (1.0, 0.15, 1, 1),  # clipped to the step; began before it
        "torch · backward (folded)": (0.06, 0.06, 1, 1),
        "torch · optimizer (folded)": (0.2, 0.2, 1, 1),
    }
    # The full ranking is unfolded, one entry per function, whatever its phases.
    assert sum("optimizer_step" in key for key in summary["top_python"]["totals"]["ms"]) == 1


def test_phase_segments_tile_the_steps_as_the_breakdown_does() -> None:
    """The phases a frame is folded into are the breakdown's: summed per part, the segments give
    ``attribute_step``'s microseconds, step by step; without ranges there are no phases."""
    ranges = [
        (0.0, 10.0, "data_wait"),
        (12.0, 100.0, "optimizer"),
        (15.0, 45.0, "forward"),
        (50.0, 90.0, "backward"),
        (60.0, 70.0, "validation"),
        (95.0, 130.0, "hooks"),
    ]
    steps = [(0.0, 110.0), (110.0, 200.0)]
    segments = phase_segments(steps, ranges)
    assert segments is not None
    bounds = [*segments.starts, steps[-1][1]]
    per_part: dict[str, float] = {}
    for (a, b), part in zip(itertools.pairwise(bounds), segments.parts, strict=True):
        per_part[part] = per_part.get(part, 0.0) + b - a
    expected: dict[str, float] = {}
    for step in steps:
        for part, us in attribute_step(step, ranges).items():
            expected[part] = expected.get(part, 0.0) + us
    assert {p: us for p, us in per_part.items() if us} == {p: us for p, us in expected.items() if us}
    at = [["other", *segments.parts][i] for i in segments.segments_at([-1.0, 200.0, 65.0])]
    assert at == ["other", "other", "validation"]
    assert phase_segments(steps, []) is None
    assert phase_segments(steps, [(300.0, 400.0, "forward")]) is None


def test_self_time_excludes_children_and_recursion_counts_once() -> None:
    user = "/home/me/model.py"
    events = [
        _x("ProfilerStep#1", 0.0, 100.0, "user_annotation"),
        _x(f"outer ({user}:1)", 0.0, 100.0, "FEE"),
        _x(f"recurse ({user}:5)", 10.0, 60.0, "FEE"),
        _x(f"recurse ({user}:5)", 20.0, 30.0, "FEE"),
    ]
    summary = summarize({"traceEvents": events})
    rows = {e["function"]: e for e in summary["top_python"]["by_self"]}
    assert rows["outer"]["self_ms"] == pytest.approx(0.04)
    assert rows["recurse"]["self_ms"] == pytest.approx(0.06)
    assert rows["recurse"]["inclusive_ms"] == pytest.approx(0.06)  # not 0.09
    assert rows["recurse"]["calls"] == 2


def test_memory_peaks_and_allocation_sites_from_a_cuda_snapshot() -> None:
    user = {"filename": "/home/me/model.py", "line": 7, "name": "forward"}
    torch_frame = {"filename": "/v/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"}
    cpp = {"filename": "c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "malloc"}
    mb = 2**20
    snapshot = {
        "segments": [
            {
                "device": 0,
                "total_size": 20 * mb,
                "blocks": [{"size": 4 * mb, "state": "active_allocated"}, {"size": 16 * mb, "state": "inactive"}],
            }
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 0, "size": 20 * mb, "frames": [cpp]},
                {"action": "alloc", "addr": 0, "size": 10 * mb, "frames": [cpp, torch_frame, user]},
                {"action": "alloc", "addr": 10 * mb, "size": 4 * mb, "frames": [cpp, torch_frame]},
                {"action": "free_requested", "addr": 0, "size": 10 * mb, "frames": []},
                {"action": "free_completed", "addr": 0, "size": 10 * mb, "frames": []},
            ]
        ],
    }
    memory = memory_summary([], snapshot)
    assert memory["peak_allocated_mb"] == pytest.approx(14.0)
    assert memory["peak_reserved_mb"] == pytest.approx(20.0)
    assert memory["peak_source"] == "memory snapshot replay"
    sites = memory["top_allocation_sites"]
    assert sites[0]["site"] == "forward (/home/me/model.py:7)" and sites[0]["mb"] == pytest.approx(10.0)
    assert sites[1]["site"].startswith("linear (")  # no user frame: the innermost Python frame


def test_memory_peaks_from_torch_memory_events() -> None:
    events = [
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 1.0,
            "pid": 1,
            "tid": 1,
            "args": {
                "Total Allocated": 3 * 2**20,
                "Total Reserved": 8 * 2**20,
                "Bytes": 1,
                "Device Type": 1,
                "Device Id": 0,
            },
        },
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 2.0,
            "pid": 1,
            "tid": 1,
            "args": {
                "Total Allocated": 5 * 2**20,
                "Total Reserved": 8 * 2**20,
                "Bytes": 1,
                "Device Type": 1,
                "Device Id": 0,
            },
        },
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 2.0,
            "pid": 1,
            "tid": 1,
            "args": {"Total Allocated": 2**20, "Bytes": 1, "Device Type": 0, "Device Id": -1},
        },
    ]
    memory = memory_summary(events, None)
    assert memory["peak_allocated_mb"] == 5.0 and memory["peak_reserved_mb"] == 8.0
    assert memory["devices"]["cpu"] == {"peak_allocated_mb": 1.0}


def test_a_trace_without_steps_gives_an_empty_but_valid_summary() -> None:
    summary = summarize({"traceEvents": []})
    assert summary["steps"]["recorded"] == [] and summary["step_ms"]["mean"] is None
    assert orjson.loads(orjson.dumps(summary)) == summary


def test_a_cpu_window_reports_no_reserved_memory() -> None:
    """torch's CPU ``[memory]`` events carry a "Total Reserved" that means nothing without CUDA's
    caching allocator: a CPU run printed "126.2 MB allocated, 0.8 MB reserved"."""
    events = [
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 1.0,
            "pid": 1,
            "tid": 1,
            "args": {"Total Allocated": 3 * 2**20, "Total Reserved": 2**19, "Bytes": 1, "Device Type": 0},
        }
    ]
    memory = memory_summary(events, None)
    assert memory["devices"] == {"cpu": {"peak_allocated_mb": 3.0}}
    assert memory["peak_allocated_mb"] == 3.0 and memory["peak_reserved_mb"] is None


def test_steps_carry_their_bounds_min_and_calls_per_step() -> None:
    """Three counted steps of 10, 30 and 20 ms: the median is shown with its min–max, the step bounds
    are on the trace's timeline for a viewer's range, and ``calls`` counts per step as the times do."""
    events = [_x("ProfilerStep#1", 0.0, 5000.0, "user_annotation")]
    start = 5000.0
    for n, dur in ((2, 10_000.0), (3, 30_000.0), (4, 20_000.0)):
        events.append(_x(f"ProfilerStep#{n}", start, dur, "user_annotation"))
        events += [_x("aten::mm", start + 10 + 100 * k, 50.0, "cpu_op") for k in range(2)]
        start += dur
    events.append(_x("late (/home/me/train.py:3)", start + 10.0, 5.0, "FEE"))
    summary = summarize({"traceEvents": events})
    assert summary["steps"]["bounds_us"]["3"] == [15000.0, 45000.0]
    assert summary["steps"]["trace_us"] == [0.0, start + 15.0]
    assert summary["step_ms"]["min"] == 10.0 and summary["step_ms"]["p50"] == 20.0
    mm = next(op for op in summary["top_ops"]["by_cpu"] if op["name"] == "aten::mm")
    assert mm["calls"] == 6 and mm["calls_per_step"] == 2.0
    from vt_lightning.export.report import render_markdown, step_spread_text

    assert step_spread_text(summary) == "median **20.0 ms** (min–max 10.0–30.0 over 3 steps)"
    assert "| `aten::mm` | 0.10 | 0.10 | 2 |" in render_markdown(summary)
    two = {"steps": {"counted": [2, 3], "ms": {"2": 50.8, "3": 80.4}}, "step_ms": {"p50": 65.6}}
    assert step_spread_text(two) == "50.8 and 80.4 ms"  # type: ignore[arg-type]


def test_a_summary_written_before_the_added_keys_still_reads() -> None:
    """Keys added within schema 2 are optional for the reader: a file written by the version before
    them (no step bounds, calls per step, ``below`` hashes, memory view, sources) is no error."""
    from vt_lightning.export.reading import check_summary

    summary = summarize(_cuda_trace())
    old = orjson.loads(orjson.dumps(summary))
    for key in ("bounds_us", "trace_us"):
        del old["steps"][key]
    del old["step_ms"]["min"]
    for table in (old["top_python"], old["top_ops"]):
        del table["totals"]["below"]
    for entry in [*old["top_python"]["by_self"], *old["top_python"]["by_inclusive"], *old["top_ops"]["by_cpu"]]:
        del entry["calls_per_step"]
    old["memory"] = None
    assert check_summary(old, "old.summary.jsonc") == old
    assert check_summary(orjson.loads(orjson.dumps(summary)), "new.summary.jsonc")
