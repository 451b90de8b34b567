"""Output roots that are URLs (``s3://…``, ``memory://…``), through Lightning's ``get_filesystem``.
The writer process writes a window into local staging; the training process's writer thread copies
it, as filesystems and credentials set up in the user's process are invisible to the writer process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.cloud_io import _is_object_storage, get_filesystem

from vt_lightning.controller.agreement import first_failure
from vt_lightning.controller.inbox import Dropped, Notice, Outcome
from vt_lightning.controller.messages import GOES_ON, say
from vt_lightning.export.job import URL, UnusableURL, WindowJob, WindowResult, locate
from vt_lightning.export.job_file import JOB_DIR, JOB_EXTRA, MAX_JOB_WAIT_S, span_of, wait_for_ranks
from vt_lightning.export.layout import host_name
from vt_lightning.export.pipeline import add_job, delivered, run_dir_candidates
from vt_lightning.options import ConfigurationError
from vt_lightning.recording.spool import PREFIX, default_spool_base

CHUNK_BYTES = 8 << 20  # an object store's multipart uploads take parts of at least 5 MiB


class OutputRootError(ConfigurationError):
    """The output root is a URL whose filesystem cannot be used from this process."""


def output_root(
    dirpath: str | None, log_dir: str | None, default_root_dir: str, spool_dir: str | None = None
) -> tuple[Path, URL | None]:
    """(absolute local root, remote root or None) of ``dirpath``, else the logger's log dir, else
    ``default_root_dir``; a URL gets local staging once its filesystem answered (``OutputRootError``)."""
    if dirpath is not None:
        where, source = str(dirpath), "`dirpath`"
    elif log_dir:
        where, source = str(log_dir), "the logger's log dir"
    else:
        where, source = str(default_root_dir), "the Trainer's `default_root_dir`"
    problem: OutputRootError | None = None
    try:
        place = locate(where)  # the rule the vt-lightning command reads its arguments by
    except UnusableURL as err:
        problem = _unusable(where, source, err.cause)
    else:
        if isinstance(place, Path):
            # Absolute now: a later ``os.chdir`` in the user's code moves no file, as with Lightning's.
            return place.absolute(), None
        try:
            _check_filesystem(get_filesystem(place), place, source)
        except OutputRootError as err:
            problem = err
    failed = first_failure(str(problem) if problem is not None else None)  # collective under DDP
    if failed is not None:
        rank, message = failed
        stop = OutputRootError(message if rank == 0 else f"{message} (found on rank {rank}; every rank stops)")
        raise stop from problem
    remote = URL(place)
    if not _is_object_storage(get_filesystem(remote)):
        say(f"vt_lightning: {no_overwrite_guarantee(remote, object_store=False)}.")
    base = Path(spool_dir) if spool_dir is not None else Path(default_spool_base())
    # Made when the first window is written (a rank that records nothing leaves nothing behind);
    # the random part keeps the name unguessable in a shared temp directory.
    return base / f"{PREFIX}{host_name()}-{os.getpid()}-{secrets.token_hex(8)}", remote


def _check_filesystem(fs: Any, remote: URL, source: str) -> None:
    """Ask once: a store that refuses us is an error at setup, not a warning per window."""
    try:
        if _is_object_storage(fs):
            fs.exists(remote)  # object stores have no directories to create
        else:
            fs.makedirs(remote, exist_ok=True)
    except Exception as err:  # any error of the user's filesystem is the refusal's cause
        raise _unusable(remote, source, err) from err


def _unusable(where: str, source: str, err: Exception) -> OutputRootError:
    return OutputRootError(
        f"vt_lightning writes its window directories to {source}, {where}, which it cannot use here "
        f"({type(err).__name__}: {err}). Install what that filesystem needs, or set `dirpath` to a "
        "local directory: VizTraceCallback(dirpath=...)."
    )


def deliver(job: WindowJob, result: WindowResult, in_writer: Callable[[Callable[[], Any]], Any]) -> Outcome:
    """On the writer thread: release the window's claim and, for a remote root, copy its files there
    (rank 0 of a job: then the job file, made by ``in_writer``)."""
    delivered(job, result)
    if job.publish_to is None:
        return result
    staged = Path(result.trace_path).parent
    if JOB_EXTRA in job.extras:
        result = with_job(job, result, staged, in_writer)
    try:
        published = publish(job, result, staged)
    except Exception as err:  # any error of the user's filesystem drops this window with one notice
        root = URL(job.publish_to).parent
        return Dropped(
            Notice(
                f"publish:{type(err).__name__}:{root}",
                f"vt_lightning: could not copy the window to {job.publish_to} ({type(err).__name__}: {err}); "
                f"its files are kept in {staged} (scratch space, removed by a later run once this process has "
                f"exited); {GOES_ON}",
            )
        )
    shutil.rmtree(staged, ignore_errors=True)
    with contextlib.suppress(OSError):
        staged.parent.rmdir()  # the staging root, once empty (the next window makes it again)
    return published


def publish(job: WindowJob, result: WindowResult, staged: Path) -> WindowResult:
    """Copy ``staged``'s files to the first remote run directory free of this trace's name, the trace
    last (a reader that sees it finds the rest), never over another run's file (docs/files.md)."""
    assert job.publish_to is not None
    first = URL(job.publish_to)
    fs = get_filesystem(first)
    job_dir = staged / JOB_DIR  # rank 0's job file, when it made one (``with_job``)
    job_files = [f"{JOB_DIR}/{name}" for name in sorted(os.listdir(job_dir))] if job_dir.is_dir() else []
    names = sorted(
        (e.name for e in os.scandir(staged) if e.is_file(follow_symlinks=False) and not e.name.startswith(".")),
        key=lambda name: name == job.trace_name,
    )
    names[-1:-1] = job_files  # before the trace: a reader that sees it finds the rest
    upload = Upload(fs, _is_object_storage(fs), job.job_id)
    for candidate in run_dir_candidates(first):
        target = URL(candidate)
        if fs.exists(target / job.trace_name) or fs.isfile(target):
            continue
        fs.makedirs(target / JOB_DIR if job_files else target, exist_ok=True)
        try:
            upload.all(staged, names, target)
        except FileExistsError:  # another run took this name after the check: the next name
            continue
        break
    else:
        raise FileExistsError(f"every run directory named {first.name}[.N] holds a {job.trace_name}")
    notes = result.notes
    if target != first:
        notes = (
            *notes,
            f"run directory already taken ({first} holds another run's {job.trace_name}); this window "
            f"went to {target.name}",
        )
    if upload.whole_objects and not upload.exclusive:
        notes = (*notes, no_overwrite_guarantee(first.parent, object_store=True))

    def moved(path: Any) -> URL | None:
        return target / Path(path).name if path is not None else None

    return dataclasses.replace(
        result,
        trace_path=target / job.trace_name,
        memory_path=moved(result.memory_path),
        summary_path=moved(result.summary_path),
        notes=notes,
    )


def with_job(
    job: WindowJob, result: WindowResult, staged: Path, in_writer: Callable[[Callable[[], Any]], Any]
) -> WindowResult:
    """Rank 0 on a remote root, before its window is published: the other ranks' traces of the
    window, fetched from the store once all are there (within the run's job wait), and the job file
    and summary that ``in_writer`` makes of them in ``staged`` (``pipeline.add_job``). A fault is a
    note: the window is published without a job file."""
    target = URL(job.publish_to)
    sync = job.extras[JOB_EXTRA]
    world = int(sync.get("world_size") or 1)
    wait_s = min(float(sync.get("job_wait_s", MAX_JOB_WAIT_S)), MAX_JOB_WAIT_S)
    fs = get_filesystem(target)

    def listed() -> list[str]:
        fs.invalidate_cache(target)  # a store's listing is cached: each poll asks it again
        try:
            return [str(path).rstrip("/").rpartition("/")[2] for path in fs.ls(target, detail=False)]
        except FileNotFoundError:  # no rank's file there yet
            return []

    try:
        names = wait_for_ranks(listed, span_of(job.trace_name), world, wait_s)
        missing = sorted(set(range(1, world)) - set(names))
        if missing:
            note = f"no job file for {target.name} (rank(s) {missing} wrote no trace of it within {wait_s:.0f} s)"
            return dataclasses.replace(result, notes=(*result.notes, note))
        with tempfile.TemporaryDirectory(prefix=".ranks-", dir=staged.parent) as fetched:
            for rank, name in names.items():
                if rank:
                    fs.get_file(target / name, os.path.join(fetched, name))
            info, notes, summary, markdown = in_writer(partial(add_job, job, staged, Path(fetched), result.summary))
    except Exception as err:  # any error of the user's filesystem or the merge: no job file, one note
        return dataclasses.replace(result, notes=(*result.notes, f"job file not written ({type(err).__name__}: {err})"))
    if info is None:
        return dataclasses.replace(result, notes=(*result.notes, *notes))
    return dataclasses.replace(
        result, job=info, summary=summary, summary_markdown=markdown, notes=(*result.notes, *notes)
    )


def no_overwrite_guarantee(root: URL, object_store: bool) -> str:
    """The note of a remote root where a name is checked to be free, not claimed atomically."""
    if object_store:
        because = (
            'cannot create a file only if its name is free (fsspec\'s "xb" mode; for s3:// an s3fs >= '
            "2024.12 and a store that honours If-None-Match), so"
        )
    else:
        because = (
            "has no atomic create-if-absent or exclusive move, so each window's files are moved to their "
            "names after a check that the names are free, and"
        )
    return (
        f"no overwrite is checked, not guaranteed, under {root}: its filesystem {because} two runs writing "
        "the same window name there at the same moment could overwrite each other's files. Give each run "
        "its own directory to be sure"
    )


class Upload:
    """One window's files into one remote run directory, never over a file already there."""

    def __init__(self, fs: Any, whole_objects: bool, job_id: str) -> None:
        self.fs = fs
        self.whole_objects = whole_objects
        self.job_id = job_id
        self.exclusive = whole_objects  # until the store refuses "xb"; elsewhere a checked move

    def all(self, staged: Path, names: list[str], target: URL) -> None:
        """Every name, in order; on one taken meanwhile, removes what it made and raises FileExistsError."""
        created: list[URL] = []
        try:
            for name in names:
                self.one(staged / name, target / name)
                created.append(target / name)
        except FileExistsError:
            for url in created:
                try:
                    self.fs.rm_file(url)
                except Exception:  # best-effort cleanup of our own uploads; the name clash is re-raised
                    pass
            raise

    def one(self, local: Path, remote: URL) -> None:
        """No reader sees half a file: an object exists once uploaded; elsewhere a temporary is moved."""
        fs = self.fs
        if self.whole_objects and self.exclusive:
            try:
                with open(local, "rb") as source, fs.open(remote, "xb") as out:
                    shutil.copyfileobj(source, out, CHUNK_BYTES)
                return
            except (NotImplementedError, ValueError, TypeError):  # an fsspec/s3fs without "xb"
                self.exclusive = False
        if fs.exists(remote):
            raise FileExistsError(errno.EEXIST, "File exists", str(remote))
        if self.whole_objects:
            fs.put_file(str(local), remote)
            return
        temporary = remote.with_name(f".{remote.name}.{self.job_id or 'upload'}.tmp")
        fs.put_file(str(local), temporary)
        try:
            if fs.exists(remote):
                raise FileExistsError(errno.EEXIST, "File exists", str(remote))
            fs.mv(temporary, remote)
        except BaseException:  # cleanup: the temporary goes whatever stopped the move; re-raised
            try:
                fs.rm(temporary)
            except Exception:  # best-effort cleanup; the original error is re-raised
                pass
            raise
