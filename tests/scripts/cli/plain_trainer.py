"""A plain Trainer script with no vt_lightning in its code (the env switch adds the callback).

usage: plain_trainer.py ROOT_DIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl
from _tiny import TinyData, TinyModel

if __name__ == "__main__":
    trainer = pl.Trainer(
        default_root_dir=sys.argv[1],
        max_steps=6,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    names = [type(cb).__name__ for cb in trainer.callbacks]
    print("CALLBACKS", names, flush=True)
    trainer.fit(TinyModel(), TinyData())
