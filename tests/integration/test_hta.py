"""Our window files in Holistic Trace Analysis (the optional ``[analysis]`` extra); skipped without it."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import MarkerModel, load_trace, loader, make_trainer, trace_files

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import encode_trace, merge_trace
from vt_lightning.export.report import gpu_breakdowns_missing, hta_trace_files, summary_names

hta = pytest.importorskip(
    "hta.trace_analysis", reason="HolisticTraceAnalysis is not installed (pip install 'vt-lightning[analysis]')"
)


def _no_rank_guess(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if "does not have the rank" in r.getMessage()]


def test_hta_reads_the_rank_of_a_window_without_ddp(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, [VizTraceCallback(wait=0, warmup=1, active=2)], max_steps=4)
    trainer.fit(MarkerModel(), loader())
    (trace,) = trace_files(tmp_path)
    assert load_trace(trace)["distributedInfo"]["rank"] == 0
    with caplog.at_level(logging.INFO):
        # trace_files, not trace_dir: HTA takes every *.json / *.gz of a directory for a trace,
        # our summary.json included (docs/viewing.md).
        analysis = hta.TraceAnalysis(trace_files=hta_trace_files(trace.parent), trace_dir=str(trace.parent))
    assert list(analysis.t.get_ranks()) == [0]
    assert analysis.t.trace_files == {0: str(trace)}  # not the summary.json beside it
    _no_rank_guess(caplog)

    # docs/viewing.md: on a CPU window HTA's GPU breakdowns raise a bare IndexError; we say why first.
    with pytest.raises(IndexError):
        analysis.get_temporal_breakdown(visualize=False)
    said = gpu_breakdowns_missing(trace.parent)
    assert said is not None and "no GPU kernels were recorded (a CPU run)" in said and "\n" not in said
    summary_path = trace.parent / summary_names(trace.name)[0]
    summary = json.loads(summary_path.read_text())
    summary["gpu"] = {"devices": ["cuda:0"], "busy_percent": 50.0, "kernel_ms": 1.0, "wall_ms": 2.0, "idle_gaps": []}
    summary_path.write_text(json.dumps(summary))
    assert gpu_breakdowns_missing(trace.parent) is None
    summary_path.unlink()
    assert "no summary beside" in (gpu_breakdowns_missing(trace.parent) or "")


def _cuda_window(rank: int) -> dict[str, Any]:
    """A merged two-step CUDA window as finish.py writes it (kernels on stream 7 of GPU 0)."""
    pid, tid = 100, 100

    def x(name: str, ts: float, dur: float, cat: str, **kw: Any) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": kw.pop("pid", pid),
            "tid": kw.pop("tid", tid),
            "ts": ts,
            "dur": dur,
            "args": kw,
        }

    events = [
        x("ProfilerStep#3", 1000.0, 1000.0, "user_annotation"),
        x("ProfilerStep#4", 2000.0, 1000.0, "user_annotation"),
    ]
    for i, start in enumerate((1100.0, 1500.0, 2100.0, 2600.0)):
        events += [
            x("aten::mm", start, 60.0, "cpu_op", **{"External id": i + 1}),
            x("cudaLaunchKernel", start + 10, 20.0, "cuda_runtime", correlation=i + 1, **{"External id": i + 1}),
            x(
                "volta_sgemm_128x64_nn",
                start + 40,
                300.0,
                "kernel",
                pid=0,
                tid=7,
                device=0,
                stream=7,
                correlation=i + 1,
                **{"External id": i + 1},
            ),
            x(f"forward (/home/me/model.py:{i})", start - 5, 80.0, "FEE"),
        ]
    torch_trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85e9}],
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": [e for e in events if e["cat"] != "FEE"],
    }
    base = torch_trace["baseTimeNanoseconds"]  # Python clock == torch clock: no shift
    calibration = Calibration(
        start=ClockPair(python_us=0.0, wall_ns=base, round_trip_us=0.1),
        end=ClockPair(python_us=1e6, wall_ns=base + 10**9, round_trip_us=0.1),
        base_ns=base,
    )
    metadata = {"window": 0, "steps": [3, 4], "global_rank": rank, "world_size": 2}
    return merge_trace(torch_trace, [e for e in events if e["cat"] == "FEE"], calibration, metadata)


def test_hta_breakdowns_run_on_a_cuda_window(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "window_000-batches_3-4"
    run.mkdir()
    for rank in (0, 1):
        (run / f"host_{rank}.0000000003.pt.trace.json.gz").write_bytes(gzip.compress(encode_trace(_cuda_window(rank))))
    with caplog.at_level(logging.INFO):
        analysis = hta.TraceAnalysis(trace_dir=str(run))  # only traces here: HTA finds each rank itself
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    _no_rank_guess(caplog)
    temporal = analysis.get_temporal_breakdown(visualize=False)
    assert sorted(temporal["rank"]) == [0, 1]
    assert (temporal["kernel_time(us)"] > 0).all()
    kernels, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert (kernels["kernel_type"] == "COMPUTATION").any()
    idle = analysis.get_idle_time_breakdown(visualize=False)
    frame = idle[0] if isinstance(idle, tuple) else idle
    assert len(frame) > 0
