"""DataLoader workers traced, only for the batches of a window, the training process's side:
``WorkerTracing`` publishes the plan (``worker_plan.py``) and wraps each train DataLoader's
``worker_init_fn`` (``worker_side.py``) until the end of fit; ``WorkerRecorder``, a side recorder,
pins the window's range in the plan while it is open and tells the writer where the parts are."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.workers import NO_LIMIT, Range, plan_ranges
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig
from vt_lightning.recording.worker_plan import WORKERS_DIR, SharedPlan, WorkerSetup, clock_reading
from vt_lightning.recording.worker_side import TracedWorkerInit

WAIT_FOR_WORKERS_S = 10.0  # the most the writer waits for a live worker's part (dead ones: not at all)


class WorkerTracing:
    """One fit run's worker tracing in the training process: the plan, the wrapped DataLoaders."""

    def __init__(
        self,
        spool_dir: str,
        rank: int,
        config: PythonTracerConfig,
        upcoming: Callable[[int], list[Range]],
        next_batch: Callable[[], int],
        calls: str = "user",
    ) -> None:
        self.out_dir = os.path.join(spool_dir, WORKERS_DIR)
        os.makedirs(self.out_dir, exist_ok=True)
        self.plan = SharedPlan(os.path.join(self.out_dir, "plan"), create=True)
        self.setup = WorkerSetup(self.plan.path, self.out_dir, rank, config, calls)
        self.upcoming = upcoming
        self.next_batch = next_batch
        self.fit_loop: Any = None
        self.epoch_base = 0
        self.limit = NO_LIMIT
        self.pinned: list[Range] = []
        self.wrapped: list[tuple[Any, Any]] = []  # (DataLoader, its worker_init_fn before)
        self.patched: list[tuple[Any, str]] = []  # (loop object, method name) patched on the instance

    def install(self, fit_loop: Any) -> None:
        """Wrap the DataLoaders each time Lightning (re)builds them, right before ``iter()``, and publish
        each epoch's start."""
        self.fit_loop = fit_loop
        self._patch(fit_loop, "_load_combined_loader_states", self._wrap_loaders)
        self._patch(fit_loop.epoch_loop, "on_run_start", self.new_epoch)
        self.new_epoch()

    def _patch(self, owner: Any, name: str, before: Callable[[], None]) -> None:
        """``owner.name`` runs ``before()`` first, on the instance only."""
        original = getattr(owner, name, None)
        if original is None or name in vars(owner):
            return

        def patched(*args: Any, **kwargs: Any) -> Any:
            try:
                before()
            except Exception:  # inside Lightning's loop: a fault costs the workers' events, never the fit
                pass
            return original(*args, **kwargs)

        setattr(owner, name, patched)
        self.patched.append((owner, name))

    def _wrap_loaders(self) -> None:
        """Wrap the ``worker_init_fn`` of every DataLoader with workers, and start the epoch."""
        combined = self.fit_loop._combined_loader
        for loader in combined.flattened if combined is not None else []:
            current = getattr(loader, "worker_init_fn", None)
            if getattr(loader, "num_workers", 0) > 0 and not isinstance(current, TracedWorkerInit):
                loader.worker_init_fn = TracedWorkerInit(current, self.setup)
                self.wrapped.append((loader, current))
        self.new_epoch()

    def new_epoch(self) -> None:
        """An iterator is about to be created: its task 0 is the next global batch."""
        self.epoch_base = self.next_batch()
        self.limit = _epoch_limit(self.fit_loop)
        self.publish()

    def publish(self, since: int | None = None) -> None:
        since = self.next_batch() if since is None else since
        self.plan.publish(self.epoch_base, self.limit, plan_ranges(self.upcoming(since), self.pinned))

    def recorder(self, python: PythonTracer, target: Window) -> WorkerRecorder:
        return WorkerRecorder(self, python, target)

    def remove(self) -> None:
        """Undo every wrap and patch (the end of fit); workers still alive see an empty plan."""
        for loader, original in self.wrapped:
            if isinstance(getattr(loader, "worker_init_fn", None), TracedWorkerInit):
                loader.worker_init_fn = original
        self.wrapped = []
        for owner, name in self.patched:
            vars(owner).pop(name, None)
        self.patched = []
        try:
            self.plan.publish(0, 0, [])
        except (ValueError, OSError):
            pass
        self.plan.close()


def _epoch_limit(fit_loop: Any) -> int:
    """Batches the epoch runs (``limit_train_batches`` applied): fetches past it belong to no window."""
    limits = getattr(getattr(fit_loop, "_combined_loader", None), "limits", None)
    finite = [int(n) for n in limits or () if isinstance(n, (int, float)) and n != float("inf")]
    return max(finite) if finite and len(finite) == len(limits or ()) else NO_LIMIT


class WorkerRecorder:
    """A window's side recorder: pins its range in the plan while open and reads the clocks at its edges."""

    name = "workers"

    def __init__(self, tracing: WorkerTracing, python: PythonTracer, target: Window) -> None:
        self.tracing = tracing
        self.python = python
        self.range: Range = (target.active_start, target.end)
        self.clock: list[tuple[float, int]] = []

    def start(self) -> None:
        if self.range not in self.tracing.pinned:
            self.tracing.pinned.append(self.range)
            self.tracing.publish(self.range[0])
        self.clock.append(clock_reading(self.python.clock_us))

    def stop(self) -> None:
        if self.range in self.tracing.pinned:
            self.tracing.pinned.remove(self.range)
            self.tracing.publish(max(self.range[1], self.tracing.next_batch()))  # the window's parts are due
            self.clock.append(clock_reading(self.python.clock_us))

    def collect(self) -> dict[str, Any] | None:
        if len(self.clock) < 2:
            return None
        return {
            "dir": self.tracing.out_dir,
            "first": self.range[0],
            "rank": self.tracing.setup.rank,
            "main_clock": [list(pair) for pair in self.clock],
            "wait_s": WAIT_FOR_WORKERS_S,
        }


_TORCH_SIGNALS = "torch.utils.data._utils.signal_handling"


@contextmanager
def worker_failures_deferred() -> Iterator[None]:
    """Hold off torch's SIGCHLD handler while our code runs in a batch hook or finishes its window: once a
    worker died, it raises at every SIGCHLD (our dump child's exit sends one) and cut a window's close
    short. Held off, the DataLoader reports the dead worker at its next fetch."""
    handler: Any = None
    try:
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGCHLD"):
            current = signal.getsignal(signal.SIGCHLD)
            if getattr(current, "__module__", None) == _TORCH_SIGNALS:
                handler = current
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except (ValueError, OSError):
        handler = None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGCHLD, handler)


def raised_by_signal_handler(err: BaseException) -> bool:
    """Whether ``err`` came out of a Python signal handler that ran while our code did: the run's
    exception, not a fault of ours (read from the frames ``err`` passed through)."""
    handlers = set()
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        for function in (getattr(handler, "__func__", handler), vars(type(handler)).get("__call__")):
            code = getattr(function, "__code__", None)
            if code is not None:
                handlers.add(code)
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False
