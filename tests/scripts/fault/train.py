"""One small training run with VizTraceCallback and one fault scenario. Run by tests/system/test_faults.py
in a subprocess (the faults may crash or hang a process); prints one JSON report as its last line.

    python train.py '<json config>'

Config keys: ``callback`` (VizTraceCallback kwargs), ``max_steps``, ``root``, and optionally
``torch_profiler`` [start_step, end_step, "before"|"after" our callback, trace path],
``cprofile`` [start_step, end_step], ``setprofile`` [start_step, end_step],
``stop_writer_at`` [step, ...] (SIGSTOP the writer process at those batch starts),
``kill_self_at`` step (SIGKILL this process at that batch start), ``rlimit_as_gb``,
``fault_in`` ["module:Class.method", n] (the n-th call, from 0, raises RuntimeError: a fault of ours).
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest's MarkerModel

config = json.loads(sys.argv[1])
if config.get("rlimit_as_gb"):
    import resource

    limit = int(config["rlimit_as_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

import torch  # noqa: E402
from conftest import MarkerModel, loader, make_trainer, raising_at  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from vt_lightning import VizTraceCallback  # noqa: E402
from vt_lightning.controller import handoff  # noqa: E402
from vt_lightning.recording.rivals import guard_installed  # noqa: E402

if config.get("stop_writer_at"):  # the frozen writer process must be the one that has the windows
    handoff.FINISH_AT_END_WITHIN_S = 0.0
if config.get("fault_in"):
    import importlib

    target, fault_call = config["fault_in"]
    module_name, _, qualname = target.partition(":")
    owner_name, _, method = qualname.rpartition(".")
    owner = importlib.import_module(module_name)
    for part in owner_name.split(".") if owner_name else ():
        owner = getattr(owner, part)
    faulty, _ = raising_at(getattr(owner, method), fault_call, lambda: RuntimeError(f"injected into {qualname}"))
    setattr(owner, method, faulty)


def step_of(trainer) -> int:
    return trainer.fit_loop.total_batch_idx


class UserTools(Callback):
    """What a user might do around or inside a step: their own profilers, a stuck writer."""

    def __init__(self, cb: VizTraceCallback) -> None:
        self.cb = cb
        self.torch_prof = None
        self.cprof = None
        self.hook_calls = 0
        self.report: dict = {"user_torch_trace": None, "cprofile_saw": [], "hook_calls": 0, "stopped_writers": []}

    def _hook(self, frame, event, arg):
        self.hook_calls += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = step_of(trainer)
        if self.cb._controller.spool is not None:
            self.report["spool"] = str(self.cb._controller.spool)
            self.report["spool_base"] = self.cb._controller.spool.base
        tp = config.get("torch_profiler")
        if tp and step == tp[0]:
            self.torch_prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.torch_prof.__enter__()
        cp = config.get("cprofile")
        if cp and step == cp[0]:
            self.cprof = cProfile.Profile()
            self.cprof.enable()
        sp = config.get("setprofile")
        if sp and step == sp[0]:
            sys.setprofile(self._hook)
        if step in config.get("stop_writer_at", []):
            writer = self.cb._controller.writer
            if writer is not None:
                # Wait for earlier windows outside the writer's allowance: drain() would count this
                # wait against writer_timeout and, past it, abandon the writer (no process left to
                # freeze) whenever window 0's write includes the writer's start-up under load.
                deadline = time.monotonic() + 60
                while writer.in_flight() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if writer.process is None:
                    writer.writer_process()
                if writer.process is not None:
                    os.kill(writer.process.pid, signal.SIGSTOP)
                    self.report["stopped_writers"].append(writer.process.pid)
        if config.get("kill_self_at") == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = step_of(trainer)
        tp = config.get("torch_profiler")
        if tp and step == tp[1] and self.torch_prof is not None:
            self.torch_prof.__exit__(None, None, None)
            self.torch_prof.export_chrome_trace(tp[3])
            self.report["user_torch_trace"] = tp[3]
            self.torch_prof = None
        cp = config.get("cprofile")
        if cp and step == cp[1] and self.cprof is not None:
            self.cprof.disable()
            import pstats

            stats = pstats.Stats(self.cprof).stats
            self.report["cprofile_saw"] = sorted({name for (_, _, name) in stats if re.fullmatch(r"batch_\d+", name)})
            self.cprof = None
        sp = config.get("setprofile")
        if sp and step == sp[1]:
            self.report["hook_still_set"] = sys.getprofile() == self._hook
            sys.setprofile(None)
            self.report["hook_calls"] = self.hook_calls


cb = VizTraceCallback(**config.get("callback", {}))
user = UserTools(cb)
order = [user, cb] if (config.get("torch_profiler") or [0, 0, "before"])[2] == "before" else [cb, user]
model = MarkerModel()
caught_warnings: list[str] = []
start = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    make_trainer(config["root"], order, max_steps=config.get("max_steps", 10)).fit(model, loader(n=256))
# The once-per-run notice about Python 3.12.0-3.12.4 (cpython #122029) is about the interpreter, not the fault.
caught_warnings = [
    str(w.message) for w in caught if "vt_lightning" in str(w.message) and "cpython #122029" not in str(w.message)
]
for pid in user.report["stopped_writers"]:
    try:
        os.kill(pid, signal.SIGCONT)  # if it were still alive, let it go (it should be gone)
    except ProcessLookupError:
        pass

import resource  # noqa: E402

report = {
    "train_batches": model.train_batches,
    "fit_seconds": time.monotonic() - start,
    "warnings": caught_warnings,
    "windows_written": [str(r.trace_path) for r in cb.results],
    "metadata": [],
    "torch_profiler_enabled": bool(torch.autograd.profiler._is_profiler_enabled),
    "sys_getprofile": repr(sys.getprofile()) if sys.getprofile() is not None else None,
    "threading_getprofile": repr(threading.getprofile()) if threading.getprofile() is not None else None,
    "monitoring_tools": [sys.monitoring.get_tool(i) for i in range(2, 6)] if sys.version_info >= (3, 12) else [],
    "guard_installed": guard_installed(),
    "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "threads": [t.name for t in threading.enumerate()],
    **user.report,
}
import gzip  # noqa: E402

import orjson  # noqa: E402

for path in report["windows_written"]:
    with gzip.open(path, "rb") as f:
        meta = orjson.loads(f.read())["vt_lightning"]
    report["metadata"].append({k: meta.get(k) for k in ("steps", "scheduled_steps", "warmup_steps", "partial", "pid")})
print(json.dumps(report))
