"""Memory snapshots from real runs: torch.profiler's memory events and a Trainer's window become a
snapshot memory_viz opens; on CUDA, the recorder's history and the out-of-memory snapshot."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.memory import check_memory_viz, names

from vt_lightning.analysis.memory_snapshot import build_cpu_snapshot
from vt_lightning.export.atomic import write_snapshot
from vt_lightning.export.layout import oom_file_name
from vt_lightning.recording.memory import CudaMemoryRecorder, dump_oom_snapshot, is_cuda_oom


def test_profiler_memory_events_become_a_snapshot_memory_viz_opens(tmp_path):
    """Real torch.profiler events, Python calls placed around the ops as the merge places them."""

    def make(n):
        return torch.ones(n, n) @ torch.ones(n, n)

    keep = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        keep.append(make(64))
        scratch = torch.zeros(1000)
        del scratch
    raw = tmp_path / "torch.json"
    prof.export_chrome_trace(str(raw))
    import json

    events = json.loads(raw.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert ops and any(e.get("name") == "[memory]" for e in events)
    first, last = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    mm = next(e for e in ops if e["name"] in ("aten::matmul", "aten::mm"))
    pid, tid = mm["pid"], mm["tid"]
    here = Path(__file__).resolve()
    python = [  # what VizTracer's events look like once merged: same pid/tid, cat FEE
        {"ph": "X", "cat": "FEE", "name": f"training_step ({here}:1)", "pid": pid, "tid": tid,
         "ts": first - 1.0, "dur": last - first + 2.0},
        {"ph": "X", "cat": "FEE", "name": f"make ({here}:2)", "pid": pid, "tid": tid,
         "ts": min(e["ts"] for e in ops if e["name"] == "aten::ones") - 0.5,
         "dur": mm["ts"] + mm["dur"] - min(e["ts"] for e in ops if e["name"] == "aten::ones") + 1.0},
    ]  # fmt: skip
    snap = build_cpu_snapshot(events + python)
    trace = snap["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert any(e["size"] == 64 * 64 * 4 and names(e)[-2:] == ["make", "training_step"] for e in allocs)
    assert any(e["size"] == 4000 and names(e)[-1] == "training_step" for e in allocs)
    assert all(f["filename"] == str(here) for e in allocs for f in e["frames"] if f["name"] == "make")
    assert any(b["state"] == "active_allocated" for s in snap["segments"] for b in s["blocks"])  # keep[0]

    path = tmp_path / "vm_0.0000000001.memory_snapshot.pickle"
    write_snapshot(path, snap)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    stats = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert "total_allocated:" in stats.stdout
    html = tmp_path / "trace.html"
    plot = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(html)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert "MemoryViz.js" in html.read_text()
    check_memory_viz(pickle.loads(path.read_bytes()))


def test_a_trainer_window_writes_a_snapshot_whose_frames_name_the_training_code(tmp_path):
    from conftest import MarkerModel, loader, make_trainer

    from vt_lightning import VizTraceCallback

    cb = VizTraceCallback(wait=1, warmup=1, active=2)
    trainer = make_trainer(tmp_path, [cb], max_steps=5)
    trainer.fit(MarkerModel(), loader())
    snapshots = sorted(tmp_path.rglob("*.memory_snapshot.pickle"))
    assert len(snapshots) == 1
    snap = pickle.loads(snapshots[0].read_bytes())
    frame_names = {f["name"] for t in snap["device_traces"] for e in t for f in e["frames"]}
    assert {"batch_2", "batch_3"} <= frame_names  # the model's per-batch Python function
    assert "training_step" in {n.rsplit(".", 1)[-1] for n in frame_names}
    check_memory_viz(snap)


BUFFER_MIB = 8


def hold_a_buffer() -> torch.Tensor:
    """The test's own allocation, live at the window's peak."""
    return torch.zeros(BUFFER_MIB * 2**18)  # float32: BUFFER_MIB MiB


def test_a_trainer_window_writes_a_memory_view_with_the_peak_at_the_users_line(tmp_path):
    """The memory panel's data: the peak, a curve over the recorded steps and, live at the peak,
    this module's ``hold_a_buffer`` at its line."""
    import lightning as L
    import orjson
    from conftest import loader, make_trainer

    from vt_lightning import VizTraceCallback

    class Holding(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            held = hold_a_buffer()
            return self.layer(batch[0]).pow(2).mean() + held[0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    make_trainer(tmp_path, [VizTraceCallback(wait=1, warmup=1, active=3)], max_steps=6).fit(Holding(), loader())
    (summary_path,) = sorted(tmp_path.rglob("*.summary.jsonc"))
    memory = orjson.loads(summary_path.read_bytes())["memory"]
    steps = orjson.loads(summary_path.read_bytes())["steps"]["bounds_us"]
    line = hold_a_buffer.__code__.co_firstlineno
    top = memory["top_sites_at_peak"][0]
    assert (top["function"], top["file"], top["line"], top["origin"]) == ("hold_a_buffer", __file__, line, "user")
    assert top["bytes"] == BUFFER_MIB * 2**20 and top["allocations"] == 1
    view = orjson.loads((summary_path.parent / memory["view"]).read_bytes())
    assert memory["view"].endswith(".memory_view.jsonc") and view["steps"] == steps
    cpu = view["devices"]["cpu"]
    assert cpu["peak_bytes"] == memory["peak_allocated_bytes"] >= BUFFER_MIB * 2**20
    assert cpu["peak_ts_us"] == memory["peak_ts_us"]
    first, last = min(s for s, _ in steps.values()), max(e for _, e in steps.values())
    assert first <= cpu["peak_ts_us"] <= last and [cpu["peak_ts_us"], cpu["peak_bytes"]] in cpu["points"]
    assert cpu["top_sites_at_peak"][0] == top


# ---------------------------------------------------------------------------------------------
# the real CUDA allocator
# ---------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_history_for_one_window(tmp_path):
    def allocate_on_gpu():
        return torch.empty(1 << 20, device="cuda")

    torch.cuda.init()
    before = torch.empty(1024, device="cuda")
    rec = CudaMemoryRecorder(max_entries=1000)
    rec.start()
    try:
        kept = allocate_on_gpu()
        del before
        snap = rec.snapshot()
    finally:
        rec.stop()
    assert not rec.recording
    allocs = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
    assert any(e["size"] >= 4 << 20 and any(f["name"] == "allocate_on_gpu" for f in e["frames"]) for e in allocs)
    path = tmp_path / "cuda.memory_snapshot.pickle"
    write_snapshot(path, snap)
    out = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # The next window's history starts empty (torch >= 2.5 clears it on start).
    rec.start()
    try:
        second = rec.snapshot()
    finally:
        rec.stop()
    if "clear_history" in rec.start_kwargs():
        second_allocs = [e for t in second["device_traces"] for e in t if e["action"] == "alloc"]
        assert allocs[0]["addr"] not in {e["addr"] for e in second_allocs}
    del kept


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_oom_snapshot(tmp_path):
    rec = CudaMemoryRecorder(max_entries=1000)
    rec.start()
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError) as info:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        assert is_cuda_oom(info.value)
        path = dump_oom_snapshot(tmp_path / oom_file_name("x.memory_snapshot.pickle"), rec)
    finally:
        rec.stop()
    snap = pickle.loads(path.read_bytes())
    assert any(e["action"] == "oom" for t in snap["device_traces"] for e in t)
