"""A short fit whose training step calls code with names Python allows and tools may not; run by
tests/system/test_hostile_names.py in a subprocess, whose exit status is part of the subject. Prints one
JSON report as its last line.

    python hostile_names.py <root> <case>

Cases:
  control    functions whose names and file names hold ESC, BEL, CR, a newline, a right-to-left
             override, or 3,000 characters, and a module whose file name holds ESC
  surrogate  a module whose file name holds a byte that is not UTF-8 (``caf\\xff_module.py``,
             imported as ``caf\\udcff_module``), called in every step: VizTracer alone dies of
             SIGSEGV at its first traced call
  directory  a module ``plain_module.py`` imported from a directory whose name holds such a byte
             (``caf\\xff/``), called in every step: the same crash
  imported   the module of ``surrogate``, imported for the first time in the middle of window 0 (its
             second active step), on the training thread, called, then unloaded at that step's end
  threaded   the same, imported and called by a thread started in that step
  co_name    a function whose code object's name is not UTF-8 (``code.replace(co_name=...)``),
             called in window 0's steps only: VizTracer's dump crashes on it
  thread_name  a thread named with a lone surrogate (``"bad\\udcffthread"``) runs in window 0:
             VizTracer keeps every thread's name for the tracer's life, and its dump crashes on it
             on Python <= 3.11 (3.12+ names a thread started while it records before ``threading``
             does)
  worker     a DataLoader worker imports the non-UTF-8 module (and calls it) in its first traced fetch
             of window 0; warnings go to stderr (a forked worker's cannot be recorded here)
  worker_loaded  a DataLoader worker imports it in its first fetch, before any window: its traced
             fetches of window 0 find it loaded
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import types
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest's MarkerModel

from conftest import MarkerModel, load_trace, loader, make_trainer, renamed, trace_files  # noqa: E402

from vt_lightning import VizTraceCallback  # noqa: E402

root, case = Path(sys.argv[1]), sys.argv[2]
modules = root / "mods"
modules.mkdir(parents=True, exist_ok=True)
sys.path.insert(0, str(modules))
NAMES = ["esc\x1bname", "bel\x07name", "cr\rname", "nl\nname", "bidi\u202ename", "long_" + "x" * 3000]


def named(name: str):
    """A fresh function called ``name``, defined in a file called ``name``.py."""

    def template(n: int) -> int:
        return sum(range(n))

    function = renamed(template, name)  # co_qualname too where the interpreter has one (3.11+)
    code = function.__code__.replace(co_filename=f"/virtual/{name}.py")
    return types.FunctionType(code, template.__globals__, name)


def module_from(file_name: bytes, import_name: str):
    with open(os.path.join(os.fsencode(modules), file_name), "wb") as f:
        f.write(b"def work(n):\n    return sum(range(n))\n")
    importlib.invalidate_caches()
    return importlib.import_module(import_name)


if case == "control":
    calls = [named(name) for name in NAMES] + [module_from(b"esc\x1bmodule.py", "esc\x1bmodule").work]
elif case == "surrogate":
    calls = [module_from(b"caf\xff_module.py", "caf\udcff_module").work]
elif case == "directory":
    directory = os.path.join(os.fsencode(modules), b"caf\xff")
    os.mkdir(directory)
    sys.path.insert(0, os.fsdecode(directory))
    calls = [module_from(b"caf\xff/plain_module.py", "plain_module").work]
else:
    calls = []
IMPORT_AT = 3  # window 0 (wait=1, warmup=1, active=2) records batches 2 and 3


def import_and_call() -> None:
    """First import of the non-UTF-8 module, during a window; unloaded again at once."""
    module_from(b"caf\xff_module.py", "caf\udcff_module").work(10)
    del sys.modules["caf\udcff_module"]


def _badly_named(n: int) -> int:
    return sum(range(n))


BAD_NAME = {"co_name": "bad\udcffname", **({"co_qualname": "bad\udcffname"} if sys.version_info >= (3, 11) else {})}
badly_named = types.FunctionType(_badly_named.__code__.replace(**BAD_NAME), globals(), "bad")


class NamedModel(MarkerModel):
    def training_step(self, batch, batch_idx):
        for call in calls:
            call(10)
        if case == "imported" and batch_idx == IMPORT_AT:
            import_and_call()
        elif case == "threaded" and batch_idx == IMPORT_AT:
            thread = threading.Thread(target=import_and_call)
            thread.start()
            thread.join()
        elif case == "co_name" and batch_idx == IMPORT_AT:
            badly_named(10)
        elif case == "thread_name" and batch_idx == IMPORT_AT:
            thread = threading.Thread(target=sum, args=(range(10),), name="bad\udcffthread")
            thread.start()
            thread.join()
        return super().training_step(batch, batch_idx)


class ImportingDataset(torch.utils.data.Dataset):
    """Sample ``IMPORT_AT * 4`` (the first of batch ``IMPORT_AT``, traced in its worker) imports it;
    ``worker_loaded``: sample 0 (batch 0, fetched before any window)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        if index == {"worker": IMPORT_AT * 4, "worker_loaded": 0}[case]:
            module_from(b"caf\xff_worker.py", "caf\udcff_worker").work(10)
        return (torch.full((8,), float(index)),)


model = NamedModel()
callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, budget_time_share=None)
if case.startswith("worker"):
    data = torch.utils.data.DataLoader(ImportingDataset(), batch_size=4, num_workers=1)
    make_trainer(root, [callback], max_steps=10, logger=False).fit(model, data)
    caught = []
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(root, [callback], max_steps=10, logger=False).fit(model, loader())
names = set()
for path in trace_files(root):
    names.update(str(e.get("name")) for e in load_trace(path)["traceEvents"] if e.get("ph") == "X")
report = {
    "train_batches": model.train_batches,
    "windows": len(trace_files(root)),
    "warnings": [str(w.message) for w in caught if "vt_lightning" in str(w.message)],
    "names_found": [name for name in NAMES if any(n.startswith(name) for n in names)],
    "module_found": any("esc\x1bmodule.py" in n for n in names),
    "window_dirs": sorted(p.parent.name[:10] for p in trace_files(root)),
    "meta_path": [type(finder).__name__ for finder in sys.meta_path],
    "profile_hook": None if sys.getprofile() is None else repr(sys.getprofile()),
}
print(json.dumps(report))
