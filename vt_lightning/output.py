"""Compatibility names: ``output`` was split into ``names`` (names and paths), ``atomic`` (complete
or absent files), ``spool`` (raw dumps), ``background`` (the writer client) and ``warn``.

New code imports those modules; this one only re-exports, so it sits in no import cycle.
"""

from __future__ import annotations

from .atomic import atomic_write, gzip_bytes
from .background import BackgroundWriter
from .names import (
    MEMORY_SUFFIX,
    SPAN_WIDTH,
    TRACE_PATTERN,
    TRACE_SUFFIX,
    ensure_dir,
    host_name,
    memory_file_name,
    resolve_root,
    span_name,
    trace_file_name,
    window_dir_name,
    worker_name,
)
from .spool import spool_directory
from .warn import WarnOnce

__all__ = [
    "MEMORY_SUFFIX", "SPAN_WIDTH", "TRACE_PATTERN", "TRACE_SUFFIX", "BackgroundWriter", "WarnOnce",
    "atomic_write", "ensure_dir", "gzip_bytes", "host_name", "memory_file_name", "resolve_root",
    "span_name", "spool_directory", "trace_file_name", "window_dir_name", "worker_name",
]
