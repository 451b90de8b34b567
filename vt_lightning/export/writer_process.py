"""The writer process: finishes windows (parse, merge, encode, compress, write) outside the
training process, so that work never competes with training for the GIL.

Started outside any window (at train start, or setup for other stages, when the first window is far
enough ahead and within the run; else at the first window's hand-off; see
``controller/handoff.py``), so it inherits no hook, as
``python -I -S -c <boot>`` (``writer_command``): a fresh interpreter that imports neither torch nor
Lightning and never re-runs the user's script (as ``multiprocessing``'s spawn would). Isolated mode
(``-I``) keeps the working directory, ``PYTHONPATH`` and user site-packages off its import path, so a
stray ``orjson.py`` where training was started never runs in it, and ``-S`` skips ``site`` (no
``.pth`` file runs code in it); the boot code then puts on its import path this package's root,
the directories orjson and numpy were imported from, and the absolute ``PYTHONPATH`` entries (where
clusters install packages). Jobs and results travel as length-prefixed pickles over its
stdin/stdout; it exits when its stdin closes.
"""

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

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind


# Popen runs on the writer thread while the training thread may fork (DataLoader workers, VizTracer's
# dump child). A child forked during Popen inherits its exec-status pipe, and Popen then waits for
# that child to exit before it returns: the writer stalled for a whole epoch (or until
# writer_timeout dropped its windows; seen 1 run in 4 of tests/test_ddp.py on 3.12). Forks in this
# process wait for the few milliseconds Popen holds this lock (``os.register_at_fork``); Popen's own
# fork runs no Python fork handlers, and the lock is reentrant in case a future version does.
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
                env=_child_env(),
                close_fds=True,
                # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) and
                # hang-up reach training only; training then hands over what it recorded, and this
                # process finishes it before it sees its stdin close.
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
            raise WriterError(*payload)
        return payload

    def kill(self) -> None:
        """Kill and reap at once (a writer stuck past its time limit, or idle at the run's end)."""
        try:
            self._proc.kill()
        except OSError:
            pass
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
        """Close our ends of its pipes (else each one is a ResourceWarning when collected), unless
        a call still has them: a thread stuck reading a killed writer sees EOF and lets go, and
        closing under it would wait for that thread."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:  # a request still buffered for a writer that is gone
                    pass
        finally:
            self._lock.release()


WRITER_NICE = 10
AUTOGROUP_NICE = 19

# Lowered before its imports, not after: its start-up then yields to training's steps (it is started
# in the background, possibly during quiet steps). The code is ``yield_cpu_to_training`` inlined.
_BOOT = (
    "import os, sys\n"
    f"try: os.nice({WRITER_NICE})\nexcept (AttributeError, OSError): pass\n"
    f"try:\n with open('/proc/self/autogroup', 'w') as f: f.write('{AUTOGROUP_NICE}')\nexcept OSError: pass\n"
    "sys.path.extend(p for p in sys.argv[1:] if p not in sys.path); "
    "from vt_lightning.export.writer_process import main; main()"
)


def yield_cpu_to_training() -> None:
    """Lowers this process's CPU share below training's, on a busy machine windows just land later.

    ``nice`` alone is not enough: the writer runs in its own session (see ``WriterProcess``), and
    where Linux groups tasks by session (``/proc/sys/kernel/sched_autogroup_enabled``, the default
    on many distributions) a new session is a new scheduling group that competes with training's
    group as an equal, whatever its nice. On 2 cores a busy writer at nice 10 in its own session made
    torch's two intra-op threads 8x slower (40 -> 320 ms; nice 19 for its group: 40 -> 41 ms), so
    the group's nice is raised too (allowed without privileges; no-op where there is no autogroup).
    """
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < WRITER_NICE:
            os.nice(WRITER_NICE - os.getpriority(os.PRIO_PROCESS, 0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(AUTOGROUP_NICE))
    except OSError:
        pass


def writer_import_path() -> list[str]:
    """Where the writer finds what it imports: the directory holding vt_lightning/, then orjson's
    and numpy's (its dependencies outside the standard library), then ``PYTHONPATH``'s absolute
    entries."""
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
    """The writer's command line: an isolated interpreter without ``site`` and an explicit import
    path (never the cwd).

    ``site`` is skipped (``-S``): the writer needs nothing it sets up, and an environment's ``.pth``
    files may run any code (an editable install's finder, namespace-package hooks) on training's
    cores (a CPU run starts the writer at its first window). Measured in the team's editable
    environment: 1-6 ms of the ~110 ms the writer's imports take; ``site`` mostly imports what the
    pipeline needs anyway, so the saving grows only with what the ``.pth`` files do.
    """
    return [sys.executable, "-I", "-S", "-c", _BOOT, *writer_import_path()]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(ENV_SWITCH, None)  # the child never trains, but keep the switch from leaking
    return env


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from vt_lightning.export.pipeline import finish_window  # imported before the first answer: no delay at window one

    # A window's JSON is acyclic and freed by reference counting; a full collection that landed
    # inside the first window traversed it all (245 of 476 ms). Collect after each answer instead.
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
            result = finish_window(request)
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
    yield_cpu_to_training()  # the boot code did it already; here for any other way in
    # Results go over the real stdout; anything printed by accident goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, out)
    # Every answer is sent and every file written (atomically): skip the interpreter's teardown,
    # which took 0.4-1.2 s at nice 10 on a loaded machine while fit waited for this exit.
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
