"""DataLoader workers traced, only for the batches of a window.

Workers fetch ahead (``num_workers × prefetch_factor`` batches, plus the one Lightning holds), so
arming them when a window opens would miss its first batches, and arming them that many batches
early would trace batches outside it. Instead each worker decides per fetch, from a plan the
training process publishes in a small memory-mapped file in the spool (``SharedPlan``): the
epoch's first global batch, the epoch's length and the active ranges of the next windows. The
DataLoader's task number of a fetch (``idx`` in torch's ``_worker_loop``, 0-based each epoch) plus
the epoch's first batch is the global batch index the controller counts; a fetch inside a range
is traced (VizTracer started and stopped around it), every other fetch costs one read of the plan.

The training process wraps each train DataLoader's ``worker_init_fn`` (the user's, or Lightning's
``pl_worker_init_function`` under ``seed_everything(workers=True)``, runs first, unchanged) right
before Lightning creates its iterator, and undoes it at the end of fit. A worker writes its events
(a "part") to the spool at its first fetch past the window, when the window closes (a helper
thread that lives only while a part is open), or at exit; never right after a window batch, which
the window is measuring. VizTracer's dump first, then a small ``.meta.json`` that marks the part
complete. The writer merges the complete parts; a worker that died or hung loses only its own part
(``export/worker_dumps.py``).

What a traced fetch records (``worker_calls``): by default the user's code only. An augmenting
dataset makes tens of thousands of library calls per batch (PIL, torchvision, NumPy's Python
layer), which traced in full cost 8-20x the fetch itself (issue 39). So every Python call into the
standard library, installed packages, torch and vt_lightning is skipped with everything it calls
(VizTracer's ``exclude_files``, set through ``PythonTracer.pause_files``), and the C calls the
user's code makes are kept. A skipped frame drops its whole subtree, so the dataset must not be
reached through torch's fetcher: for a map-style dataset the fetch is replayed in the frame that
started the tracer (``_WorkerSide.fetch``: ``dataset[i]`` per index, or ``__getitems__``, then the
collate function), exactly as ``_MapDatasetFetcher.fetch`` does it. Other fetchers (an
``IterableDataset``) show their ``fetch batch N`` span only. ``worker_calls="all"``: every call.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.usercode import PACKAGE_ROOT, library_roots
from vt_lightning.analysis.workers import (
    NO_LIMIT,
    PLAN_SLOTS,
    Range,
    global_batch,
    plan_ranges,
    range_of,
)
from vt_lightning.constants import THREAD_PREFIX
from vt_lightning.recording.clock_probes import sample_pair
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig
from vt_lightning.recording.unsafe_names import TracingGuard, dump_in_process

WORKER_TRACER_ENTRIES = 250_000  # per worker: a few batches' fetches; each worker allocates its own
WAIT_FOR_WORKERS_S = 10.0  # the most the writer waits for a live worker's part (dead ones: not at all)
WATCH_INTERVAL_S = 0.05
CLOCK_ROUNDS = 16
WORKERS_DIR = "workers"

# The plan, int64s: seq (odd while being written), epoch_base, epoch_limit, count, PLAN_SLOTS ranges.
_PLAN_BYTES = 8 * (4 + 2 * PLAN_SLOTS)


class SharedPlan:
    """A seqlock over a memory-mapped file: one writer (the training thread), many readers. A
    reader whose plan has not changed since its last read pays one aligned 8-byte load."""

    def __init__(self, path: str, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, _PLAN_BYTES)
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, _PLAN_BYTES, access=access)
        finally:
            os.close(fd)
        self._view: memoryview | None = memoryview(self._map).cast("q")
        self._seq = -1
        self._last: tuple[int, int, list[Range]] = (0, 0, [])

    def publish(self, epoch_base: int, epoch_limit: int, ranges: list[Range]) -> None:
        view = self._view
        if view is None:
            return
        seq = view[0] + 1 | 1
        view[0] = seq  # odd: readers retry
        view[1], view[2], view[3] = epoch_base, min(epoch_limit, NO_LIMIT), min(len(ranges), PLAN_SLOTS)
        for i, (first, end) in enumerate(ranges[:PLAN_SLOTS]):
            view[4 + 2 * i], view[5 + 2 * i] = first, end
        view[0] = seq + 1

    def read(self) -> tuple[int, int, list[Range]]:
        """(epoch_base, epoch_limit, ranges); no ranges when the plan could not be read."""
        view = self._view
        if view is None:
            return 0, 0, []
        if view[0] == self._seq:  # the fast path: nothing published since the last read
            return self._last
        for _ in range(1000):
            seq = view[0]
            if seq & 1:
                continue
            count = min(view[3], PLAN_SLOTS)
            plan = (view[1], view[2], [(view[4 + 2 * i], view[5 + 2 * i]) for i in range(count)])
            if view[0] == seq:
                self._seq, self._last = seq, plan
                return plan
        return 0, 0, []

    def close(self) -> None:
        view, self._view = self._view, None
        try:
            if view is not None:
                view.release()
            self._map.close()
        except (BufferError, ValueError):
            pass


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs, sent with its ``worker_init_fn`` (pickled under spawn)."""

    plan_path: str
    out_dir: str
    rank: int
    config: PythonTracerConfig
    calls: str = "user"  # ``worker_calls``: "user" or "all"


class TracedWorkerInit:
    """The train DataLoader's ``worker_init_fn``: the one it had first (the user's, or Lightning's
    seeding), then worker tracing. Picklable, so spawn and forkserver workers get it too."""

    def __init__(self, inner: Callable[[int], Any] | None, setup: WorkerSetup) -> None:
        self.inner = inner
        self.setup = setup

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        try:
            _install_in_worker(self.setup, worker_id)
        except Exception:  # never the user's DataLoader: this worker goes untraced
            pass


# --------------------------------------------------------------------------------------------------
# In the worker
# --------------------------------------------------------------------------------------------------


@dataclass
class _Part:
    window: Range
    stem: str
    clock: list[tuple[float, int]]
    fetches: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    stop_watch: threading.Event = dataclasses.field(default_factory=threading.Event)
    watcher: threading.Thread | None = None


class _WorkerSide:
    """One worker's tracing: idle (one plan read per fetch) until a fetch falls in a window."""

    def __init__(self, setup: WorkerSetup, worker_id: int, num_workers: int) -> None:
        self.setup = setup
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.plan = SharedPlan(setup.plan_path, create=False)
        self.lock = threading.Lock()
        self.part: _Part | None = None
        self.parts = 0
        self.tracer: PythonTracer | None = None
        self.broken = False
        self.task: int | None = None  # the task number of the fetch in progress (see ``_watch_tasks``)
        self.tasks_seen = False  # ``task`` is kept by the wrapped index queue (else: read the frame)
        self.names = TracingGuard()  # file names VizTracer cannot take, met while a fetch is traced

    def fetch(self, original: Callable[[Any], Any], index: Any, idx: Any) -> Any:
        if self.broken:
            return original(index)
        epoch_base, epoch_limit, ranges = self.plan.read()
        if not ranges and self.part is None:
            return original(index)
        batch = global_batch(epoch_base, epoch_limit, idx)
        window = range_of(ranges, batch)
        if window is None or batch is None:
            if self.part is not None:
                self.finish()
            return original(index)
        fetcher = _map_fetcher(original) if self.setup.calls == "user" else None
        with self.lock:
            tracer = self._arm(window)
            try:
                if tracer is None or not self.names.start(tracer):  # starts it
                    return original(index)
                started = tracer.clock_us()
            except Exception:  # another profiler in this worker, say: its fetches go on untraced
                self.names.stop()
                self.broken = True
                return original(index)
            try:
                if fetcher is None:
                    return original(index)
                # _MapDatasetFetcher.fetch, replayed here: the user's code is called from the frame
                # that started the tracer, not from torch's, whose skipped frame would hide it.
                dataset = fetcher.dataset
                if not fetcher.auto_collation:
                    return fetcher.collate_fn(dataset[index])
                if hasattr(dataset, "__getitems__") and dataset.__getitems__:
                    return fetcher.collate_fn(dataset.__getitems__(index))
                data = [None] * len(index)
                for k, i in enumerate(index):
                    data[k] = dataset[i]
                return fetcher.collate_fn(data)
            finally:
                self._fetched(tracer, batch, started)

    def _fetched(self, tracer: PythonTracer, batch: int, started: float) -> None:
        """Stop tracing and note the fetch. The part is written later (the next fetch outside the
        window, the window's close, the worker's exit): writing it now would delay this batch,
        which the window is measuring."""
        try:
            ended = tracer.clock_us()
            self.broken = self.names.stop(tracer) or self.broken  # such a name met: no more tracing here
            if self.part is not None:
                self.part.fetches.append((batch, started, ended))
        except Exception:
            self.broken = True

    def _arm(self, window: Range) -> PythonTracer | None:
        """The tracer, with a part open for ``window`` (an older window's part written first)."""
        try:
            if self.part is not None and self.part.window != window:
                self._dump()
            if self.tracer is None:
                config = dataclasses.replace(
                    self.setup.config, tracer_entries=min(self.setup.config.tracer_entries, WORKER_TRACER_ENTRIES)
                )
                self.tracer = PythonTracer(config)
                if self.setup.calls == "user":
                    # "<frozen abc>", "<string>"...: the standard library's, as usercode.py reads them.
                    self.tracer.pause_files((*library_roots(), PACKAGE_ROOT + os.sep, "<"))
            if self.part is None:
                self._begin(window, self.tracer)
            return self.tracer
        except Exception:
            self.broken = True
            return None

    def _begin(self, window: Range, tracer: PythonTracer) -> None:
        self.parts += 1
        stem = os.path.join(
            self.setup.out_dir,
            f"b{window[0]}-r{self.setup.rank}-w{self.worker_id}-p{os.getpid()}-{self.parts}",
        )
        with open(f"{stem}.started", "w") as f:
            f.write(str(os.getpid()))
        pair = sample_pair(tracer.clock_us, time.monotonic_ns, rounds=CLOCK_ROUNDS)
        part = self.part = _Part(window, stem, [(pair.python_us, pair.wall_ns)])
        part.watcher = threading.Thread(
            target=self._watch, args=(part,), name=f"{THREAD_PREFIX}-worker-watch", daemon=True
        )
        part.watcher.start()

    def _watch(self, part: _Part) -> None:
        """Write the part once the training process has closed its window (no fetch may come)."""
        while not part.stop_watch.wait(WATCH_INTERVAL_S):
            _, _, ranges = self.plan.read()
            if part.window not in ranges:
                with self.lock:
                    if self.part is part:
                        self._dump()
                return

    def finish(self) -> None:
        with self.lock:
            self._dump()

    def _dump(self) -> None:
        """Write the open part: VizTracer's dump, then the meta file that marks it complete."""
        part, self.part = self.part, None
        tracer = self.tracer
        if part is None or tracer is None:
            return
        part.stop_watch.set()
        try:
            pair = sample_pair(tracer.clock_us, time.monotonic_ns, rounds=CLOCK_ROUNDS)
            part.clock.append((pair.python_us, pair.wall_ns))
            viz = tracer.ensure_tracer()
            viz.setpid()  # this process's pid, whatever a forked parent fixed
            try:
                dump_in_process(viz, tracer.config.tracer_entries, f"{part.stem}.json.tmp", in_worker=True)
            finally:
                viz.setpid(0)
                viz.clear()
            os.replace(f"{part.stem}.json.tmp", f"{part.stem}.json")
            watcher = part.watcher.native_id if part.watcher is not None else None
            meta = {
                "pid": os.getpid(),
                "worker": self.worker_id,
                "rank": self.setup.rank,
                "window": list(part.window),
                "fetches": [list(f) for f in part.fetches],
                "clock": [list(c) for c in part.clock],
                "helper_tids": [watcher] if watcher is not None else [],
            }
            with open(f"{part.stem}.meta.json.tmp", "wb") as f:
                f.write(orjson.dumps(meta))
            os.replace(f"{part.stem}.meta.json.tmp", f"{part.stem}.meta.json")
        except Exception:
            self.broken = True  # a full disk, say: this worker stops tracing, its fetches go on

    def at_exit(self) -> None:
        """The worker is leaving (end of epoch, end of fit): write what it holds."""
        if self.lock.acquire(timeout=5.0):
            try:
                self._dump()
            finally:
                self.lock.release()


_worker_side: _WorkerSide | None = None


def _install_in_worker(setup: WorkerSetup, worker_id: int) -> None:
    """Wrap the fetcher torch's worker loop builds next (and rebuilds at each epoch of a
    persistent worker); write the open part at the worker's exit."""
    global _worker_side
    from multiprocessing import util

    from torch.utils.data import _DatasetKind, get_worker_info

    info = get_worker_info()
    side = _worker_side = _WorkerSide(setup, worker_id, info.num_workers if info is not None else 1)
    side.tasks_seen = _watch_tasks(side)
    create = _DatasetKind.create_fetcher

    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        fetcher = create(*args, **kwargs)
        fetcher.fetch = _TracedFetch(side, fetcher.fetch)
        return fetcher

    _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[method-assign]
    util.Finalize(None, side.at_exit, exitpriority=100)


def _watch_tasks(side: _WorkerSide) -> bool:
    """Note each task's number as torch's worker loop takes it from its index queue: ``(idx,
    index)``. Cheaper per fetch than reading the loop's frame (its locals, ~2 µs on 3.11)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_worker_loop":
        frame = frame.f_back  # type: ignore[assignment]
    queue = frame.f_locals.get("index_queue") if frame is not None else None
    get = getattr(queue, "get", None)
    if get is None:
        return False

    def taking(*args: Any, **kwargs: Any) -> Any:
        task = get(*args, **kwargs)
        side.task = task[0] if type(task) is tuple else None
        return task

    queue.get = taking  # type: ignore[union-attr]
    return True


def _map_fetcher(fetch: Callable[[Any], Any]) -> Any:
    """The fetcher behind ``fetch`` when it is torch's map-style one (which the worker replays),
    else None."""
    fetcher = getattr(fetch, "__self__", None)
    try:
        from torch.utils.data._utils.fetch import _MapDatasetFetcher
    except ImportError:
        return None
    return fetcher if type(fetcher) is _MapDatasetFetcher else None


class _TracedFetch:
    """``fetcher.fetch`` in a worker: reads the task number ``idx`` from torch's worker loop."""

    __slots__ = ("original", "side")

    def __init__(self, side: _WorkerSide, original: Callable[[Any], Any]) -> None:
        self.side = side
        self.original = original

    def __call__(self, index: Any) -> Any:
        side = self.side
        if side.tasks_seen:
            idx = side.task
        else:
            try:
                idx = sys._getframe(1).f_locals.get("idx")
            except Exception:
                idx = None
        return side.fetch(self.original, index, idx)


# --------------------------------------------------------------------------------------------------
# In the training process
# --------------------------------------------------------------------------------------------------


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
        """Wrap the DataLoaders each time Lightning (re)builds them, before their iterator exists:
        ``_load_combined_loader_states`` runs in ``FitLoop.setup_data`` after Lightning's own
        processing (samplers, seeding) and right before ``iter()``; ``on_run_start`` of the epoch
        loop runs before each later epoch's ``iter()``."""
        self.fit_loop = fit_loop
        self._patch(fit_loop, "_load_combined_loader_states", lambda original: self._before_iter(fit_loop, original))
        self._patch(fit_loop.epoch_loop, "on_run_start", self._before_epoch)
        self.new_epoch()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name, None)
        if original is None or name in vars(owner):
            return
        setattr(owner, name, make(original))
        self.patched.append((owner, name))

    def _before_iter(self, fit_loop: Any, original: Callable[[], Any]) -> Callable[[], Any]:
        def wrapped() -> Any:
            try:
                loader = fit_loop._combined_loader
                self.wrap(loader.flattened if loader is not None else [])
                self.new_epoch()
            except Exception:
                pass
            return original()

        return wrapped

    def _before_epoch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                self.new_epoch()
            except Exception:
                pass
            return original(*args, **kwargs)

        return wrapped

    def wrap(self, loaders: list[Any]) -> int:
        """Wrap the ``worker_init_fn`` of every DataLoader with workers; returns how many."""
        count = 0
        for loader in loaders:
            current = getattr(loader, "worker_init_fn", None)
            if getattr(loader, "num_workers", 0) <= 0 or isinstance(current, TracedWorkerInit):
                continue
            loader.worker_init_fn = TracedWorkerInit(current, self.setup)
            self.wrapped.append((loader, current))
            count += 1
        return count

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
    """Batches the epoch runs (``limit_train_batches`` applied): Lightning sets the combined
    loader's limits before creating its iterator. Fetches past it belong to no window."""
    limits = getattr(getattr(fit_loop, "_combined_loader", None), "limits", None)
    finite = [int(n) for n in limits or () if isinstance(n, (int, float)) and n != float("inf")]
    return max(finite) if finite and len(finite) == len(limits or ()) else NO_LIMIT


class WorkerRecorder:
    """The side recorder of one window (``recording/side.py``): pins the window's range in the plan
    while it is open (a triggered window is not in the schedule) and reads the main process's
    clocks at its edges; ``collect`` tells the writer where the workers' parts are."""

    name = "workers"

    def __init__(self, tracing: WorkerTracing, python: PythonTracer, target: Window) -> None:
        self.tracing = tracing
        self.python = python
        self.range: Range = (target.active_start, target.end)
        self.clock: list[tuple[float, int]] = []

    def _read_clock(self) -> None:
        pair = sample_pair(self.python.clock_us, time.monotonic_ns, rounds=CLOCK_ROUNDS)
        self.clock.append((pair.python_us, pair.wall_ns))

    def start(self) -> None:
        if self.range not in self.tracing.pinned:
            self.tracing.pinned.append(self.range)
            self.tracing.publish(self.range[0])
        self._read_clock()

    def stop(self) -> None:
        if self.range in self.tracing.pinned:
            self.tracing.pinned.remove(self.range)
            self.tracing.publish(max(self.range[1], self.tracing.next_batch()))  # the window's parts are due
            self._read_clock()

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
    """Hold off torch's SIGCHLD handler while vt_lightning's own code runs in a batch hook (past
    the quiet-batch gate) or finishes its window after an exception.

    Once a DataLoader worker has died, torch's handler raises the worker's error at *every*
    SIGCHLD (the dead worker stays unreaped), wherever the training thread is. Inside our
    ``on_exception`` (our own dump child's exit sends one) it cut the window's close short and
    left the tracers running: the process died of SIGSEGV at exit instead of exiting 1. Inside a
    batch hook it was taken for a profiling fault: the window was dropped and the error swallowed.
    Held off, the DataLoader still reports the dead worker itself, at its next fetch (torch checks
    its workers whenever it waits for a batch), and the window is written."""
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
