"""Warnings the user sees once per kind of problem, not once per window."""

from __future__ import annotations

import threading
import warnings


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
