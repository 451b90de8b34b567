"""A 2-rank ``strategy="ddp_spawn"`` fit on CPU (gloo): Lightning pickles the Trainer, callbacks
included, into each spawned rank. Run by tests/system/test_ddp_spawn.py.

    python train_spawn.py ROOT code|env   (env: the callback comes from VT_LIGHTNING=1)
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    root, how = sys.argv[1], sys.argv[2]
    callbacks = []
    if how == "code":
        from vt_lightning import VizTraceCallback

        callbacks = [VizTraceCallback(wait=1, warmup=1, active=2, memory_snapshot=False)]
    trainer = L.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))


if __name__ == "__main__":  # spawned ranks import this module: nothing may run at import
    main()
