"""The callback's CUDA-only paths, driven on CPU with small fakes of the torch calls they make."""

from __future__ import annotations

import dataclasses
import pickle
from typing import ClassVar

import pytest
import torch
from conftest import MarkerModel, loader, make_trainer, trace_files

import vt_lightning.controller.windows as windows
from vt_lightning import VizTraceCallback
from vt_lightning.recording.torchtracer import TorchTracer


class FakeRecorder:
    instances: ClassVar[list[FakeRecorder]] = []

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.calls: list[str] = []
        FakeRecorder.instances.append(self)

    def start(self) -> None:
        self.calls.append("start")

    def snapshot(self) -> dict:
        self.calls.append("snapshot")
        return {
            "segments": [],
            "device_traces": [[{"action": "alloc", "addr": 1, "size": 8, "stream": 0, "time_us": 1, "frames": []}]],
            "fake_cuda": True,
        }

    def stop(self) -> None:
        self.calls.append("stop")


class PretendCuda(VizTraceCallback):
    """Takes the CUDA branches while torch itself stays on the CPU."""

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        run = self._controller.run
        if run is not None:
            self._controller.run = dataclasses.replace(run, cuda=True)


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeRecorder.instances.clear()
    monkeypatch.setattr(windows, "CudaMemoryRecorder", FakeRecorder)
    monkeypatch.setattr(windows, "TorchTracer", lambda config, cuda_available: TorchTracer(config, False))
    return FakeRecorder.instances


def test_each_window_records_and_dumps_the_allocator_history(tmp_path, fake_cuda):
    cb = PretendCuda(wait=0, warmup=1, active=1, repeat=2, memory_max_entries=1234, profile_memory=False)
    make_trainer(tmp_path, [cb], max_steps=4).fit(MarkerModel(), loader())
    assert len(fake_cuda) == 2 and all(r.max_entries == 1234 for r in fake_cuda)
    assert all(r.calls == ["start", "snapshot", "stop"] for r in fake_cuda)
    snapshots = sorted(tmp_path.rglob("*.memory_snapshot.pickle"))
    assert len(snapshots) == 2 and len(trace_files(tmp_path)) == 2
    assert pickle.loads(snapshots[0].read_bytes())["fake_cuda"] is True


def test_out_of_memory_in_a_window_dumps_that_moment(tmp_path, fake_cuda):
    class Ooms(MarkerModel):
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.total_batch_idx == 2:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().training_step(batch, batch_idx)

    cb = PretendCuda(wait=0, warmup=1, active=3, repeat=1)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        make_trainer(tmp_path, [cb], max_steps=6).fit(Ooms(), loader())
    (oom,) = tmp_path.rglob("*.oom.memory_snapshot.pickle")
    assert pickle.loads(oom.read_bytes())["fake_cuda"] is True
    (recorder,) = fake_cuda
    assert recorder.calls[0] == "start" and recorder.calls[-1] == "stop"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_window_writes_a_snapshot(tmp_path):
    cb = VizTraceCallback(wait=0, warmup=1, active=1, repeat=1)
    model = MarkerModel()
    make_trainer(tmp_path, [cb], max_steps=3, accelerator="cuda").fit(model, loader())
    (snapshot,) = tmp_path.rglob("*.memory_snapshot.pickle")
    data = pickle.loads(snapshot.read_bytes())
    assert data["device_traces"] and any(data["device_traces"])
