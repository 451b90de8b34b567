"""One rank of a two-node job simulated on one machine (tests/system/test_two_nodes.py): started by
``torchrun --nnodes 2 --nproc_per_node 2`` on each "node" (its own host name). Every step calls
``torch.distributed.barrier()``; one window, batches 2-3. Each rank prints one line, ``RESULT
{json}``: its rank, host and the files its windows went to.

    python two_nodes.py --dirpath DIR_OR_URL --num-nodes 2 --devices 2 [--writer-timeout S]
"""

from __future__ import annotations

import argparse
import json
import socket

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        torch.distributed.barrier()
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dirpath", required=True)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--writer-timeout", type=float, default=None)
    args = parser.parse_args()
    timeout = {} if args.writer_timeout is None else {"writer_timeout": args.writer_timeout}
    callback = VizTraceCallback(wait=1, warmup=1, active=2, dirpath=args.dirpath, **timeout)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        max_steps=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[callback],
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))
    result = {
        "rank": trainer.global_rank,
        "node": trainer.node_rank,
        "host": socket.gethostname(),
        "world": trainer.world_size,
        "traces": [str(r.trace_path) for r in callback.results],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
