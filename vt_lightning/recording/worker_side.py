"""What runs in a DataLoader worker: trace the fetches that fall in a window (``worker_plan.py``'s
plan) and write them to the spool as a part, never right after a window batch: at the first fetch
past the window, when the window closes (a helper thread), or at exit. VizTracer's dump first, then
a ``.meta.json`` that marks the part complete (``export/worker_dumps.py``).

``worker_calls="user"`` skips every library call with its subtree (``PythonTracer.pause_files``).
A skipped frame drops everything under it, so the fetch is replayed in the frame that started the
tracer (``_replay_map``, ``_replay_iterable``), each library callable one span (``_Fetch.span``)."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from vt_lightning.analysis.usercode import PACKAGE_ROOT, library_roots
from vt_lightning.analysis.workers import Range, global_batch, range_of
from vt_lightning.constants import THREAD_PREFIX
from vt_lightning.recording.children import DumpChildFailed, wait_for_dump
from vt_lightning.recording.pytracer import PythonTracer
from vt_lightning.recording.unsafe_names import TracingGuard
from vt_lightning.recording.viztracer_dump import write_dump
from vt_lightning.recording.worker_plan import SharedPlan, WorkerSetup, clock_reading

WORKER_TRACER_ENTRIES = 250_000  # a few batches' fetches: each worker allocates its own buffer
WATCH_INTERVAL_S = 0.05
PAUSE_FOR_SPANS = sys.version_info < (3, 12)  # see ``_Fetch.span``


class TracedWorkerInit:
    """The train DataLoader's ``worker_init_fn``: the one it had, then worker tracing. Picklable (spawn)."""

    def __init__(self, inner: Callable[[int], Any] | None, setup: WorkerSetup) -> None:
        self.inner = inner
        self.setup = setup

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        try:
            _install_in_worker(self.setup, worker_id)
        except Exception:  # a fault boundary: never the user's DataLoader; this worker goes untraced
            pass


@dataclass
class _Part:
    window: Range
    stem: str
    clock: list[tuple[float, int]]
    fetches: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    spans: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)  # library calls (``_Fetch.span``)
    tid: int = 0  # the fetching thread's native id
    stop_watch: threading.Event = dataclasses.field(default_factory=threading.Event)
    watcher: threading.Thread | None = None


class _WorkerSide:
    """One worker's tracing: idle (one plan read per fetch) until a fetch falls in a window."""

    def __init__(self, setup: WorkerSetup, worker_id: int) -> None:
        self.setup = setup
        self.worker_id = worker_id
        self.plan = SharedPlan(setup.plan_path, create=False)
        self.lock = threading.Lock()
        self.part: _Part | None = None
        self.parts = 0
        self.tracer: PythonTracer | None = None
        self.broken = False
        self.task: int | None = None  # the task number of the fetch in progress (see ``_watch_tasks``)
        self.tasks_seen = False  # ``task`` is kept by the wrapped index queue (else: read the frame)
        # What ``worker_calls="user"`` skips ("<frozen abc>", "<string>": the standard library's).
        self.skipped = (*library_roots(), PACKAGE_ROOT + os.sep, "<")
        self.library: tuple[Any, _Names] | None = None  # (fetcher, its library callables)
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
        replayed = _replayed_fetcher(original) if self.setup.calls == "user" else None
        with self.lock:
            tracer = self._arm(window)
            if tracer is None:
                return original(index)
            if replayed is None:  # torch's own fetch, traced (untraced where the tracer cannot start)
                with _Fetch(self, tracer, batch):
                    return original(index)
            if hasattr(replayed, "dataset_iter"):
                return self._replay_iterable(tracer, replayed, index, batch)
            return self._replay_map(tracer, replayed, index, batch)

    def _start(self, tracer: PythonTracer) -> float | None:
        """Start tracing; the tracer's clock at the start, or None (this worker stops tracing)."""
        try:
            if not self.names.start(tracer):  # starts it; not where a name VizTracer cannot take is loaded
                self.broken = True  # the replay's fallback fetch must not come back here
                return None
            return tracer.clock_us()
        except Exception:  # a fault boundary before the user's fetch (another profiler here, say): untraced
            self.names.stop()
            self.broken = True
            return None

    # The two replays: ``_MapDatasetFetcher.fetch`` and ``_IterableDatasetFetcher.fetch`` step for
    # step. The user's callables are called right here, never through a helper, whose frame in this
    # (skipped) file would drop the user's call with it: ``f(x) if name is None else fetch.span(...)``.

    def _replay_map(self, tracer: PythonTracer, fetcher: Any, index: Any, batch: int) -> Any:
        names = self._names_of(fetcher)
        dataset, collate = fetcher.dataset, fetcher.collate_fn
        with _Fetch(self, tracer, batch) as fetch:
            if fetch.started is None:
                return fetcher.fetch(index)
            if not fetcher.auto_collation:
                data = dataset[index] if names.item is None else fetch.span(names.item, dataset.__getitem__, index)
            elif hasattr(dataset, "__getitems__") and dataset.__getitems__:
                if names.items is None:
                    data = dataset.__getitems__(index)
                else:
                    data = fetch.span(names.items, dataset.__getitems__, index)
            else:
                data = [None] * len(index)
                for k, i in enumerate(index):
                    data[k] = dataset[i] if names.item is None else fetch.span(names.item, dataset.__getitem__, i)
            return collate(data) if names.collate is None else fetch.span(names.collate, collate, data)

    def _replay_iterable(self, tracer: PythonTracer, fetcher: Any, index: Any, batch: int) -> Any:
        if fetcher.ended:
            raise StopIteration
        names = self._names_of(fetcher)
        iterator, collate = fetcher.dataset_iter, fetcher.collate_fn
        with _Fetch(self, tracer, batch) as fetch:
            if fetch.started is None:
                return fetcher.fetch(index)
            if fetcher.auto_collation:
                data = []
                for _ in index:
                    try:
                        data.append(next(iterator) if names.item is None else fetch.span(names.item, next, iterator))
                    except StopIteration:
                        fetcher.ended = True
                        break
                if len(data) == 0 or (fetcher.drop_last and len(data) < len(index)):
                    raise StopIteration
            else:
                data = next(iterator) if names.item is None else fetch.span(names.item, next, iterator)
            return collate(data) if names.collate is None else fetch.span(names.collate, collate, data)

    def _names_of(self, fetcher: Any) -> _Names:
        """The library callables of ``fetcher`` (worked out once per fetcher: one per epoch)."""
        if self.library is None or self.library[0] is not fetcher:
            self.library = (fetcher, _Names.of(fetcher, self.skipped))
        return self.library[1]

    def _fetched(self, tracer: PythonTracer, batch: int, started: float) -> None:
        """Stop tracing and note the fetch; the part is written later, not in this batch."""
        try:
            ended = tracer.clock_us()
            self.broken = self.names.stop(tracer) or self.broken  # such a name met: no more tracing here
            if self.part is not None:
                self.part.fetches.append((batch, started, ended))
        except Exception:  # a fault boundary after the user's fetch: its result is returned all the same
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
                    self.tracer.pause_files(self.skipped)
            if self.part is None:
                self._begin(window, self.tracer)
            return self.tracer
        except Exception:  # a fault boundary before the user's fetch: it runs untraced
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
        part = self.part = _Part(window, stem, [clock_reading(tracer.clock_us)], tid=threading.get_native_id())
        part.watcher = threading.Thread(
            target=self._watch, args=(part,), name=f"{THREAD_PREFIX}-worker-watch", daemon=True
        )
        part.watcher.start()

    def _watch(self, part: _Part) -> None:
        """Write the part once the training process has closed its window."""
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
            part.clock.append(clock_reading(tracer.clock_us))
            viz = tracer.ensure_tracer()
            viz.setpid()  # this process's pid, whatever a forked parent fixed
            try:
                self._write_events(viz, tracer.config.tracer_entries, f"{part.stem}.json.tmp")
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
                "spans": [list(span) for span in part.spans],
                "tid": part.tid,
            }
            with open(f"{part.stem}.meta.json.tmp", "wb") as f:
                f.write(orjson.dumps(meta))
            os.replace(f"{part.stem}.meta.json.tmp", f"{part.stem}.meta.json")
        except Exception:  # a fault boundary, the part's writer: a full disk, say; the fetches go on untraced
            self.broken = True

    def _write_events(self, viz: Any, entries: int, path: str) -> None:
        """VizTracer's dump of the part, here; one that failed leaves an empty, complete part, and this worker
        stops tracing, with one warning."""
        try:
            wait_for_dump(write_dump(viz, entries, path, fork=False))
        except DumpChildFailed as err:
            with open(path, "wb") as f:  # not by VizTracer: its dump writes the threads' names even of none
                f.write(b'{"traceEvents": []}')
            self.broken = True
            warnings.warn(
                f"vt_lightning: DataLoader worker pid {os.getpid()}: {err}; this worker's tracing stops.",
                RuntimeWarning,
                stacklevel=2,
            )

    def at_exit(self) -> None:
        """The worker is leaving (end of epoch, end of fit): write what it holds."""
        if self.lock.acquire(timeout=5.0):
            try:
                self._dump()
            finally:
                self.lock.release()


def _install_in_worker(setup: WorkerSetup, worker_id: int) -> None:
    """Wrap the fetcher torch's worker loop builds next (each epoch); write the open part at exit."""
    from multiprocessing import util

    from torch.utils.data import _DatasetKind

    side = _WorkerSide(setup, worker_id)
    side.tasks_seen = _watch_tasks(side)
    create = _DatasetKind.create_fetcher

    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        fetcher = create(*args, **kwargs)
        fetcher.fetch = _TracedFetch(side, fetcher.fetch)
        return fetcher

    _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[method-assign]
    util.Finalize(None, side.at_exit, exitpriority=100)


def _watch_tasks(side: _WorkerSide) -> bool:
    """Note each task's number as the worker loop takes it from its index queue (cheaper than its frame)."""
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


def _replayed_fetcher(fetch: Callable[[Any], Any]) -> Any:
    """The fetcher behind ``fetch`` when it is one of torch's two (which the worker replays)."""
    from torch.utils.data._utils.fetch import _IterableDatasetFetcher, _MapDatasetFetcher

    fetcher = getattr(fetch, "__self__", None)
    return fetcher if type(fetcher) in (_MapDatasetFetcher, _IterableDatasetFetcher) else None


def library_name(function: Any, skipped: tuple[str, ...]) -> str | None:
    """VizTracer's name for ``function`` when its code is in a file the tracer skips; None for the user's
    code (traced in full) and for C functions (the tracer records those itself)."""
    code = getattr(function, "__code__", None) or getattr(function, "gi_code", None)
    if code is None and callable(function):  # an instance of a class with ``__call__``
        code = getattr(type(function).__call__, "__code__", None)
    if code is None or not code.co_filename.startswith(skipped):
        return None
    qualname = getattr(function, "__qualname__", None) or getattr(code, "co_qualname", code.co_name)
    return f"{qualname} ({code.co_filename}:{code.co_firstlineno})"


class _Fetch:
    """One traced fetch: the tracer started on entry (``started``: its clock, None when it cannot trace)."""

    __slots__ = ("batch", "side", "spans", "started", "tracer", "viz")

    def __init__(self, side: _WorkerSide, tracer: PythonTracer, batch: int) -> None:
        self.side, self.tracer, self.batch = side, tracer, batch
        self.started: float | None = None
        self.viz: Any = None
        self.spans: list[tuple[str, float, float]] = []

    def __enter__(self) -> _Fetch:
        self.started = self.side._start(self.tracer)
        if self.started is not None:
            self.viz = self.tracer.ensure_tracer()
            if self.side.part is not None:
                self.spans = self.side.part.spans
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started is not None:
            self.side._fetched(self.tracer, self.batch, self.started)

    def span(self, name: str, function: Callable[[Any], Any], arg: Any) -> Any:
        """``function(arg)``, a library call the tracer skips, noted as (name, start, end) on its clock. On
        Python <= 3.11 VizTracer is paused for it; on 3.12+ its ``pause`` is process-wide, so it is not."""
        viz = self.viz
        start = viz.getts()
        if PAUSE_FOR_SPANS:
            viz.pause()
            try:
                result = function(arg)
            finally:
                viz.resume()
        else:
            result = function(arg)
        self.spans.append((name, start, viz.getts()))
        return result


@dataclass(frozen=True)
class _Names:
    """Span names of a fetcher's library callables; None where the callable is the user's."""

    item: str | None  # ``__getitem__`` (map-style) or the iterator's ``__next__`` (iterable)
    items: str | None  # ``__getitems__``
    collate: str | None

    @staticmethod
    def of(fetcher: Any, skipped: tuple[str, ...]) -> _Names:
        dataset = fetcher.dataset
        iterator = getattr(fetcher, "dataset_iter", None)
        if iterator is None:
            item = library_name(getattr(type(dataset), "__getitem__", None), skipped)
        elif hasattr(iterator, "gi_code"):  # a generator: its code runs at each next()
            item = library_name(iterator, skipped)
        else:
            item = library_name(getattr(type(iterator), "__next__", None), skipped)
        items = library_name(getattr(type(dataset), "__getitems__", None), skipped)
        return _Names(item, items, library_name(fetcher.collate_fn, skipped))


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
            except ValueError:  # called with no Python caller
                idx = None
        return side.fetch(self.original, index, idx)
