"""What crosses from training to the writer, and what comes back: both immutable. The training
thread hands over one ``WindowJob`` per closed window (pickled to the writer process as it is); the
writer answers with one ``WindowResult``, or the job is dropped with a reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.analysis.filters import PythonFilter
from vt_lightning.analysis.schema import Summary


@dataclass(frozen=True)
class WindowJob:
    """One closed window: where its raw dumps are, how to merge them, where its files go."""

    run_dir: Path
    trace_name: str
    torch_raw: Path
    python_raw: Path | None
    clock_start: ClockPair
    clock_end: ClockPair
    import_base_ns: int | None
    metadata: dict[str, Any]  # written into the trace as it is; never changed after hand-off
    gzip_level: int = 3
    memory_name: str | None = None  # write a memory snapshot under this name
    memory_snapshot: Any = None  # a CUDA allocator snapshot taken at window end, if any
    thread_names: dict[int, str] = field(default_factory=dict)  # native id -> name at window end
    clock_markers: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)
    python_filter: PythonFilter | None = None  # which recorded Python calls the trace keeps
    summary: bool = True  # write <worker>.<span>.summary.jsonc/.md beside the trace
    job_id: str = ""  # decided once at window close: a retry recognizes its own published trace
    publish_to: str | None = None  # a remote run directory (URL): ``run_dir`` is then local staging
    extras: dict[str, Any] = field(default_factory=dict)  # side recorders' data by name (recording/side.py)


@dataclass(frozen=True)
class Destination:
    """The controller's part of a job: where the window goes and what is written for it."""

    run_dir: Path
    trace_name: str
    metadata: dict[str, Any]
    gzip_level: int = 3
    memory_name: str | None = None
    python_filter: PythonFilter | None = None
    summary: bool = True
    job_id: str = ""
    publish_to: str | None = None


class URL(str):
    """A file or directory of a remote filesystem, spelled as given (``Path`` turns ``s3://b`` into
    ``s3:/b``); it answers ``name``, ``parent`` and ``/`` like a Path."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self.rstrip("/").rpartition("/")[2]

    @property
    def parent(self) -> URL:
        return URL(self.rstrip("/").rpartition("/")[0])

    def __truediv__(self, name: str) -> URL:
        return URL(f"{self.rstrip('/')}/{name}")

    def with_name(self, name: str) -> URL:
        return self.parent / name


Location = Path | URL  # where a result's file is: a local path, or a remote file's URL

_LOCAL_PROTOCOLS = ("file", "local")  # fsspec's names of the local filesystem


class UnusableURL(ValueError):
    """A URL whose filesystem cannot be had here; the caller words the message, ``cause`` the reason."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"{url}: {type(cause).__name__}: {cause}")
        self.url = url
        self.cause = cause


def locate(where: str | os.PathLike[str]) -> Location:
    """Where a user's path or URL points: the one rule for the callback's output root and the
    ``vt-lightning`` command's arguments. A URL has a protocol of two or more characters before
    ``://`` (fsspec's rule: ``C://x`` stays a Windows path) or a ``file:``/``local:`` prefix; a local
    one is its path (``file:///x`` is ``/x``), any other a ``URL`` once fsspec knows its filesystem
    (``UnusableURL`` if not). A plain path has ``~`` expanded, as Lightning does, and stays relative."""
    text = os.fspath(where)
    if not isinstance(text, str):
        raise TypeError(f"expected a path or URL as text, got {type(text).__name__}")
    protocol, separator, _ = text.partition("://")
    if not (separator and len(protocol) > 1) and text.partition(":")[0].lower() not in _LOCAL_PROTOCOLS:
        return Path(text).expanduser()
    fs, stripped = url_filesystem(text)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if set(_LOCAL_PROTOCOLS) & set(protocols):
        return Path(stripped)  # fsspec made it absolute
    return URL(text.rstrip("/"))


def url_filesystem(url: str) -> tuple[Any, str]:
    """(the fsspec filesystem of ``url``, its path as that filesystem's listings name it)."""
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(url)
    except Exception as err:  # ValueError (unknown protocol), ImportError (s3fs missing)
        raise UnusableURL(url, err) from err


@dataclass(frozen=True)
class WindowResult:
    """What the writer wrote for one window (URLs when the output root is remote)."""

    trace_path: Location
    trace_bytes: int
    json_bytes: int
    python_events: int
    torch_events: int
    overflow: bool
    suggested_tracer_entries: int | None = None
    memory_path: Location | None = None
    memory_bytes: int = 0  # the memory snapshot's size (the run budget adds it up)
    notes: tuple[str, ...] = ()
    summary: Summary | None = None  # None when it could not be computed (see ``notes``)
    summary_path: Location | None = None
    summary_markdown: str | None = None
    summary_seconds: float = 0.0  # writer-process time spent on the summary and its files
    job: dict[str, Any] | None = None  # rank 0: the window's job file, ranks, offsets, straggler (job_file.py)
