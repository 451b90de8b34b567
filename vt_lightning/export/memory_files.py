"""Memory snapshot files: pickled so https://pytorch.org/memory_viz can open them (docs/files.md)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vt_lightning.constants import MEMORY_SUFFIX, OOM_MEMORY_SUFFIX, PICKLE_PROTOCOL
from vt_lightning.export.atomic import atomic_write


def write_snapshot(path: str | os.PathLike[str], snapshot: Mapping[str, Any]) -> None:
    """Pickle ``snapshot`` with protocol 4 (the web viewer cannot read 5); complete or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL))


def oom_file_name(memory_name: str) -> str:
    """``<worker>.<span>.memory_snapshot.pickle`` -> ``<worker>.<span>.oom.memory_snapshot.pickle``."""
    if memory_name.endswith(MEMORY_SUFFIX):
        return memory_name[: -len(MEMORY_SUFFIX)] + OOM_MEMORY_SUFFIX
    stem, dot, ext = memory_name.rpartition(".")
    return f"{stem}.oom.{ext}" if dot and stem else f"{memory_name}.oom"
