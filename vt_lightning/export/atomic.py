"""Files that are complete or absent: written under a temporary name, then renamed. A temporary never
matches the plugin's pattern and names its writer's ``<host>-<pid>`` (``remove_stale_temporaries``
tells a killed writer's leftover from a live one's); it gets mode 0o666 under the umask, as the
user's other files. A file published without clobbering may carry a *claim*, a second name of its
inode (``layout.claim_name``), so a retry after its writer was killed knows it for its own (``owns``)."""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import pickle
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vt_lightning.constants import PICKLE_PROTOCOL
from vt_lightning.export.layout import host_name

# ``.<final name>.<host>-<pid>.<random>.tmp``
_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)\.[^.]+\.tmp$")
STALE_AFTER_S = 24 * 3600  # a temporary this old is a leftover whoever wrote it (another host too)
# errno of a filesystem without hard links (some network/FUSE filesystems)
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE |= getattr(os, "O_BINARY", 0)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | Callable[[Any], None],
    overwrite: bool = True,
    claim: str | None = None,
) -> None:
    """Write ``data`` (bytes, or a callable given the open file) so ``path`` is complete or absent.
    ``overwrite=False`` raises ``FileExistsError`` rather than replace ``path``; ``claim`` is linked to
    the file before it is published, so a kill right after still proves whose file it is."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    fd, tmp = _create_temporary(directory or ".", name)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            claim_path = os.path.join(directory, claim) if claim else None
            if claim_path is not None:
                _link_claim(tmp, claim_path)
            try:
                _publish_new(tmp, path)
            except BaseException:  # whatever stops the publish, the claim of an unpublished file goes
                if claim_path is not None:
                    remove_quietly(claim_path)
                raise
    except BaseException:  # complete or absent: whatever stops the write, the temporary goes
        remove_quietly(tmp)
        raise


def _create_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new temporary opened for writing, mode 0o666 under the umask (``mkstemp`` makes 0600)."""
    prefix = f".{name}.{host_name()}-{os.getpid()}."
    for _ in range(100):
        tmp = os.path.join(directory, f"{prefix}{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, _NEW_FILE, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.path.join(directory, prefix))


def _link_claim(tmp: str, claim_path: str) -> None:
    """Make ``claim_path`` a second name of ``tmp``'s inode (an empty file without hard links)."""
    remove_quietly(claim_path)
    try:
        os.link(tmp, claim_path)
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        os.close(os.open(claim_path, _NEW_FILE, 0o666))


def owns(path: str | os.PathLike[str], claim_path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` was published by the job whose claim is ``claim_path``: the same inode, or
    (no hard links) an empty claim beside a regular file."""
    try:
        published = os.lstat(path)
        claim = os.lstat(claim_path)
    except OSError:
        return False
    if not (stat.S_ISREG(published.st_mode) and stat.S_ISREG(claim.st_mode)):
        return False
    same_inode = (published.st_dev, published.st_ino) == (claim.st_dev, claim.st_ino)
    return same_inode or claim.st_size == 0


def remove_quietly(path: str | os.PathLike[str]) -> None:
    """Remove a file of ours if it is there (a raw dump, a claim, a temporary)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _publish_new(tmp: str, path: str) -> None:
    """Give ``tmp`` the name ``path`` only if nothing has it (``link`` fails on any existing name)."""
    try:
        os.link(tmp, path)
    except OSError as err:  # no hard links here (some network/FUSE filesystems): check, then rename
        if err.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def remove_stale_temporaries(root: str | os.PathLike[str], pid: int | None = None) -> int:
    """Remove and count temporaries of dead writers in ``root``'s run directories: this host's whose
    process is gone (or is ``pid``), and any older than a day. A live process's is never touched."""
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


def scheduler_state(stat: bytes) -> str:
    """The state letter of a ``/proc/<pid>/stat`` line, or "": read after the last ")" (names may hold one)."""
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3].decode("ascii", "replace") if end >= 0 else ""


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


def write_snapshot(path: str | os.PathLike[str], snapshot: Mapping[str, Any]) -> None:
    """A memory snapshot, pickled with protocol 4 (memory_viz cannot read 5), complete or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL))


def gzip_bytes(data: bytes, level: int) -> bytes:
    # mtime=0: the same trace gives the same bytes.
    return gzip.compress(data, compresslevel=level, mtime=0)


class GzipAside:
    """``gzip_bytes(data, level)`` on a thread of its own (zlib lets go of the GIL); ``result()`` waits.
    Not a ``concurrent.futures.Future``: that import brings ``logging`` (~20 ms) into the writer."""

    def __init__(self, data: bytes, level: int) -> None:
        self._compressed: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(data, level), name="vt_lightning-gzip", daemon=True)
        self._thread.start()

    def _run(self, data: bytes, level: int) -> None:
        try:
            self._compressed = gzip_bytes(data, level)
        except BaseException as err:  # handed to the caller by result()
            self._error = err

    def result(self) -> bytes:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._compressed is not None
        return self._compressed
