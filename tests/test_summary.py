"""Window summaries: the pure computation on synthetic traces, and a real Trainer whose step time is
known (a Dataset that sleeps 40 ms per batch, a training_step that spends its time in one function)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import lightning as L
import orjson
import pytest
import torch
from conftest import load_trace, make_trainer, recorded_name, trace_files
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.breakdown import phase_segments
from vt_lightning.analysis.summary import (
    BREAKDOWN_PARTS,
    SCHEMA_VERSION,
    attribute_step,
    memory_summary,
    summarize,
)
from vt_lightning.analysis.usercode import code_origin

DATA_WAIT_S = 0.040
WORK_S = 0.012


class SleepyBatches(Dataset):
    """Each batch takes a known 40 ms to fetch (``batch_size=None``: one ``__getitem__`` per batch)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(DATA_WAIT_S)
        return torch.randn(4, 8)


def crunch_features(x: torch.Tensor) -> torch.Tensor:
    """The one user function the step spends most of its time in."""
    time.sleep(WORK_S)
    return x * 2


class SlowDataModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(crunch_features(batch)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _summaries(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(p.read_bytes()) for p in sorted(Path(root).rglob("*.summary.jsonc"))]


TRACE_SLACK_MS = 0.01  # summaries round to the microsecond; torch and VizTracer time with two clocks


def _calls_per_counted_step(trace: dict[str, Any], counted: list[int]) -> tuple[list[list[float]], list[list[float]]]:
    """Per counted step, the durations (ms) of the ``SleepyBatches.__getitem__`` and the
    ``crunch_features`` calls that ran inside it, read from the merged trace."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = {
        int(e["name"][len("ProfilerStep#") :]): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["name"].startswith("ProfilerStep#")
    }
    fetch, work = recorded_name("SleepyBatches.__getitem__"), recorded_name("crunch_features")
    out: tuple[list[list[float]], list[list[float]]] = ([], [])
    for step in counted:
        lo, hi = steps[step]
        inside = [e for e in events if e.get("cat") == "FEE" and lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
        for name, calls in zip((fetch, work), out, strict=True):
            calls.append([e["dur"] / 1000 for e in inside if e["name"].split(" (")[0] == name])
    return out


def _mean_ms(per_step: list[list[float]]) -> float:
    return sum(sum(calls) for calls in per_step) / len(per_step)


@pytest.fixture(scope="module")
def slow_data_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow_data")
    callback = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1)
    trainer = make_trainer(root, [callback], max_steps=7)
    trainer.fit(SlowDataModel(), DataLoader(SleepyBatches(), batch_size=None))
    return root


@pytest.mark.integration
def test_summary_names_the_data_wait_and_the_busy_function(slow_data_run: Path) -> None:
    (trace,) = trace_files(slow_data_run)
    (summary,) = _summaries(slow_data_run)
    stem = trace.name[: -len(".pt.trace.json.gz")]
    assert (trace.parent / f"{stem}.summary.jsonc").is_file()
    assert (trace.parent / f"{stem}.summary.md").is_file()
    assert summary["schema"] == SCHEMA_VERSION
    assert summary["steps"]["recorded"] == [2, 3, 4]
    assert summary["steps"]["counted"] == [3, 4]  # the first step's batch was fetched before recording
    assert summary["steps"]["breakdown_source"] == "lightning stage ranges"
    parts = summary["breakdown_ms"]
    assert set(parts) == set(BREAKDOWN_PARTS)
    # Each counted step fetched its batch inside the step (one __getitem__ that sleeps DATA_WAIT_S)
    # and ran crunch_features in training_step: the whole fetch is data wait and the whole work is
    # forward. Measured against the trace's own calls, so the machine's speed does not matter.
    fetch_ms, work_ms = _calls_per_counted_step(load_trace(trace), summary["steps"]["counted"])
    assert all(len(calls) == 1 and calls[0] >= DATA_WAIT_S * 1000 for calls in fetch_ms), fetch_ms
    assert all(len(calls) == 1 and calls[0] >= WORK_S * 1000 for calls in work_ms), work_ms
    assert parts["data_wait"] >= _mean_ms(fetch_ms) - TRACE_SLACK_MS, (parts, fetch_ms)
    assert parts["forward"] >= _mean_ms(work_ms) - TRACE_SLACK_MS, (parts, work_ms)
    # The parts tile the step: their sum is the mean step time.
    assert sum(parts.values()) == pytest.approx(summary["step_ms"]["mean"], abs=0.05)
    assert summary["step_ms"]["max"] >= summary["step_ms"]["p50"] >= DATA_WAIT_S * 1000
    user = [e for e in summary["top_python"]["by_inclusive"] if e["origin"] == "user"]
    crunch = [e for e in user if e["function"] == "crunch_features"]
    assert crunch and crunch[0]["inclusive_ms"] >= WORK_S * 1000 * 0.9, user
    assert crunch[0]["file"] == __file__
    # User code comes first in both rankings.
    for ranking in (summary["top_python"]["by_self"], summary["top_python"]["by_inclusive"]):
        origins = [e["origin"] for e in ranking]
        assert origins[: len([o for o in origins if o == "user"])] == ["user"] * origins.count("user")
    assert summary["top_ops"]["by_cpu"] and summary["gpu"] is None
    assert summary["memory"]["peak_allocated_bytes"] > 0
    markdown = (trace.parent / f"{stem}.summary.md").read_text()
    assert "crunch_features" in markdown and "| data wait |" in markdown


@pytest.mark.integration
def test_tensorboard_gets_the_scalars_and_the_table(slow_data_run: Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    (summary,) = _summaries(slow_data_run)
    (events,) = list(Path(slow_data_run).rglob("events.out.tfevents.*"))
    acc = event_accumulator.EventAccumulator(str(events.parent), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for name in (
        "step_ms",
        "data_wait_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "other_ms",
        "peak_allocated_mb",
    ):
        assert f"vt_lightning/{name}" in scalars, scalars
    (point,) = acc.Scalars("vt_lightning/data_wait_ms")
    assert point.value == pytest.approx(summary["breakdown_ms"]["data_wait"], rel=1e-5)
    assert point.step == 4 == summary["window"]["log_step"]  # the window's last batch, as Lightning logs it
    texts = [t for t in acc.Tags()["tensors"] if t.startswith("vt_lightning/window_0")]
    assert texts, acc.Tags()["tensors"]
    (text,) = acc.Tensors(texts[0])
    assert b"crunch_features" in text.tensor_proto.string_val[0]


@pytest.mark.integration
def test_csv_logger_gets_the_scalars(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    trainer = make_trainer(
        tmp_path,
        [VizTraceCallback(wait=0, warmup=1, active=2)],
        max_steps=5,
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
    )
    from conftest import MarkerModel, loader

    trainer.fit(MarkerModel(), loader())
    (metrics,) = list(tmp_path.rglob("metrics.csv"))
    header, *rows = metrics.read_text().splitlines()
    assert "vt_lightning/step_ms" in header and "vt_lightning/forward_ms" in header
    column = header.split(",").index("vt_lightning/step_ms")
    assert [r for r in rows if r.split(",")[column]]


@pytest.mark.integration
def test_summary_off_writes_no_summary(tmp_path: Path) -> None:
    from conftest import MarkerModel, loader

    trainer = make_trainer(tmp_path, [VizTraceCallback(wait=0, warmup=1, active=1, summary=False)], max_steps=3)
    trainer.fit(MarkerModel(), loader())
    assert trace_files(tmp_path) and not list(tmp_path.rglob("*.summary.*"))


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


class _RecordingLogger:
    """A Lightning logger that records each ``log_metrics`` call with its thread and batch."""

    @staticmethod
    def make() -> Any:
        import threading

        from lightning.pytorch.loggers import Logger

        class RecordingLogger(Logger):
            def __init__(self) -> None:
                super().__init__()
                self.calls: list[tuple[int | None, dict[str, float], str, int]] = []
                self.batch = -1

            @property
            def name(self) -> str:
                return "recording"

            @property
            def version(self) -> int:
                return 0

            def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
                self.calls.append((step, dict(metrics), threading.current_thread().name, self.batch))

            def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
                pass

        return RecordingLogger()


def _hold_until_written(logger: Any, tracer: VizTraceCallback, at_batch: int, windows: int) -> Any:
    """A callback (placed before the tracer) that holds batch ``at_batch`` until ``windows`` windows
    are written, so which batch logs them does not depend on timing. Written means answered: the
    answers wait in the inbox until the tracer's own batch start reads them into ``results``."""
    from lightning.pytorch.callbacks import Callback

    class Hold(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            logger.batch = trainer.fit_loop.total_batch_idx
            if logger.batch == at_batch:
                deadline = time.monotonic() + 120
                while len(tracer.results) + tracer._controller.inbox.arrived() < windows:
                    assert time.monotonic() < deadline, "the writer did not answer within 120 s"
                    time.sleep(0.01)

    return Hold()


def _ours(logger: Any) -> list[tuple[int | None, dict[str, float], str, int]]:
    return [c for c in logger.calls if any(k.startswith("vt_lightning/") for k in c[1])]


@pytest.mark.integration
def test_summary_is_logged_on_the_training_thread_at_the_next_batch(
    tmp_path: Path, writer_process_per_window: None
) -> None:
    """Not only at the end of fit: at the first batch start after the writer returned the window
    (its process: a window held to the run's end, ``handoff.finishes_at_end``, is logged there)."""
    import threading

    from conftest import MarkerModel, loader

    tracer = VizTraceCallback(wait=0, warmup=1, active=2, repeat=1)
    logger = _RecordingLogger.make()
    trainer = make_trainer(tmp_path, [_hold_until_written(logger, tracer, 4, 1), tracer], max_steps=8, logger=logger)
    trainer.fit(MarkerModel(), loader())
    (call,) = _ours(logger)
    step, metrics, thread, batch = call
    assert thread == threading.main_thread().name
    assert batch == 4  # logged at the batch start right after the result came back, not at the end
    assert step == 2  # the window's last batch
    assert metrics["vt_lightning/step_ms"] == tracer.results[0].summary["step_ms"]["mean"]


@pytest.mark.integration
def test_a_summary_arriving_during_a_window_is_logged_after_it(tmp_path: Path, writer_process_per_window: None) -> None:
    """Logging inside a window would put the logger's own calls into that window's trace."""
    from conftest import MarkerModel, load_trace, loader

    tracer = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2)  # active 2-3 and 6-7
    logger = _RecordingLogger.make()
    hold = _hold_until_written(logger, tracer, 6, 1)  # window 0 is written while window 1 records
    trainer = make_trainer(tmp_path, [hold, tracer], max_steps=10, logger=logger)
    trainer.fit(MarkerModel(), loader())
    batches = [c[3] for c in _ours(logger)]
    assert batches[0] == 8  # the first batch start after window 1 closed
    second = load_trace(tracer.results[1].trace_path)
    assert not [e for e in second["traceEvents"] if "RecordingLogger.log_metrics" in str(e.get("name"))]


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
