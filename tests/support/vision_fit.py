"""One Trainer set-up for ``examples/vision.py``'s CNN and augmenting dataset (DataLoader workers),
shared by the tests that fit it (tests/integration/test_worker_calls.py, tests/integration/test_compiled_nesting.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
from conftest import load_trace, trace_files

from support.paths import REPO
from vt_lightning import VizTraceCallback

EXAMPLE = REPO / "examples" / "vision.py"


def load_vision() -> ModuleType:
    """``examples/vision.py`` as a module (registered, so spawned workers can unpickle its classes)."""
    spec = importlib.util.spec_from_file_location("vt_example_vision", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fit_vision(
    root: Path,
    *,
    max_steps: int,
    batch_size: int,
    length: int,
    backend: str = "none",
    logger: bool = False,
    loader: Any = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Seeded fit of the example's model with ``VizTraceCallback(**options)`` on the CPU (two
    workers unless ``loader`` is given); the window traces written, in order."""
    vision = load_vision()
    L.seed_everything(0)
    callback = VizTraceCallback(budget_time_share=None, writer_timeout=300, **options)
    trainer = L.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        max_steps=max_steps,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        logger=logger,
    )
    if loader is None:
        loader = vision.loader(batch_size=batch_size, num_workers=2, length=length)
    trainer.fit(vision.ImageClassifier(backend), loader)
    return [load_trace(path) for path in trace_files(root)]
