"""Scratch space for a window's raw dumps, between the training process and the writer: on disk, never
``/dev/shm`` (DataLoader workers pass batches there). Each training process owns
``vt_lightning-spool-<host>-<pid>-<random>`` and holds a lock in it for life; ``remove_dead_spools``
deletes only those whose owner is gone (same host and no such pid, lock free, untouched a minute)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from vt_lightning.constants import SPOOL_PREFIX as PREFIX  # re-exported: remote.py and the tests find spools by it
from vt_lightning.export.atomic import process_alive
from vt_lightning.export.job import UnusableURL, locate
from vt_lightning.export.layout import host_name

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: pid and age alone decide
    fcntl = None  # type: ignore[assignment]

_SPOOL = re.compile(rf"^{re.escape(PREFIX)}(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-[^-]+$")
LOCK_NAME = ".owner.lock"
DEAD_AFTER_S = 60.0  # never remove a directory modified this recently, whatever the pid says
BYTES_PER_EVENT = 200  # upper bound of one VizTracer event in its JSON dump (names include paths)
TORCH_RESERVE = 64 * 2**20  # torch's own dump of a window, usually far smaller


class SpoolError(OSError):
    """The spool directory cannot take a window's raw dumps; the message names the directory."""


def check_spool_dir(spool_dir: Any) -> str | None:
    """Validate ``spool_dir``: a writable directory, or a path whose nearest existing parent is one."""
    if spool_dir is None:
        return None
    if not isinstance(spool_dir, (str, os.PathLike)) or not os.fspath(spool_dir):
        raise ValueError(f"`spool_dir` must be a non-empty path or None, got {spool_dir!r}")
    try:
        where = locate(spool_dir)  # the output root's rule: ``file:/x`` is /x, ``~`` expanded
    except UnusableURL:
        where = None
    if not isinstance(where, Path):  # Path() would make a local directory named "s3:"
        raise ValueError(
            f"`spool_dir` must be a local directory (scratch space for raw dumps), got the URL {spool_dir!r}"
        )
    path = where.absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), path)
    if not existing.is_dir():
        raise ValueError(f"`spool_dir` must be a directory, but {existing} is not one")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"`spool_dir` {path} is not writable (checked {existing})")
    return str(path)


class Spool:
    """One training process's spool directory (``os.fspath`` gives its path)."""

    def __init__(self, base: str | None = None) -> None:
        base_dir = Path(base) if base is not None else Path(default_spool_base())
        base_dir.mkdir(parents=True, exist_ok=True)
        self.base = str(base_dir)
        self.removed_dead = remove_dead_spools(self.base)
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{host_name()}-{os.getpid()}-", dir=self.base)
        self._lock_fd: int | None = None
        if fcntl is not None:
            fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
            else:
                self._lock_fd = fd

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def free_bytes(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def check_room(self, tracer_entries: int) -> None:
        """Raise ``SpoolError`` (naming the directory) when a window's dumps might not fit."""
        needed = tracer_entries * BYTES_PER_EVENT + TORCH_RESERVE
        try:
            free = self.free_bytes()
        except OSError:
            return  # no statvfs here: the dump reports a full disk itself
        if free < needed:
            raise SpoolError(
                errno.ENOSPC,
                f"the spool directory {self.path} has {free / 2**20:.0f} MB free, and a window with "
                f"tracer_entries={tracer_entries} may need up to {needed / 2**20:.0f} MB there; set "
                "`spool_dir` (or $TMPDIR) to a roomier disk, or lower `tracer_entries`",
            )

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def spool_directory(base: str | None = None) -> Spool:
    """This process's spool directory under ``base`` (default: ``default_spool_base()``)."""
    return Spool(base)


RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def default_spool_base(mounts: str | None = None) -> str:
    """``$TMPDIR`` (or ``TEMP``/``TMP``) when set; else the system temp dir, unless that is RAM and
    ``/var/tmp`` (disk by convention) is usable. ``mounts``: ``/proc/mounts``' text."""
    if any(os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")):
        return tempfile.gettempdir()
    system = tempfile.gettempdir()
    fallback = "/var/tmp"
    if not (os.path.isdir(fallback) and os.access(fallback, os.W_OK | os.X_OK)):
        return system
    if (
        _filesystem_type(system, mounts) in RAM_FILESYSTEMS
        and _filesystem_type(fallback, mounts) not in RAM_FILESYSTEMS
    ):
        return fallback
    return system


def _filesystem_type(path: str, mounts: str | None = None) -> str | None:
    """The type of the filesystem ``path`` is on, from the longest matching mount point."""
    if mounts is None:
        try:
            with open("/proc/mounts") as f:
                mounts = f.read()
        except OSError:
            return None
    path = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):  # the deepest mount holding path
            best = (len(point), fields[2])
    return best[1] if best else None


def remove_dead_spools(base: str, now: float | None = None) -> int:
    """Delete spool directories in ``base`` whose training process is gone; returns how many."""
    now = time.time() if now is None else now
    removed = 0
    host = host_name()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        match = _SPOOL.match(entry.name)
        if match is None or match["host"] != host or not entry.is_dir(follow_symlinks=False):
            continue
        if process_alive(int(match["pid"])):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < DEAD_AFTER_S:
                continue
        except OSError:
            continue
        if _locked(entry.path):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


def _locked(path: str) -> bool:
    """Whether a live process holds the spool directory's lock (another pid namespace, say)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return False
