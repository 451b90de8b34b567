"""Files that are complete or absent: write under a temporary name, then rename.

The temporary name starts with a dot and ends in ``.tmp`` (the plugin's pattern never matches it).
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Callable
from typing import Any


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[Any], None]) -> None:
    """Write ``data`` (bytes, or a callable given the open file) so ``path`` is complete or absent."""
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
