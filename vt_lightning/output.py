"""Where windows go and how their files get there: names, atomic writes, the background writer.

The TensorBoard plugin loads a run directory once, so every window gets a run directory of its own
and a file appears there only complete (written under a name the plugin ignores, then renamed).
Parsing, merging, encoding and compression run in a writer process fed by one background thread,
never on the training thread (nor in its process, where they would compete for the GIL). At most ``max_in_flight`` windows are pending there, so memory stays bounded: when windows
come faster than the disk takes them, the next window waits for room at its start (and says so)
rather than growing the queue or dropping a window.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


TRACE_SUFFIX = ".pt.trace.json.gz"
MEMORY_SUFFIX = ".memory_snapshot.pickle"
TRACE_PATTERN = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")  # the plugin's own
SPAN_WIDTH = 10  # spans compare as strings in the plugin: fixed width keeps their order


def host_name() -> str:
    """Host part of the worker name; the plugin splits workers at the last ``_<digits>``."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host"


def worker_name(global_rank: int, host: str | None = None) -> str:
    return f"{host or host_name()}_{global_rank}"


def span_name(first_active_batch: int) -> str:
    return f"{first_active_batch:0{SPAN_WIDTH}d}"


def window_dir_name(
    window_index: int, first_batch: int, last_batch: int, stage: str = "fit", reason: str | None = None
) -> str:
    """A run name that sorts by window and says which batches it holds, of which stage outside fit
    (``validate-window_000-batches_2-4``) and, if a trigger opened it, why
    (``window_003-slow_step-batches_812-814``)."""
    prefix = "" if stage == "fit" else f"{stage}-"
    why = f"-{reason}" if reason else ""
    return f"{prefix}window_{window_index:03d}{why}-batches_{first_batch}-{last_batch}"


def trace_file_name(worker: str, span: str) -> str:
    return f"{worker}.{span}{TRACE_SUFFIX}"


def memory_file_name(worker: str, span: str) -> str:
    return f"{worker}.{span}{MEMORY_SUFFIX}"


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[Any], None]) -> None:
    """Write ``data`` (bytes, or a callable given the open file) so ``path`` is complete or absent.

    The temporary name starts with a dot and ends in ``.tmp``: it never matches the plugin's pattern.
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask is process-wide, not safe on the writer thread


def gzip_bytes(data: bytes, level: int) -> bytes:
    # mtime=0: the same trace gives the same bytes.
    return gzip.compress(data, compresslevel=level, mtime=0)


def spool_directory() -> str:
    """Scratch space for raw dumps: RAM-backed where the system has it."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="vt_lightning-", dir=base)


class WarnOnce:
    """One warning per kind of problem, not one per window."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return True


# Finish windows in a separate writer process (see ``_writer.py``); False keeps everything on the
# writer thread of the training process (tests that inject faults into ``finish`` use that).
USE_WRITER_PROCESS = True


class BackgroundWriter:
    """One worker thread that finishes windows in order, handing the heavy part to a writer process.

    The thread is started before any window opens, so it never inherits a tracer hook; the process
    is a fresh interpreter (``python -m vt_lightning._writer``), which inherits none either.
    """

    def __init__(self, max_in_flight: int = 2, use_process: bool | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.use_process = USE_WRITER_PROCESS if use_process is None else use_process
        self.process: Any = None
        self.process_error: BaseException | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vt_lightning-writer")
        self._futures: list[Future[Any]] = []
        self._lock = threading.Lock()
        # Create the thread now, outside any window, so no tracer hook is inherited by it.
        self._executor.submit(lambda: None).result()

    def writer_process(self) -> Any:
        """The writer process, started at the first window's hand-off (on the writer thread, so
        quiet steps before the first window never share the CPU with its start-up); None when
        there is none (disabled, or it could not start: windows are then finished on this thread)."""
        if self.process is None and self.use_process and self.process_error is None:
            from ._writer import WriterProcess

            try:
                self.process = WriterProcess()
            except Exception as err:
                self.process_error = err
        return self.process

    def in_flight(self) -> int:
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            return len(self._futures)

    def busy(self) -> bool:
        return self.in_flight() >= self.max_in_flight

    def wait_for_room(self) -> float:
        """Block until fewer than ``max_in_flight`` windows are pending; returns seconds waited."""
        start = time.perf_counter()
        while True:
            with self._lock:
                self._futures = [f for f in self._futures if not f.done()]
                if len(self._futures) < self.max_in_flight:
                    break
                oldest = self._futures[0]
            try:
                oldest.result()
            except Exception:
                pass
        return time.perf_counter() - start

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future = self._executor.submit(fn, *args)
        with self._lock:
            self._futures.append(future)
        return future

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every submitted window is on disk (or failed)."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            try:
                future.result(timeout=timeout)
            except Exception:  # already reported by the job itself
                pass

    def close(self, timeout: float | None = None) -> None:
        self.drain(timeout)
        self._executor.shutdown(wait=True)
        if self.process is not None:
            self.process.close()
            self.process = None


def resolve_root(dirpath: str | None, logger_log_dir: str | None, fallback: str) -> Path:
    """``dirpath`` if given, else the logger's log dir, else ``trainer.log_dir``/``default_root_dir``."""
    if dirpath:
        return Path(dirpath)
    if logger_log_dir:
        return Path(logger_log_dir)
    return Path(fallback)


def ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
