"""A torch.compile'd LightningModule trained through a vt_lightning window; the job must exit 0.

Run as a subprocess by tests/system/test_exit.py: ``python compiled_fit.py OUT_DIR [cuda]``. Prints one
JSON line with what the window wrote, which hooks were left and what is still running that the
interpreter's shutdown would wait for or tear down under it (threads, child processes), then
returns normally, so the exit status is the interpreter's own shutdown (where the crash on 3.12.3 +
CUDA happened).
"""

import json
import os
import sys
import threading
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


def lingering_threads() -> list[str]:
    """Threads shutdown would join (non-daemon) and any thread of ours still running."""
    return sorted(
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and (not t.daemon or t.name.startswith("vt_lightning"))
    )


def child_processes() -> list[str]:
    """This process's Python children, reaped or not (a zombie counts): ``pid state command``.
    Ours are Python (the writer process, VizTracer's dump children, forks of this one); others are
    the environment's: Lightning's MPI detection starts Open MPI's ``orted`` where mpi4py is
    installed, and torch keeps ``addr2line`` processes for the C++ frames of CUDA memory stacks."""
    with open("/proc/self/comm") as f:
        own = f.read().strip()
    children = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        command, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if int(rest[1]) == os.getpid() and (command == own or command.startswith("python")):  # rest: state, ppid
            children.append(f"{entry} {rest[0]} {command}")
    return children


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
    hooks = cb._controller.python.installed_hooks() if cb._controller.python is not None else []
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*.pt.trace.json.gz"))
    report = {"files": files, "hooks": hooks, "threads": lingering_threads(), "children": child_processes()}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
