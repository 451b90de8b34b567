"""A small convolutional model on augmented images from DataLoader workers, traced by vt_lightning.

What a vision user writes, without torchvision (whose wheels replace a CPU build of torch): a
dataset that decodes and augments each image in NumPy (random crop, flip, noise) in two
DataLoader workers, a small CNN, and, optionally, the same CNN under ``torch.compile``. No
downloads: the images are synthetic. A fit takes seconds on a 2-core CPU (a cold inductor compile,
about 20 s, comes on top).

    python examples/vision.py                           # eager, 2 workers
    python examples/vision.py --compile aot_eager       # compiled (no code generation)
    python examples/vision.py --compile inductor        # compiled (C++ code generation)
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback

BACKENDS = ("none", "aot_eager", "inductor")


def decode(index: int, size: int) -> np.ndarray:
    """Stands in for reading and decoding a file: a deterministic uint8 image per index."""
    rng = np.random.default_rng(index)
    base = rng.integers(0, 256, size=(3, 1, 1), dtype=np.uint8)
    ramp = np.linspace(0, 64, size, dtype=np.float32)
    image = base + ramp[None, :, None] + ramp[None, None, :]
    return np.clip(image, 0, 255).astype(np.uint8)


def random_crop(image: np.ndarray, size: int, pad: int, rng: np.random.Generator) -> np.ndarray:
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad)), mode="reflect")
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    return padded[:, top : top + size, left : left + size]


def random_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return image[:, :, ::-1] if rng.random() < 0.5 else image


def add_noise(image: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    noisy = image.astype(np.float32) / 255.0 + rng.normal(0.0, scale, size=image.shape).astype(np.float32)
    return (noisy - 0.5) / 0.25


class AugmentedImages(Dataset):
    """Synthetic 3×``size``×``size`` images, each crop/flip/noise-augmented on every read."""

    def __init__(self, length: int = 512, size: int = 32, classes: int = 10, seed: int = 0) -> None:
        self.length, self.size, self.classes = length, size, classes
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.augment(decode(index, self.size))
        return torch.from_numpy(np.ascontiguousarray(image)), index % self.classes

    def augment(self, image: np.ndarray) -> np.ndarray:
        image = random_crop(image, self.size, pad=4, rng=self.rng)
        image = random_flip(image, self.rng)
        return add_noise(image, 0.05, self.rng)


def seed_worker(worker_id: int) -> None:
    """Each worker its own augmentation stream (its dataset copy would otherwise repeat another's)."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        info.dataset.rng = np.random.default_rng(1000 + worker_id)  # type: ignore[attr-defined]


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(2 * width * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class ImageClassifier(L.LightningModule):
    """``SmallCNN``, compiled with ``backend`` unless it is ``"none"``."""

    def __init__(self, backend: str = "none", lr: float = 0.05) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
        self.lr = lr
        self.net = SmallCNN()
        self.forward_fn: Any = self.net if backend == "none" else torch.compile(self.net, backend=backend)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = nn.functional.cross_entropy(self.forward_fn(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def loader(batch_size: int = 32, num_workers: int = 2, length: int = 512) -> DataLoader:
    return DataLoader(
        AugmentedImages(length=length),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        worker_init_fn=seed_worker,
        persistent_workers=num_workers > 0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", choices=BACKENDS, default="none", help="torch.compile backend")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", default=".", help="default_root_dir (traces go to <root>/lightning_logs)")
    parser.add_argument("--wait", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    L.seed_everything(0)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    tracer = VizTraceCallback(wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat)
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        callbacks=[tracer],
        enable_checkpointing=False,
        log_every_n_steps=1,
        enable_model_summary=False,
    )
    data = loader(args.batch_size, args.workers)
    trainer.fit(ImageClassifier(args.compile), data)  # vt_lightning prints the table and the commands


if __name__ == "__main__":
    main()
