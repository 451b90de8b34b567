"""A tiny LightningModule + DataModule on random CPU data, shared by the CLI test scripts."""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class TinyModel(pl.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TinyData(pl.LightningDataModule):
    def __init__(self, size: int = 64, batch_size: int = 8) -> None:
        super().__init__()
        self.size = size
        self.batch_size = batch_size

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.size, 4, generator=g)
        y = torch.randn(self.size, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size)
