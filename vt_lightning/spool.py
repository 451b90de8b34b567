"""Scratch space for a window's raw dumps, between the training process and the writer."""

from __future__ import annotations

import os
import tempfile


def spool_directory() -> str:
    """Scratch space for raw dumps: RAM-backed where the system has it."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="vt_lightning-", dir=base)
