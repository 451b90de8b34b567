"""Output roots that are URLs (``s3://…``, ``gs://…``, ``memory://…``): Lightning's loggers write
there through fsspec, and so do we.

A window is still written locally first, by the writer process, into a private staging directory
(named like a spool directory, so a crashed run's staging is cleaned up like its spool). Then the
training process's writer thread copies the run directory into the remote root, with the same
names and layout, through the filesystem Lightning itself uses (``get_filesystem``). The copy runs
in the training process on purpose: filesystems and credentials configured in the user's process
(and in-process ones like ``memory://``) are invisible to the writer process, a fresh
``python -I``; and copying is I/O, which releases the GIL. It runs on the writer thread, so it
never holds up training, and the writer's time limit (``writer_timeout``) bounds it too.

A URL whose filesystem cannot be used (``s3fs`` not installed, an unknown protocol, a store that
refuses us) is an error at setup that says to set ``dirpath``; ``Path()`` is never given a URL, so
no local directory named ``s3:`` appears.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from vt_lightning.controller.inbox import Dropped, Notice, Outcome
from vt_lightning.export.job import URL, WindowJob, WindowResult
from vt_lightning.export.layout import host_name
from vt_lightning.export.pipeline import delivered, run_dir_candidates
from vt_lightning.recording.spool import PREFIX, default_spool_base

_LOCAL_SCHEME = re.compile(r"^(file|local):", re.IGNORECASE)  # fsspec's names of the local filesystem


class OutputRootError(ValueError):
    """The output root is a URL whose filesystem cannot be used from this process."""


def output_root(
    dirpath: str | None, log_dir: str | None, default_root_dir: str, spool_dir: str | None = None
) -> tuple[Path, URL | None]:
    """(local root this process writes window directories to, absolute; remote root or None).

    The root is ``dirpath``, else the logger's log dir, else ``default_root_dir``. A ``file://``
    URL is its local path. Any other URL gets a local staging root under the spool base and is
    returned as the remote root, once its filesystem has answered (``OutputRootError`` if not)."""
    if dirpath is not None:
        where, source = str(dirpath), "`dirpath`"
    elif log_dir:
        where, source = str(log_dir), "the logger's log dir"
    else:
        where, source = str(default_root_dir), "the Trainer's `default_root_dir`"
    if "://" not in where and not _LOCAL_SCHEME.match(where):
        # Absolute now, at setup: every file goes here whatever the working directory becomes later
        # (an ``os.chdir`` in the user's code), as Lightning's own files do.
        return Path(where).absolute(), None
    from lightning.fabric.utilities.cloud_io import get_filesystem

    try:
        fs = get_filesystem(where)
    except Exception as err:  # ImportError (s3fs missing), ValueError (unknown protocol)
        raise _unusable(where, source, err) from err
    if {"file", "local"} & set(_protocols(fs)):
        return Path(fs._strip_protocol(where)).absolute(), None
    remote = URL(where.rstrip("/"))
    _check_filesystem(fs, remote, source)
    base = Path(spool_dir) if spool_dir is not None else Path(default_spool_base())
    # Made when the first window is written (a rank that records nothing leaves nothing behind);
    # the random part keeps the name unguessable in a shared temp directory.
    return base / f"{PREFIX}{host_name()}-{os.getpid()}-{secrets.token_hex(8)}", remote


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _check_filesystem(fs: Any, remote: URL, source: str) -> None:
    """Ask the filesystem once for the root: a store that refuses us is an error now, at setup,
    not a warning per window later."""
    from lightning.fabric.utilities.cloud_io import _is_object_storage

    try:
        if _is_object_storage(fs):
            fs.exists(remote)  # object stores have no directories to create
        else:
            fs.makedirs(remote, exist_ok=True)
    except Exception as err:
        raise _unusable(remote, source, err) from err


def _unusable(where: str, source: str, err: Exception) -> OutputRootError:
    return OutputRootError(
        f"vt_lightning writes its window directories to {source}, {where}, which it cannot use here "
        f"({type(err).__name__}: {err}). Install what that filesystem needs, or set `dirpath` to a "
        "local directory: VizTraceCallback(dirpath=...)."
    )


def deliver(job: WindowJob, result: WindowResult) -> Outcome:
    """On the training process's writer thread, once the writer answered: release the window's
    claim and, for a remote root, copy its run directory there. A failed copy drops the window with
    one notice and leaves its files in the staging directory."""
    delivered(job, result)
    if job.publish_to is None:
        return result
    staged = Path(result.trace_path).parent
    try:
        published = publish(job, result, staged)
    except Exception as err:
        root = URL(job.publish_to).parent
        return Dropped(
            Notice(
                f"publish:{type(err).__name__}:{root}",
                f"vt_lightning: could not copy the window to {job.publish_to} ({type(err).__name__}: {err}); "
                f"its files are kept in {staged} (scratch space, removed by a later run once this process has "
                "exited); training goes on, and later windows that fail the same way are not reported again.",
            )
        )
    shutil.rmtree(staged, ignore_errors=True)
    try:
        staged.parent.rmdir()  # the staging root, once empty (the next window makes it again)
    except OSError:
        pass
    return published


def publish(job: WindowJob, result: WindowResult, staged: Path) -> WindowResult:
    """Copy ``staged``'s files (not the hidden claims and temporaries) to the first remote run
    directory that does not hold this window's trace name; the trace goes last, so a reader that
    sees it finds the rest. Returns the result with the files' URLs."""
    from lightning.fabric.utilities.cloud_io import _is_object_storage, get_filesystem

    assert job.publish_to is not None
    first = URL(job.publish_to)
    fs = get_filesystem(first)
    target = _free_run_dir(fs, first, job.trace_name)
    names = sorted(
        (e.name for e in os.scandir(staged) if e.is_file(follow_symlinks=False) and not e.name.startswith(".")),
        key=lambda name: name == job.trace_name,
    )
    whole_objects = _is_object_storage(fs)
    for name in names:
        _upload(fs, staged / name, target / name, whole_objects, job.job_id)
    notes = result.notes
    if target != first:
        notes = (
            *notes,
            f"run directory already taken ({first} holds another run's {job.trace_name}); this window "
            f"went to {target.name}",
        )

    def moved(path: Any) -> URL | None:
        return target / Path(path).name if path is not None else None

    return dataclasses.replace(
        result,
        trace_path=target / job.trace_name,
        memory_path=moved(result.memory_path),
        summary_path=moved(result.summary_path),
        notes=notes,
    )


def _free_run_dir(fs: Any, first: URL, trace_name: str) -> URL:
    for candidate in run_dir_candidates(first):
        if fs.exists(candidate / trace_name) or fs.isfile(candidate):
            continue
        fs.makedirs(candidate, exist_ok=True)
        return URL(candidate)
    raise FileExistsError(f"every run directory named {first.name}[.N] holds a {trace_name}")


def _upload(fs: Any, local: Path, remote: URL, whole_objects: bool, job_id: str) -> None:
    """An object store shows an object only once its upload completed; elsewhere the file is
    uploaded under a hidden temporary name and renamed, so no reader sees half a file."""
    if whole_objects:
        fs.put_file(str(local), remote)
        return
    temporary = remote.with_name(f".{remote.name}.{job_id or 'upload'}.tmp")
    fs.put_file(str(local), temporary)
    try:
        fs.mv(temporary, remote)
    except BaseException:
        try:
            fs.rm(temporary)
        except Exception:
            pass
        raise
