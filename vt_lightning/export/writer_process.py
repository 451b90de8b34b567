"""The writer process: finishes windows outside the training process, never competing with it for the
GIL. Started outside any window (``controller/handoff.py``), so it inherits no hook, as ``python -I
-S -c <boot>`` (``writer_command``): imports neither torch nor Lightning, never re-runs the user's
script, and ``-I`` keeps the working directory off its path (a stray ``orjson.py`` never runs in it).
Jobs and results travel as length-prefixed pickles over its stdin/stdout; it exits when stdin closes."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from vt_lightning.constants import ENV_SWITCH

_HEADER = struct.Struct("!Q")


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("writer process closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("writer process closed its pipe mid-message")
    return pickle.loads(data)


class WriterError(RuntimeError):
    """A window failed in the writer process; the message carries the original error."""


# A child forked during Popen (on the writer thread) inherits its exec-status pipe, and Popen waits
# for that child to exit: forks in this process wait for this lock (reentrant) instead.
_SPAWNING = threading.RLock()
_held = threading.local()  # the lock this thread took before its fork (released after it, the same one)


def _hold_spawning() -> None:
    _SPAWNING.acquire()
    _held.lock = _SPAWNING


def _spawning_done_in_parent() -> None:
    lock, _held.lock = getattr(_held, "lock", None), None
    if lock is not None:  # None: the handlers were registered while this fork was under way
        lock.release()


def _spawning_done_in_child() -> None:
    global _SPAWNING
    _SPAWNING = threading.RLock()  # the forked child has no writer thread: a fresh, free lock
    _held.lock = None


os.register_at_fork(
    before=_hold_spawning, after_in_parent=_spawning_done_in_parent, after_in_child=_spawning_done_in_child
)


class WriterProcess:
    """Client side: one child process, one job at a time (the writer thread serialises calls)."""

    def __init__(self) -> None:
        with _SPAWNING:  # no fork of this process (DataLoader workers, dump children) meanwhile
            self._proc = subprocess.Popen(
                writer_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != ENV_SWITCH},  # it never trains: no switch
                close_fds=True,
                # Its own session: a terminal's Ctrl-C and hang-up reach training only, which then hands
                # over what it recorded; this process finishes it before its stdin closes.
                start_new_session=True,
            )
        self._lock = threading.Lock()
        # Fail now, not at the first window, if the child cannot even start.
        if self.call("ping") != "pong":
            raise RuntimeError("vt_lightning writer process did not answer")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def call(self, request: Any) -> Any:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            _send(self._proc.stdin, request)
            status, payload = _receive(self._proc.stdout)
        if status == "error":
            kind, message = payload
            raise WriterError(f"{kind}: {message}" if message else kind)
        return payload

    def kill(self) -> None:
        """Kill and reap at once (a writer stuck past its time limit, or idle at the run's end)."""
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._proc.wait()
        self._close_pipes()

    def close(self, timeout: float = 30.0) -> None:
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            self._proc.wait(timeout=timeout)
        except Exception:  # a timeout, a broken pipe: the writer is killed rather than left behind
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Close our ends of its pipes (else ResourceWarnings), unless a call still has them: a thread stuck
        reading a killed writer sees EOF, and closing under it would wait for that thread."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):  # a request still buffered for a writer that is gone
                    if pipe is not None:
                        pipe.close()
        finally:
            self._lock.release()


WRITER_NICE = 10
AUTOGROUP_NICE = 19

# The boot code yields the CPU to training before any import. In its own session the writer is its
# own ``sched_autogroup``, an equal of training's whatever its nice, so the group's nice is raised too.
_BOOT = (
    "import os, sys\n"
    f"try: os.nice({WRITER_NICE})\nexcept (AttributeError, OSError): pass\n"
    f"try:\n with open('/proc/self/autogroup', 'w') as f: f.write('{AUTOGROUP_NICE}')\nexcept OSError: pass\n"
    "sys.path.extend(p for p in sys.argv[1:] if p not in sys.path); "
    "from vt_lightning.export.writer_process import main; main()"
)


def writer_import_path() -> list[str]:
    """vt_lightning's root, orjson's and numpy's, then ``PYTHONPATH``'s absolute entries."""
    import numpy
    import orjson

    roots = [
        Path(__file__).resolve().parents[2],
        Path(orjson.__file__).resolve().parents[1],
        Path(numpy.__file__).resolve().parents[1],
    ]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    return list(dict.fromkeys([*map(str, roots), *extra]))


def writer_command() -> list[str]:
    """An isolated interpreter with an explicit import path, without ``site``: an environment's ``.pth``
    files may run any code on training's cores."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, *writer_import_path()]


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from vt_lightning.export.pipeline import finish_window  # imported before the first answer: no delay at window one

    # A window's JSON is acyclic: a full collection inside a window would traverse it all.
    gc.freeze()
    gc.disable()
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        if request == "ping":
            _send(stdout, ("ok", "pong"))
            continue
        try:
            result = request() if callable(request) else finish_window(request)  # a window, or work beside one
        except BaseException as err:  # report, keep serving
            _send(stdout, ("error", (type(err).__name__, str(err))))
        else:
            _send(stdout, ("ok", result))
        del request
        gc.collect()  # what the window left in cycles: after its answer, off the critical path


def main() -> None:
    for name in ("SIGINT", "SIGQUIT", "SIGHUP"):  # a kill aimed at the group still finds nothing to stop
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    # Results go over the real stdout; anything printed by accident goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, out)
    # Every answer is sent and every file written: skip the teardown while fit waits for this exit.
    out.flush()
    sys.stderr.flush()
    os._exit(0)
