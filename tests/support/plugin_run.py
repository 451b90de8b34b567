"""The tiny run both TensorBoard plugin test files read (tests/integration/test_tensorboard.py in
this process, tests/system/test_tensorboard.py as a subprocess beside a live server) and what every
window of it must show in the plugin.

As a script, the subprocess: ``python -m support.plugin_run ROOT [MAX_STEPS]`` with tests/ on
``PYTHONPATH`` trains the tiny model with the test schedule under ROOT.
"""

from __future__ import annotations

import os
import sys

from support import tbcheck

SCHEDULE = dict(wait=1, warmup=1, active=2, repeat=2)
MAX_STEPS = 10
# wait=1, warmup=1, active=2, repeat=2 over global batches 0..9 -> windows on batches 2-3 and 6-7.
EXPECTED_WINDOWS = 2
REQUIRED_VIEWS = {tbcheck.OVERVIEW, tbcheck.OPERATOR, tbcheck.TRACE, tbcheck.MEMORY}


def train_tiny(root: str | os.PathLike, max_steps: int = MAX_STEPS, **callback_kwargs):
    """Fit a tiny model on random CPU data with VizTraceCallback; return the callback."""
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from vt_lightning import VizTraceCallback

    def python_side_work(x: torch.Tensor) -> torch.Tensor:  # shows as a Python (FEE) span
        scale = sum(i * 0.001 for i in range(200))
        return x * (1.0 + scale / 1000)

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(python_side_work(x)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=16)
    callback = VizTraceCallback(**{**SCHEDULE, **callback_kwargs})
    trainer = L.Trainer(
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=True,
        log_every_n_steps=1,
    )
    trainer.fit(Tiny(), data)
    return callback


def check_trace_content(trace: dict, where: str) -> None:
    cats = tbcheck.event_categories(trace)
    assert cats.get("FEE", 0) > 0, f"{where}: no Python (VizTracer, cat FEE) events; X categories: {cats}"
    assert cats.get("cpu_op", 0) > 0, f"{where}: no torch ops (cat cpu_op); X categories: {cats}"
    names = {e.get("name") for e in trace["traceEvents"] if e.get("cat") == "FEE"}
    assert any("python_side_work" in str(n) for n in names), f"{where}: the user's Python function is missing"
    nesting = tbcheck.nesting_report(trace, tolerance_us=1.0)
    assert nesting["shared_threads"] >= 1, f"{where}: Python calls and torch ops never share a thread: {nesting}"
    assert nesting["crossings"] == 0, f"{where}: Python calls and torch ops overlap without nesting: {nesting}"
    assert nesting["torch_in_python"] >= 0.99 * nesting["torch_ops"], (
        f"{where}: torch ops of the training thread are not inside Python calls: {nesting}"
    )


if __name__ == "__main__":
    train_tiny(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else MAX_STEPS)
