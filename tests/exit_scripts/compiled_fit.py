"""A torch.compile'd LightningModule trained through a vt_lightning window; the job must exit 0.

Run as a subprocess by tests/test_exit.py: ``python compiled_fit.py OUT_DIR [cuda]``. Prints one
JSON line with what the window wrote and which hooks were left, then returns normally, so the exit
status is the interpreter's own shutdown (where the crash on 3.12.3 + CUDA happened).
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback


class Compiled(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1)
    trainer = L.Trainer(
        default_root_dir=str(out),
        callbacks=[cb],
        accelerator=accelerator,
        devices=1,
        max_steps=6,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=True,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    data = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8)
    trainer.fit(Compiled(), data)
    hooks = cb._python.installed_hooks() if cb._python is not None else []
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*.pt.trace.json.gz"))
    print(json.dumps({"files": files, "hooks": hooks}), flush=True)


if __name__ == "__main__":
    main()
