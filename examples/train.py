"""A small Lightning training run whose step does visible Python work, traced by vt_lightning.

No downloads: the data is synthetic. Run it: at the end of fit, vt_lightning prints a table of
the recorded windows and the commands that read and open them (docs/quickstart.md shows it).

    python examples/train.py                 # CPU, one process
    python examples/train.py --devices 2     # two DDP processes on CPU (gloo)
"""

from __future__ import annotations

import argparse
import random

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback


class NoisySequences(Dataset):
    """Synthetic token sequences; ``__getitem__`` is plain Python, like a real tokenizer."""

    def __init__(self, size: int = 2048, length: int = 32, vocab: int = 512, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.samples = [[rng.randrange(vocab) for _ in range(length)] for _ in range(size)]
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.samples[index]
        target = sum(tokens) % 2
        return torch.tensor(tokens), torch.tensor(target)


def augment_tokens(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Python-side augmentation: swap a few tokens per row (visible as a Python span)."""
    rows = tokens.tolist()
    for row in rows:
        for _ in range(3):
            i = random.randrange(len(row))
            row[i] = (row[i] + 1) % vocab
    return torch.tensor(rows)


def label_smoothing_weights(targets: torch.Tensor, classes: int, eps: float = 0.1) -> torch.Tensor:
    """Build smoothed one-hot targets with torch ops issued from Python."""
    weights = torch.full((targets.shape[0], classes), eps / (classes - 1))
    return weights.scatter(1, targets.unsqueeze(1), 1.0 - eps)


class TinyTransformer(L.LightningModule):
    def __init__(self, vocab: int = 512, dim: int = 64, heads: int = 4, layers: int = 2, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        tokens = augment_tokens(tokens, self.hparams.vocab)
        logits = self(tokens)
        soft = label_smoothing_weights(targets, 2)
        loss = -(soft * logits.log_softmax(-1)).sum(-1).mean()
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--root", default=".", help="default_root_dir (traces go to <root>/lightning_logs)")
    parser.add_argument("--wait", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    L.seed_everything(0)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    data = DataLoader(NoisySequences(), batch_size=args.batch_size, shuffle=True, num_workers=0)
    tracer = VizTraceCallback(wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat)
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.max_steps,
        callbacks=[tracer],
        enable_checkpointing=False,
        log_every_n_steps=1,
        enable_model_summary=False,
    )
    trainer.fit(TinyTransformer(), data)  # vt_lightning prints the table and the commands at the end


if __name__ == "__main__":
    main()
