"""What several benchmarks share: a quiet process, the one-window Trainer, catching what the writer
is handed, and writing a generated block into a docs page. Import after ``sys.path`` holds
``benchmarks/`` and the checkout (as each benchmark's header sets it).

Each helper is a separate function: add new ones at the end, in a section of their own.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

QUIET_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "vt_lightning")

# --------------------------------------------------------------------------------------------------
# A quiet, comparable process
# --------------------------------------------------------------------------------------------------


def quiet(threads: int | None = 1) -> None:
    """No warnings, only the loggers' errors, and torch on ``threads`` threads (None: as it is), so
    a benchmark's output is its table and runs compare on a shared machine."""
    warnings.filterwarnings("ignore")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------
# One window of a real fit, caught where the writer takes it
# --------------------------------------------------------------------------------------------------


def cpu_trainer(root: str, callbacks: list[Any], max_steps: int) -> Any:
    """The benchmarks' Trainer: the CPU, ``max_steps`` batches, no logger, checkpoint, progress bar,
    model summary or validation (nothing but the steps and the callbacks)."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
        callbacks=callbacks,
    )


@contextlib.contextmanager
def writer_in_process(
    module: Any, name: str, spy: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> Iterator[None]:
    """Windows finished on the training process's writer thread (no writer process, no window held
    to the end of fit), with ``module.name`` (a pipeline step) replaced by ``spy(original)`` for
    the block: how a benchmark catches what the writer is handed (a ``WindowJob``, the events to
    filter) in a real fit."""
    from vt_lightning.controller import handoff

    original = getattr(module, name)
    saved = handoff.USE_WRITER_PROCESS, handoff.FINISH_AT_END_WITHIN_S
    handoff.USE_WRITER_PROCESS = False
    handoff.FINISH_AT_END_WITHIN_S = 0.0
    setattr(module, name, spy(original))
    try:
        yield
    finally:
        setattr(module, name, original)
        handoff.USE_WRITER_PROCESS, handoff.FINISH_AT_END_WITHIN_S = saved


# --------------------------------------------------------------------------------------------------
# Generated blocks in docs pages
# --------------------------------------------------------------------------------------------------


def write_block(doc: Path, start: str, end: str, block: str) -> None:
    """Replace the text between the ``start`` and ``end`` markers of ``doc`` with ``block`` (which
    carries the markers), or append it when the page has none yet."""
    text = doc.read_text() if doc.exists() else "# Performance\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)
