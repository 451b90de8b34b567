"""Notebooks (issue 50): a real Jupyter kernel (ipykernel), driven headless by nbclient as a user's
notebook runs: one callback made in the first cell, a fit cell run twice, DataLoader workers, and
``strategy="ddp_notebook"`` with 2 CPU processes. The files are read here, in the test's process,
with the command's reader and torch-tb-profiler's parser.

Each training step opens ``record_function("nb_batch_<global batch>")``: the trace says which
batches its window recorded. Schedule: the defaults (one window, batches 2-4) over 6 batches.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import ipykernel  # noqa: F401  (the kernel nbclient starts: the `test` extra installs it)
import nbclient
import nbformat
import pytest
from conftest import recorded_name
from support import tbcheck

from vt_lightning.cli.command import load_windows
from vt_lightning.constants import TRACE_SUFFIX
from vt_lightning.export.reading import MemoryBudget, read_trace

pytestmark = pytest.mark.serial  # a kernel, 2 DDP processes and DataLoader workers: the whole 2-core machine

CELL_TIMEOUT_S = 300
WINDOW_BATCHES = [2, 3, 4]

SETUP = """
import json, sys, threading, warnings
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from vt_lightning import VizTraceCallback
warnings.simplefilter("ignore")

class NotebookModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        with torch.profiler.record_function(f"nb_batch_{self.trainer.fit_loop.total_batch_idx}"):
            return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

def make_trainer(root, callback, **kwargs):
    return L.Trainer(default_root_dir=root, accelerator="cpu", max_steps=6, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback], **kwargs)

def hooks_left():
    monitoring = getattr(sys, "monitoring", None)
    tools = [sys.monitoring.get_tool(i) for i in range(6)] if monitoring else []
    return {"profile": repr(sys.getprofile()), "thread_profile": repr(threading.getprofile()),
            "monitoring": [t for t in tools if t is not None],
            "torch_profiler": torch.autograd.profiler._is_profiler_enabled}

data = TensorDataset(torch.randn(48, 8))
callback = VizTraceCallback()
"""

FIT = """
make_trainer("{root}/fit", callback).fit(NotebookModel(), DataLoader(data, batch_size=4))
print("HOOKS " + json.dumps(hooks_left()))
"""

WORKERS = """
make_trainer("{root}/workers", VizTraceCallback()).fit(NotebookModel(), DataLoader(data, batch_size=4, num_workers=2))
"""

DDP = """
make_trainer("{root}/ddp", VizTraceCallback(), devices=2, strategy="ddp_notebook").fit(
    NotebookModel(), DataLoader(data, batch_size=4))
"""


def cell_text(cell: Any) -> str:
    """What a cell printed, its errors' tracebacks included."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text") or "")
        parts.append("\n".join(out.get("traceback", [])))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The notebook run once in a fresh kernel: its cells (with outputs) and its root."""
    root = tmp_path_factory.mktemp("notebook")
    sources = [SETUP, FIT, WORKERS, DDP]
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s.replace("{root}", str(root)).strip()) for s in sources]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the kernel inherits it: 2 DDP ranks on 2 cores
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(root)}}
    )
    fit_outputs = []
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
                if sources[index] is FIT:  # the same cell run again, as a user re-runs it
                    fit_outputs.append(cell_text(cell))
                    client.execute_cell(cell, index)
                    fit_outputs.append(cell_text(cell))
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    return {"root": root, "cells": nb.cells, "fit_outputs": fit_outputs}


def traces(directory: Path) -> list[Path]:
    return sorted(directory.rglob(f"*{TRACE_SUFFIX}"), key=str)


def batches(trace: dict[str, Any]) -> list[int]:
    """The global batches whose training step the trace recorded (the ``nb_batch_<n>`` annotations)."""
    found = {int(m[1]) for e in trace["traceEvents"] if (m := re.fullmatch(r"nb_batch_(\d+)", str(e.get("name", ""))))}
    return sorted(found)


def python_calls(trace: dict[str, Any], name: str) -> int:
    """VizTracer's calls of ``name`` defined in the notebook's cell (ipykernel files a cell's code as
    ``/tmp/ipykernel_<pid>/<hash>.py``; on 3.10 a method's name alone matches Lightning's too)."""
    return sum(
        1
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(f"{name} (") and "ipykernel_" in e["name"]
    )


def test_a_fit_cell_run_twice_records_both_fits_and_leaves_no_hook(notebook):
    found = traces(notebook["root"] / "fit")
    # One window per fit: the re-run is recorded too, in a directory of its own.
    assert sorted(p.parent.name for p in found) == ["window_000-batches_2-4", "window_000-batches_2-4.2"]
    for path in found:
        trace = read_trace(path, MemoryBudget())
        assert batches(trace) == WINDOW_BATCHES
        assert python_calls(trace, recorded_name("NotebookModel.training_step")) == len(WINDOW_BATCHES)
        tbcheck.parse_trace(path)
    windows = load_windows(str(notebook["root"] / "fit"))
    assert len(windows) == 2 and all(w["steps"]["recorded"] == WINDOW_BATCHES for w in windows)
    for output in notebook["fit_outputs"]:  # after each fit, in the kernel: nothing of ours left installed
        hooks = json.loads(next(line for line in output.splitlines() if line.startswith("HOOKS "))[6:])
        assert "viztracer" not in hooks.pop("monitoring")  # 3.12+: VizTracer's sys.monitoring tool is freed
        assert hooks == {"profile": "None", "thread_profile": "None", "torch_profiler": False}


def test_a_fit_with_dataloader_workers_records_them(notebook):
    (path,) = traces(notebook["root"] / "workers")
    trace = read_trace(path, MemoryBudget())
    assert batches(trace) == WINDOW_BATCHES
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert any("DataLoader worker" in n for n in names), names
    tbcheck.parse_trace(path)


def test_ddp_notebook_records_both_ranks_and_their_job_file(notebook):
    directory = notebook["root"] / "ddp"
    found = traces(directory)
    assert [p.name.split(".")[0].rsplit("_", 1)[1] for p in found] == ["0", "1"]
    assert len({p.parent for p in found}) == 1
    for path in found:
        assert batches(read_trace(path, MemoryBudget())) == WINDOW_BATCHES
    (job,) = (found[0].parent / "job").glob("job.*.json.gz")
    meta = read_trace(job, MemoryBudget())["vt_lightning_job"]
    assert [r["rank"] for r in meta["ranks"]] == [0, 1]
    tbcheck.load_run_dir(found[0].parent, allowed_warnings=[r"communication op not belong to any step"])


def test_no_cell_failed(notebook):
    for cell in notebook["cells"]:
        assert not any(out.get("output_type") == "error" for out in cell.get("outputs", [])), cell_text(cell)
