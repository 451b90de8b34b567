"""A short CPU fit on a real Trainer writes its last window in the training process, with no writer
process (``handoff.finishes_at_end``; the rule: tests/unit/test_finish_at_end.py)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from conftest import MarkerModel, load_trace, loader, make_trainer, marker_steps, overlaps_without_nesting, trace_files

from vt_lightning import VizTraceCallback
from vt_lightning.controller import handoff

# ---------------------------------------------------------------- a real fit


def _count_writer_processes(monkeypatch) -> list[int]:
    started: list[int] = []
    real = handoff.WriterProcess

    def counted() -> Any:
        process = real()
        started.append(process.pid)
        return process

    monkeypatch.setattr(handoff, "WriterProcess", counted)
    return started


@pytest.mark.parametrize(
    "stage, limits, steps",
    [
        ("validate", dict(limit_val_batches=8), {2, 3, 4}),  # closes 3 batches before the end
        ("test", dict(limit_test_batches=5), {2, 3, 4}),  # closes at the last batch
        ("predict", dict(limit_predict_batches=4), {2, 3}),  # cut by the stage's end
        ("short fit", dict(max_steps=-1, max_epochs=1, limit_train_batches=4), {2, 3}),  # cut by fit's end
    ],
)
def test_every_stages_end_finishes_its_last_window_without_a_writer_process(
    tmp_path, monkeypatch, stage, limits, steps
):
    """validate / test / predict, and a fit cut by its end, hold their last window and finish it in the
    training process once the stage stopped, as fit does: no writer process starts at their end."""

    class AllStages(MarkerModel):
        def _eval(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        validation_step = test_step = predict_step = _eval

    started = _count_writer_processes(monkeypatch)
    cb = VizTraceCallback(stages=[stage.split()[-1]], memory_snapshot=False)  # batches 2-4
    trainer = make_trainer(tmp_path, [cb], **limits)
    getattr(trainer, stage.split()[-1])(AllStages(), loader())
    assert started == []
    (trace_path,) = trace_files(tmp_path)
    assert load_trace(trace_path)["vt_lightning"]["steps"] == sorted(steps)


@pytest.mark.parametrize("within_s, processes", [(5.0, 0), (0.0, 1)])
def test_a_short_cpu_fit_writes_its_last_window_without_a_writer_process(tmp_path, monkeypatch, within_s, processes):
    started = _count_writer_processes(monkeypatch)
    monkeypatch.setattr(handoff, "FINISH_AT_END_WITHIN_S", within_s)
    cb = VizTraceCallback(wait=4, warmup=1, active=2, repeat=1)
    make_trainer(tmp_path, [cb], max_steps=12).fit(MarkerModel(), loader())
    assert len(started) == processes
    (trace_path,) = trace_files(tmp_path)
    trace = load_trace(trace_path)
    assert marker_steps(trace) == {5, 6}  # the window's active batches, and only those
    assert overlaps_without_nesting(trace) == []
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])  # torch's ops merged in
    assert gc.isenabled()
    assert not list(Path(tmp_path).rglob("*.tmp"))  # nothing half-written left
