"""The log dir is fixed when fit starts (issue 40: 2): a relative ``default_root_dir`` and an
``os.chdir`` in the user's training step leave every window and the windows table where the log
dir pointed at setup, not under the new working directory."""

from __future__ import annotations

import os

from conftest import MarkerModel, loader, make_trainer, trace_files

from vt_lightning import VizTraceCallback


class MovingModel(MarkerModel):
    """Changes the working directory in its second training step, before any window opens."""

    def __init__(self, elsewhere: str) -> None:
        super().__init__()
        self.elsewhere = elsewhere

    def training_step(self, batch, batch_idx):
        if self.trainer.fit_loop.total_batch_idx == 1:
            os.chdir(self.elsewhere)
        return super().training_step(batch, batch_idx)


def test_a_chdir_during_training_leaves_every_file_under_the_log_dir_of_setup(tmp_path, monkeypatch):
    setup_dir, elsewhere = tmp_path / "setup", tmp_path / "elsewhere"
    setup_dir.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(setup_dir)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, budget_time_share=None)
    # No logger: TensorBoard's and CSV's follow the working directory (their own paths stay relative).
    trainer = make_trainer(tmp_path, [cb], max_steps=10, default_root_dir="rel_logs", logger=False)
    trainer.fit(MovingModel(str(elsewhere)), loader())
    assert os.getcwd() == str(elsewhere)  # the model did move
    logs = setup_dir / "rel_logs"
    traces = trace_files(logs)
    assert len(traces) == 2, sorted(str(p) for p in tmp_path.rglob("*"))
    assert [r.trace_path for r in cb.results] == traces
    assert (logs / "vt_lightning.windows.txt").is_file()
    assert list(elsewhere.rglob("*")) == []
