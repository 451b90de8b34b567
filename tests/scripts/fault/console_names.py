"""A fit whose every name a console line can carry holds control characters; run by
tests/system/test_hostile_names.py, which reads this process's output bytes.

    python console_names.py <root>

Seeded: the output directory (``dirpath``: every end-of-run line, the table's path, the trigger
file's line), the function a ``python_bound`` verdict names (renamed to hold ESC, CR and a
right-to-left override, ~6 ms of pure Python per step) and the file of a second busy function (a
newline and ESC[2J in its name).
"""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback

EVIL = "esc\x1b[31mRED\x1b[0m\r\u202eevil"
SPIN = """import time
def spin_in_bad_file(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass
"""


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def main() -> None:
    root = Path(sys.argv[1])
    mods = root / "mods"
    mods.mkdir(parents=True)
    bad_file = mods / "bad\n\x1b[2Jname.py"
    bad_file.write_text(SPIN)
    spec = importlib.util.spec_from_file_location("badname", bad_file)
    assert spec is not None and spec.loader is not None
    badname = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(badname)
    names = {"co_name": EVIL, "co_qualname": EVIL} if sys.version_info >= (3, 11) else {"co_name": EVIL}
    spin = types.FunctionType(_spin.__code__.replace(**names), globals(), EVIL)

    class Busy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            spin(6)
            badname.spin_in_bad_file(3)
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    out = root / "out\x1b]0;title\x07\u202e"
    cb = VizTraceCallback(dirpath=str(out), trigger_file=True, memory_snapshot=False)
    trainer = L.Trainer(
        default_root_dir=str(root), accelerator="cpu", max_steps=6, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
    )  # fmt: skip
    trainer.fit(Busy(), DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))


if __name__ == "__main__":
    main()
