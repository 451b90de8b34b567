"""The TensorBoard tab's index of a log dir: which runs hold which windows, read from the disk itself.

TensorBoard's multiplexer is absent when it runs its data server, so the tab reads ``--logdir``
here. Three rules keep it fast and small whatever the number of windows:

* **Incremental.** A directory's listing is kept with its ``st_mtime_ns`` and listed again only
  when that changes (a new window directory, a file renamed into place), so windows written while
  TensorBoard runs appear on the next reload, without a restart.
* **Bounded.** A window's row (what the list shows) is cached by the (path, mtime, size) of the
  summary it came from, in a least-recently-used map of ``MAX_ROWS``; whole summaries in one of
  ``MAX_SUMMARIES``. Rows are read for the page asked for, not for every window of the log dir.
* **Inside the log dir only.** Every path a request names is checked part by part (no ``..``, no
  empty or hidden part) and, resolved with its symlinks, must stay under the log dir; files are read
  by ``export/reading.py`` (regular files only, never blocking on a FIFO, schema-checked, within a
  memory budget), as the ``vt-lightning`` command reads them.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from vt_lightning.analysis.schema import Summary
from vt_lightning.cli.serve import perfetto_range
from vt_lightning.constants import MEMORY_SUFFIX, SUMMARY_JSON_SUFFIX, TRACE_SUFFIX
from vt_lightning.export.job_file import JOB_DIR, JOB_SUFFIX, JOB_SUMMARY_SUFFIX
from vt_lightning.export.reading import MemoryBudget, UnreadableFile, open_regular, read_summary
from vt_lightning.export.report import summary_stem
from vt_lightning.export.source_lines import NOT_HERE, changed_since

WINDOW_DIR = re.compile(
    r"^(?:(?P<stage>[a-z]+)-)?window_(?P<index>\d+)(?:-(?P<reason>.+?))?-batches_(?P<first>\d+)-(?P<last>\d+)"
    r"(?:\.(?P<copy>\d+))?$"
)
WORKER_FILE = re.compile(
    r"^(?P<worker>.+)_(?P<rank>\d+)\.(?P<span>\d+)\.(?P<kind>pt\.trace\.json\.gz|summary\.jsonc?|memory_snapshot\.pickle|memory_view\.jsonc)$"
)
KINDS = {"pt.trace.json.gz": "trace", "memory_snapshot.pickle": "memory", "memory_view.jsonc": "memory_view"}
MAX_DEPTH = 6  # log dir / lightning_logs / version_N / window: runs sit a few levels down at most
MAX_ROWS = 4096
MAX_SUMMARIES = 32
MAX_DIRS = 8192  # directory listings kept; past it the oldest are listed again when asked
WRITING_S = 120.0  # a trace without its summary, younger than this: the writer is still at it
MEMORY_VIEW_MAX_BYTES = 256 << 10  # a memory view is a few KB; past this it is not ours

K = TypeVar("K")
V = TypeVar("V")


class Refused(Exception):
    """A request names something the tab does not serve; ``status`` is the HTTP answer (400, 404)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


class LRU(Generic[K, V]):
    """A dict that forgets its least recently used entries past ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def safe_parts(relative: str) -> list[str]:
    """The parts of a path a request named, or Refused (400) for anything that could climb out or
    name a hidden (temporary) file."""
    if not isinstance(relative, str) or len(relative) > 4096:
        raise Refused("path: not a path", 400)
    parts = [p for p in relative.split("/") if p != ""] if relative not in ("", ".") else []
    for part in parts:
        if part in (".", "..") or part.startswith(".") or "\\" in part or "\0" in part:
            raise Refused(f"path: {relative!r} is not a path inside the log dir", 400)
    return parts


@dataclass(frozen=True)
class WorkerFiles:
    """One rank's files in a window directory, by kind (names, not paths)."""

    worker: str
    rank: int
    span: str
    trace: str | None = None
    summary: str | None = None
    memory: str | None = None
    memory_view: str | None = None


@dataclass
class Listing:
    """A directory's entries as last listed, with the mtime they were listed at."""

    mtime_ns: int
    dirs: list[str] = field(default_factory=list)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (size, mtime_ns)
    hidden: int = 0  # dot-files: temporaries of a writer at work


class LogIndex:
    """Runs and windows under ``logdir``, listed on demand and cached within bounds."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.logdir = Path(logdir)
        self.root = Path(os.path.realpath(logdir))
        self._listings: LRU[str, Listing] = LRU(MAX_DIRS)
        self.rows: LRU[tuple[str, int, int], dict[str, Any]] = LRU(MAX_ROWS)
        self.summaries: LRU[tuple[str, int, int], Summary] = LRU(MAX_SUMMARIES)

    # ---------------------------------------------------------------------------------- paths
    def inside(self, relative: str) -> Path:
        """The real path of ``relative`` under the log dir; Refused if it is not there."""
        path = self.root.joinpath(*safe_parts(relative))
        real = Path(os.path.realpath(path))
        if real != self.root and not real.is_relative_to(self.root):
            raise Refused(f"{relative}: not inside the log dir")
        return real

    def listing(self, directory: Path) -> Listing | None:
        """``directory``'s entries (no symlinked directories followed), listed again only when its
        mtime changed; None when it is not a directory."""
        try:
            mtime = os.stat(directory).st_mtime_ns
        except (OSError, ValueError):
            return None
        key = str(directory)
        known = self._listings.get(key)
        if known is not None and known.mtime_ns == mtime:
            return known
        listing = Listing(mtime)
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        listing.hidden += 1
                    elif entry.is_dir(follow_symlinks=False):
                        listing.dirs.append(entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        listing.files[entry.name] = (info.st_size, info.st_mtime_ns)
        except OSError:
            return None
        listing.dirs.sort()
        self._listings.put(key, listing)
        return listing

    # ---------------------------------------------------------------------------------- runs
    def _walk(self, directory: Path, depth: int) -> Iterator[tuple[Path, list[str]]]:
        listing = self.listing(directory)
        if listing is None:
            return
        windows = [d for d in listing.dirs if WINDOW_DIR.match(d)]
        if windows:
            yield directory, windows
        if depth < MAX_DEPTH:
            for name in listing.dirs:
                if not WINDOW_DIR.match(name) and name != JOB_DIR:
                    yield from self._walk(directory / name, depth + 1)

    def runs(self) -> list[dict[str, Any]]:
        """Every directory that holds window directories, relative to the log dir, and how many."""
        found = []
        for directory, windows in self._walk(self.root, 0):
            run = directory.relative_to(self.root).as_posix()
            found.append({"run": run, "windows": len(windows)})
        return found

    def window_names(self, run: str) -> list[str]:
        listing = self.listing(self.inside(run))
        if listing is None:
            raise Refused(f"{run}: no such run")
        names = [d for d in listing.dirs if WINDOW_DIR.match(d)]
        return sorted(names, key=_window_order)

    # ---------------------------------------------------------------------------------- windows
    def workers(self, window_dir: Path) -> tuple[list[WorkerFiles], Listing | None]:
        listing = self.listing(window_dir)
        if listing is None:
            return [], None
        found: dict[tuple[str, int, str], dict[str, str]] = {}
        for name in listing.files:
            match = WORKER_FILE.match(name)
            if match is None:
                continue
            key = (match["worker"], int(match["rank"]), match["span"])
            kind = KINDS.get(match["kind"], "summary")
            if kind == "summary" and "summary" in found.get(key, {}) and name.endswith(".json"):
                continue  # both names of one summary (rewritten by a newer version): the .jsonc wins
            found.setdefault(key, {})[kind] = name
        workers = [
            WorkerFiles(worker=f"{w}_{r}", rank=r, span=s, **kinds) for (w, r, s), kinds in sorted(found.items())
        ]
        workers.sort(key=lambda f: (f.rank, f.worker, f.span))
        return workers, listing

    def read(self, path: Path) -> Summary:
        """A summary, bounded and schema-checked (``export/reading.read_summary``), cached by
        (path, mtime, size)."""
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            raise UnreadableFile(f"{path.name}: gone") from None
        key = (str(path), info.st_mtime_ns, info.st_size)
        summary = self.summaries.get(key)
        if summary is None:
            summary = read_summary(path, MemoryBudget())
            self.summaries.put(key, summary)
        return summary

    def row(self, run: str, name: str) -> dict[str, Any]:
        """What the list and the whole-run strip show of one window (its first rank's summary)."""
        window_dir = self.inside(f"{run}/{name}" if run not in ("", ".") else name)
        workers, listing = self.workers(window_dir)
        primary = next((w for w in workers if w.summary), None)
        key = None
        if primary is not None and listing is not None:
            size, mtime = listing.files[str(primary.summary)]
            key = (str(window_dir / str(primary.summary)), mtime, size)
            cached = self.rows.get(key)
            if cached is not None:
                return {**cached, "state": self._state(workers, listing)}
        match = WINDOW_DIR.match(name)
        row: dict[str, Any] = {
            "name": name,
            "run": run,
            "stage": (match["stage"] if match and match["stage"] else "fit"),
            "index": int(match["index"]) if match else None,
            "trigger": (match["reason"] if match and match["reason"] else "schedule"),
            "batches": [int(match["first"]), int(match["last"])] if match else None,
            "workers": len(workers),
        }
        if primary is not None and key is not None:
            try:
                summary = read_summary(Path(key[0]), MemoryBudget())
            except UnreadableFile as problem:
                row["error"] = str(problem)
            else:
                row.update(_row_of(summary))
            self.rows.put(key, row)
        return {**row, "state": self._state(workers, listing)}

    @staticmethod
    def _state(workers: list[WorkerFiles], listing: Listing | None) -> str:
        """The writer publishes a window's trace, then its memory snapshot, then its summary, each
        renamed into place from a dot-file; the trace keeps a hidden second name until training has
        the answer. So: writing (a dot-file is there, or a trace younger than ``WRITING_S`` waits
        for its summary); complete; no summary (``summary=False``, or the writer died); no trace
        (deleted since); empty."""
        if listing is None or not workers:
            return "writing" if listing is not None and listing.hidden else "empty"
        if listing.hidden:
            return "writing"
        if all(w.trace and w.summary for w in workers):
            return "complete"
        now = time.time_ns()
        waiting = [w.trace for w in workers if w.trace and not w.summary]
        if any(now - listing.files[name][1] < WRITING_S * 1e9 for name in waiting):
            return "writing"
        return "no summary" if waiting else "no trace"

    def page(self, run: str, offset: int, limit: int) -> dict[str, Any]:
        names = self.window_names(run)
        rows = [self.row(run, name) for name in names[offset : offset + limit]]
        return {"run": run, "total": len(names), "offset": offset, "windows": rows}

    def detail(self, run: str, name: str) -> dict[str, Any]:
        """Everything the window panel shows: each rank's summary (or why not), its files and sizes."""
        if not WINDOW_DIR.match(name):
            raise Refused(f"{name}: not a window directory")
        relative = f"{run}/{name}" if run not in ("", ".") else name
        window_dir = self.inside(relative)
        workers, listing = self.workers(window_dir)
        if listing is None:
            raise Refused(f"{relative}: no such window")
        ranks = []
        for w in workers:
            entry: dict[str, Any] = {"worker": w.worker, "rank": w.rank, "span": w.span}
            if w.trace:
                entry["trace"] = _file_entry(relative, w.trace, listing.files[w.trace][0], window_dir / w.trace)
            if w.memory:
                entry["memory"] = _file_entry(relative, w.memory, listing.files[w.memory][0])
            if w.memory_view:
                entry["memory_view"] = memory_view(window_dir / w.memory_view)
            if w.summary:
                try:
                    summary = self.read(window_dir / w.summary)
                except UnreadableFile as problem:
                    entry["error"] = str(problem)
                else:
                    entry["summary"] = {k: v for k, v in summary.items() if not k.startswith("_")}
                    entry["perfetto_range"] = perfetto_range(summary)
                    entry["job_range"] = perfetto_range(summary, job=True)
                    entry["sources"] = source_states(summary)
                    job = summary.get("job")
                    if isinstance(job, dict) and isinstance(job.get("file"), str):
                        entry["job"] = self._job_file(relative, window_dir, job["file"])
            ranks.append(entry)
        return {"run": run, "name": name, "state": self._state(workers, listing), "ranks": ranks}

    def _job_file(self, relative: str, window_dir: Path, name: str) -> dict[str, Any] | None:
        parts = name.split("/")
        if len(parts) != 2 or parts[0] != JOB_DIR or not parts[1].endswith(JOB_SUFFIX) or parts[1].startswith("."):
            return None
        try:
            path = self.inside(f"{relative}/{name}")
            size = os.stat(path).st_size if stat.S_ISREG(os.stat(path).st_mode) else None
        except (Refused, OSError):
            return None
        return _file_entry(relative, name, size, path) if size is not None else None

    # ---------------------------------------------------------------------------------- files
    def servable(self, relative: str) -> Path:
        """A file the tab may hand to the browser: a window's trace, memory snapshot or job file,
        under the log dir after resolving symlinks; Refused otherwise."""
        parts = safe_parts(relative)
        name = parts[-1] if parts else ""
        in_job = len(parts) >= 3 and parts[-2] == JOB_DIR and WINDOW_DIR.match(parts[-3])
        in_window = len(parts) >= 2 and WINDOW_DIR.match(parts[-2])
        ours = (in_window and name.endswith((TRACE_SUFFIX, MEMORY_SUFFIX))) or (
            in_job and name.endswith(JOB_SUFFIX) and not name.endswith(JOB_SUMMARY_SUFFIX)
        )
        if not ours:
            raise Refused(f"{relative}: not a file vt_lightning wrote")
        return self.inside(relative)


def source_states(summary: Summary) -> dict[str, str]:
    """Whether each file whose lines the summary recorded is still as it was: ``same``, ``changed``
    (the tab shows the lines as recorded and says so) or ``not here``. A stat (``changed_since``),
    never a read: the tab shows no line it did not get from the summary."""
    sources = summary.get("sources")
    files = sources.get("files") if isinstance(sources, dict) else None
    states = {"": "same", NOT_HERE: "not here"}
    return {
        name: states.get(changed_since(name, recorded) or "", "changed") if isinstance(recorded, dict) else "changed"
        for name, recorded in (files.items() if isinstance(files, dict) else ())
    }


def memory_view(path: Path) -> dict[str, Any]:
    """A window's memory view (the curve, the peak and the sites live at it, a few KB the writer
    computed), or ``{"error": why}``: bounded, a regular file, a JSON object of schema 1."""
    try:
        with open_regular(path) as f:
            raw = f.read(MEMORY_VIEW_MAX_BYTES + 1)
        view = orjson.loads(raw) if len(raw) <= MEMORY_VIEW_MAX_BYTES else None
    except (UnreadableFile, OSError, orjson.JSONDecodeError) as problem:
        return {"error": f"{path.name}: not readable ({problem})"}
    if not isinstance(view, dict) or view.get("schema") != 1 or not isinstance(view.get("devices"), dict):
        return {"error": f"{path.name}: not a memory view this version reads"}
    return view


def _file_entry(relative: str, name: str, size: int | None, path: Path | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": f"{relative}/{name}", "bytes": size}
    if path is not None and name.endswith(".gz"):
        entry["json_bytes"] = gzip_inflated_size(path, size)
    return entry


def gzip_inflated_size(path: Path, size: int | None) -> int | None:
    """The inflated size a gzip file states in its last 4 bytes (modulo 4 GiB; None when that is
    plainly wrapped or unreadable): what a browser would have to load, without inflating it."""
    if not size or size < 18:
        return None
    try:
        with open_regular(path) as f:
            f.seek(size - 4)
            stated = int.from_bytes(f.read(4), "little")
    except (UnreadableFile, OSError):
        return None
    return stated if stated >= size // 2 else None  # JSON compresses 5-20x: smaller means it wrapped


def _window_order(name: str) -> tuple[Any, ...]:
    match = WINDOW_DIR.match(name)
    if match is None:
        return (1, name)
    return (0, match["stage"] or "", int(match["index"]), int(match["copy"] or 0), name)


def _row_of(summary: Summary) -> dict[str, Any]:
    step = summary.get("step_ms") or {}
    verdicts = [
        {"kind": v.get("kind"), "share": (v.get("evidence") or {}).get("share")} for v in summary.get("verdicts") or []
    ]
    window = summary.get("window") or {}
    return {
        "step_mean_ms": step.get("mean"),
        "step_p50_ms": step.get("p50"),
        "step_min_ms": step.get("min"),
        "step_max_ms": step.get("max"),
        "recorded": len((summary.get("steps") or {}).get("recorded") or []),
        "partial": bool(window.get("partial")),
        "verdicts": verdicts[:3],
        "job": bool(summary.get("job")),
        "compiled": bool(summary.get("compile")),
    }


def summary_files(index: LogIndex, relative: str) -> Iterator[Path]:
    """The summaries (first name of each, see ``summary_stem``) of one window or of every window of
    one run, for ``diff``; all found through the index, so none is outside the log dir."""
    parts = safe_parts(relative)
    if parts and WINDOW_DIR.match(parts[-1]):
        dirs = [index.inside(relative)]
    else:
        dirs = [index.inside(relative) / name for name in index.window_names(relative)]
    for window_dir in dirs:
        workers, _ = index.workers(window_dir)
        for w in workers:
            if w.summary and summary_stem(w.summary) is not None and w.summary.endswith(SUMMARY_JSON_SUFFIX):
                yield window_dir / w.summary
