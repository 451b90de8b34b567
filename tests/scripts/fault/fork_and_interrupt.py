"""Training runs where a process forks inside a window, or Ctrl-C arrives; run by
tests/system/test_fork_interrupt.py in a subprocess. Prints one JSON report as its last line (when it gets
that far).

    python fork_and_interrupt.py <root> <scenario> [--no-callback]

Scenarios:
  os_fork      training_step forks at each window's first active step; the child works a little
               and leaves with sys.exit(0), which unwinds Lightning's loop in the child (its
               on_exception and teardown hooks run there).
  mp_fork      training_step runs a multiprocessing "fork" Process at each window's active steps.
  workers      non-persistent DataLoader workers (fork), re-made at every epoch, inside windows.
  sigint       after window 0 is handed to the writer, SIGINT goes to the whole process group
               (what a terminal's Ctrl-C does).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest's MarkerModel

import torch  # noqa: E402
from conftest import MarkerModel, make_trainer  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from vt_lightning import VizTraceCallback  # noqa: E402
from vt_lightning.controller import handoff  # noqa: E402

root, scenario = sys.argv[1], sys.argv[2]
with_callback = "--no-callback" not in sys.argv
if scenario == "sigint":  # Ctrl-C aimed at the writer process too: window 0 must start it
    handoff.FINISH_AT_END_WITHIN_S = 0.0
children: list[dict] = []
report: dict = {}


def child_work(path: str) -> None:
    """What a forked child does: a little work, a file to prove it ran."""
    torch.ones(4).sum()
    Path(path).write_text(str(os.getpid()))


class ForkingModel(MarkerModel):
    def training_step(self, batch, batch_idx):
        step = self.trainer.fit_loop.total_batch_idx
        if step in (2, 6, 10):  # the first active step of each window (wait 1, warmup 1, active 2)
            marker = os.path.join(root, f"child-{scenario}-{step}")
            started = time.monotonic()
            if scenario == "os_fork":
                pid = os.fork()
                if pid == 0:
                    child_work(marker)
                    sys.exit(0)  # unwinds through Lightning in the child: its hooks run here
                _, status = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(status)
            else:
                proc = multiprocessing.get_context("fork").Process(target=child_work, args=(marker,))
                proc.start()
                proc.join(60)
                code = proc.exitcode
            children.append(
                {"step": step, "exit": code, "seconds": time.monotonic() - started, "ran": os.path.exists(marker)}
            )
        return super().training_step(batch, batch_idx)


class Interrupt(Callback):
    """Ctrl-C right after window 0 was handed to the writer (this callback runs after ours)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.fit_loop.total_batch_idx == 4:  # window 0 (batches 2-3) closed just now, before this hook
            if with_callback:
                writer = callbacks[0]._controller.writer
                deadline = time.monotonic() + 30
                while writer.process is None and time.monotonic() < deadline:
                    time.sleep(0.01)  # the writer thread starts the process at the hand-off
                pid = writer.process.pid
                report["writer_own_session"] = os.getsid(pid) != os.getsid(0)
                os.kill(pid, signal.SIGINT)  # even aimed at it, Ctrl-C leaves it writing
                time.sleep(0.2)
                report["writer_survived_sigint"] = writer.process.alive()
                Path(root, "interrupt.json").write_text(json.dumps(report))  # fit ends in sys.exit(1)
            os.killpg(os.getpgid(0), signal.SIGINT)
            time.sleep(1.0)  # the signal is delivered at once; the sleep is interrupted


def data() -> DataLoader:
    dataset = TensorDataset(torch.randn(24 if scenario == "workers" else 48, 8))
    if scenario == "workers":
        return DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=False,
                          multiprocessing_context="fork")  # fmt: skip
    return DataLoader(dataset, batch_size=4)


schedule = {"wait": 1, "warmup": 1, "active": 2, "repeat": 3}
# No run budget: the children forked inside the windows' steps take seconds on a loaded machine, which
# the budget counts as the windows' overhead and would stop the third window (budget_time_share).
callbacks: list = [VizTraceCallback(**schedule, writer_timeout=60, budget_time_share=None)] if with_callback else []
if scenario == "sigint":
    callbacks.append(Interrupt())
model = ForkingModel() if scenario in ("os_fork", "mp_fork") else MarkerModel()
start = time.monotonic()
# A child that unwinds through Lightning runs its teardown, which flushes the loggers; TensorBoard's
# flush waits on its writer thread, which a forked child does not have, and hangs whenever events were
# still queued at the fork (with or without vt_lightning). CSVLogger has no thread.
logger = CSVLogger(root) if scenario == "os_fork" else True
make_trainer(root, callbacks, max_steps=12, logger=logger).fit(model, data())
print(
    json.dumps(
        {
            "fit_seconds": time.monotonic() - start,
            "children": children,
            "train_batches": model.train_batches,
            "results": [str(r.trace_path) for r in callbacks[0].results] if with_callback else [],
            **report,
        }
    )
)
