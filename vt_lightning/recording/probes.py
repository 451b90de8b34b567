"""The facts triggers read at the coarse checks, each cheap: a trigger file, a signal, the memory in use."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Problem = Callable[[str, str], Any]


class TriggerFile:
    """``<output_dir>/vt_lightning.trigger``: seen once, then deleted; one that cannot be deleted is ignored
    until it changes, with one warning. On a URL root: one metadata request per coarse check."""

    def __init__(self, path: Path | str, on_problem: Problem) -> None:
        self.path = path
        self.on_problem = on_problem
        self._kept: tuple[Any, ...] | None = None  # identity of a file we could not delete
        self._fs: Any = None
        if not isinstance(path, Path):
            from lightning.fabric.utilities.cloud_io import get_filesystem

            self._fs = get_filesystem(path)

    def seen(self) -> bool:
        identity = self._identity()
        if identity is None or identity == self._kept:
            return False
        try:
            if self._fs is not None:
                self._fs.rm_file(self.path)
            else:
                os.unlink(self.path)
        except FileNotFoundError:
            pass  # another rank on the same file system consumed it first
        except Exception as err:  # OSError locally; a store's own errors remotely
            self._kept = identity
            self.on_problem(
                "trigger-file",
                f"vt_lightning: could not delete the trigger file {self.path} ({err}); it opened one "
                "window and is ignored until it changes. Make its directory writable to use it again.",
            )
        return True

    def _identity(self) -> tuple[Any, ...] | None:
        """What tells this file from a later one of the same name; None when there is none."""
        if self._fs is None:
            try:
                st = os.stat(self.path)
            except OSError:
                return None
            return (st.st_ino, st.st_size, st.st_mtime_ns)
        try:
            info = self._fs.info(self.path)
        except Exception:  # absent, or the store did not answer: looked for again at the next check
            return None
        if info.get("type", "file") != "file":
            return None
        return tuple(str(info.get(key)) for key in ("size", "ETag", "mtime", "LastModified", "created"))


class SignalTrigger:
    """Opt-in: a signal requests a window (the handler only sets a flag); ``restore`` puts back the
    handler found at ``install``, unless someone replaced ours since."""

    def __init__(self, signum: int, name: str | None = None) -> None:
        self.signum = int(signum)
        self.name = name or _signal_name(self.signum)
        self.requested = False
        self.previous: Any = None
        self.installed = False
        self.on_request: Callable[[], None] | None = None  # e.g. "look at the next batch"

    def install(self) -> str | None:
        """Install the handler; return why not (a foreign handler, not the main thread) or None."""
        current = signal.getsignal(self.signum)
        if current not in (signal.SIG_DFL, None) and current != self._handle:
            return f"{self.name} already has a handler ({current!r})"
        try:
            self.previous = signal.signal(self.signum, self._handle)
        except ValueError as err:  # not the main thread of the main interpreter
            return str(err)
        self.installed = True
        return None

    def owns(self, handler: Any) -> bool:
        """Whether ``handler`` is this trigger's."""
        return bool(handler == self._handle)

    def restore(self) -> None:
        if not self.installed:
            return
        self.installed = False
        try:
            if self.owns(signal.getsignal(self.signum)):
                signal.signal(self.signum, self.previous if self.previous is not None else signal.SIG_DFL)
        except ValueError:  # off the main thread at teardown: leave it (it only sets a flag)
            pass

    def take(self) -> bool:
        requested, self.requested = self.requested, False
        return requested

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.on_request is not None:
            self.on_request()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def foreign_signal_handler(signum: int) -> Any:
    """The handler installed for ``signum`` if it is neither the default nor "unknown"."""
    current = signal.getsignal(signum)
    return None if current in (signal.SIG_DFL, None) else current


def memory_reader(cuda_device: Any = None) -> tuple[Callable[[], int], str]:
    """A reader of the memory in use, and what it reads: on CUDA the allocator's allocated bytes
    (live tensors; not the cache, which only grows), else the process's resident set size."""
    if cuda_device is not None:
        import torch

        return (lambda: torch.cuda.memory_allocated(cuda_device)), "cuda_allocated"
    if sys.platform.startswith("linux") and os.path.exists("/proc/self/statm"):
        page = os.sysconf("SC_PAGE_SIZE")

        def rss_linux() -> int:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * page

        return rss_linux, "rss"
    try:
        import psutil

        process = psutil.Process()
        return (lambda: process.memory_info().rss), "rss"
    except ImportError:
        import resource

        # Peak RSS (no portable current RSS without psutil): growth of the peak is still growth.
        scale = 1 if sys.platform == "darwin" else 1024
        return (lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale), "peak_rss"
