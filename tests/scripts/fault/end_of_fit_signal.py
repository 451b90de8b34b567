"""A short fit whose end-of-fit finish is held at one phase until a signal arrives; run by
tests/system/test_end_of_fit_signals.py in a subprocess, whose exit status is the subject.

    python end_of_fit_signal.py <root> <phase> <handler> [--no-callback]

The fit runs 3 batches with a window at batches 2-3, so the window is still open when fit ends: its
hand-off, its writing and the writer's shutdown all happen in the end-of-fit hooks. At ``<phase>``
the process writes ``<root>/paused`` and waits until ``<root>/signalled`` exists (the test writes it
right after its signal). Phases (where the training thread is when the signal arrives):

  hand_off  closing the last window (``WindowController._hand_off``, on the training thread)
  held      waiting for the held last window, finished on the writer thread (no writer process)
  writer    waiting for the writer process to finish the last window
  teardown  the writer stopped, the end-of-run message (``teardown``)
  none      no pause, no signal: the last window goes to a writer process, and fit returns

With ``--no-callback`` a plain callback waits in ``on_train_end`` (``teardown`` for that phase)
instead. Handlers: ``lightning`` (Python's SIGINT handler: Lightning's Ctrl-C handling), ``user``
(a SIGTERM handler that calls ``sys.exit(143)``), ``default`` (SIGTERM's default action).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest's MarkerModel

from conftest import MarkerModel, loader, make_trainer  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from vt_lightning import VizTraceCallback  # noqa: E402
from vt_lightning.controller import handoff, messages  # noqa: E402
from vt_lightning.controller.controller import WindowController  # noqa: E402
from vt_lightning.export.writer_process import WriterProcess  # noqa: E402

root, phase, handler = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with_callback = "--no-callback" not in sys.argv
root.mkdir(parents=True, exist_ok=True)
if handler == "user":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))


def pause(note: str = "") -> None:
    """Say where we are, then wait (interruptibly, on whichever thread) for the test's signal."""
    (root / "paused").write_text(note)
    deadline = time.monotonic() + 60
    while not (root / "signalled").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def pausing(original, when=lambda *args: True, note=lambda *args: ""):
    def wrapper(*args, **kwargs):
        if when(*args):
            pause(note(*args))
        return original(*args, **kwargs)

    return wrapper


class Pause(Callback):
    """Without our callback: the same wait at the same hook."""

    def on_train_end(self, trainer, pl_module):
        if phase != "teardown":
            pause()

    def teardown(self, trainer, pl_module, stage):
        if phase == "teardown":
            pause()


if with_callback:
    if phase in ("writer", "teardown", "none"):
        # The writer process starts ahead of the window, so the last window, closed by fit's end, goes
        # to it (a window the stage's end closes is held only when no writer process runs).
        handoff.HAND_OFF_START_ON_CPU = False
        handoff.PRESTART_LEAD_BATCHES = 0
    if phase == "hand_off":
        WindowController._hand_off = pausing(WindowController._hand_off)
    elif phase == "held":
        handoff.finish_window = pausing(handoff.finish_window)
    elif phase == "writer":
        WriterProcess.call = pausing(
            WriterProcess.call, when=lambda self, request: request != "ping", note=lambda self, request: str(self.pid)
        )
    elif phase == "teardown":
        messages.end_of_run = pausing(messages.end_of_run)
    callbacks: list = [VizTraceCallback(wait=1, warmup=1, active=2, repeat=1, budget_time_share=None)]
else:
    callbacks = [Pause()]
make_trainer(root, callbacks, max_steps=3, logger=False).fit(MarkerModel(), loader())
print("fit returned")
