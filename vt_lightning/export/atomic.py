"""Files that are complete or absent: write under a temporary name, then rename.

The temporary name starts with a dot and ends in ``.tmp`` (the plugin's pattern never matches it)
and carries ``<host>-<pid>`` of the writing process, so leftovers of a process killed mid-write
(SIGKILL, OOM) can be told from a live writer's and removed (``remove_stale_temporaries``).
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vt_lightning.export.layout import host_name

# ``.<final name>.<host>-<pid>.<random>.tmp``
_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)\.[^.]+\.tmp$")
STALE_AFTER_S = 24 * 3600  # a temporary this old is a leftover whoever wrote it (another host too)


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[Any], None], overwrite: bool = True) -> None:
    """Write ``data`` (bytes, or a callable given the open file) so ``path`` is complete or absent.

    ``overwrite=False`` never replaces an existing ``path`` (nor a symlink there): it raises
    ``FileExistsError`` instead, atomically where the filesystem supports hard links.
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{host_name()}-{os.getpid()}.", suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide the file from other users
        if overwrite:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _publish_new(tmp: str, path: str) -> None:
    """Give ``tmp`` the name ``path`` only if nothing has it (``link`` fails on any existing name)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as err:  # no hard links here (some network/FUSE filesystems): check, then rename
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def remove_stale_temporaries(root: str | os.PathLike[str], pid: int | None = None) -> int:
    """Remove temporaries left in ``root``'s run directories by dead writers; returns how many.

    A temporary is removed when this host wrote it and its process is gone (or is ``pid``, a writer
    known dead), or when it is older than a day. A live process's temporary is never touched.
    """
    removed = 0
    host = host_name()
    now = time.time()
    try:
        run_dirs = [d for d in Path(root).iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return 0
    for run_dir in run_dirs:
        try:
            entries = list(os.scandir(run_dir))
        except OSError:
            continue
        for entry in entries:
            match = _TEMPORARY.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            owner = int(match["pid"])
            try:
                old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
            except OSError:
                continue
            ours = match["host"] == host
            if old or (ours and (owner == pid or not process_alive(owner))):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 probes without sending)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask is process-wide, not safe on the writer thread


def gzip_bytes(data: bytes, level: int) -> bytes:
    # mtime=0: the same trace gives the same bytes.
    return gzip.compress(data, compresslevel=level, mtime=0)
