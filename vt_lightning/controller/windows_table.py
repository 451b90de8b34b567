"""Every window's row of the end-of-run table, as a JSON line in the spool rather than in memory."""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import orjson
from lightning.fabric.utilities.cloud_io import _is_object_storage, get_filesystem

from vt_lightning.analysis.history import RunHistory, WindowRow
from vt_lightning.constants import LOGGER_NAME
from vt_lightning.export.atomic import atomic_write
from vt_lightning.export.job import URL
from vt_lightning.export.report import write_full_table
from vt_lightning.export.terminal import printable

log = logging.getLogger(LOGGER_NAME)

FULL_TABLE_NAME = "vt_lightning.windows.txt"
JOURNAL_NAME = "windows.jsonl"
TITLE = "vt_lightning: "  # the first line of each run's section


class WindowsTable:
    """Rows appended to a journal in the spool; ``write`` renders them all into the output root."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.path = os.path.join(os.fspath(spool_dir), JOURNAL_NAME)
        self.broken = False  # a failed append: the full table would miss rows, so none is written

    def append(self, row: WindowRow) -> None:
        if self.broken:
            return
        try:
            with open(self.path, "ab") as f:
                f.write(orjson.dumps(row.to_json()) + b"\n")
        except Exception as err:  # scratch space full or gone: the console table still works
            self.broken = True
            log.warning("vt_lightning: the full window table will not be written (%s)", printable(err))

    def rows(self) -> Iterator[WindowRow]:
        try:
            with open(self.path, "rb") as f:
                for line in f:
                    yield WindowRow.from_json(orjson.loads(line))
        except FileNotFoundError:
            return

    def write(self, root: Any, stage: str | None, history: RunHistory, span: tuple[int, int] = (0, 0)) -> str | None:
        """This run's section after the earlier runs' (each fit of a resumed job has one) into ``root``
        (a Path or a URL), atomically: one read and one write per run. Its location, or None."""
        if self.broken or root is None or not history.first:  # no rows: summary=False
            return None
        stage = stage or "fit"
        name = FULL_TABLE_NAME if stage == "fit" else f"{stage}-{FULL_TABLE_NAME}"
        target = root / name if isinstance(root, URL) else os.path.join(os.fspath(root), name)
        try:
            earlier = _read(target)
            number = sum(line.startswith(TITLE) for line in earlier.splitlines()) + 1
            first, batches = span
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            text = io.StringIO()
            text.write(f"{earlier}\n" if earlier else "")
            text.write(f"{TITLE}{stage} {number} ({when}, batches {first}-{first + batches - 1}): ")
            text.write(f"all {history.count} windows of this run (ms per step)")
            if history.deleted:
                text.write(f"; {history.deleted} of them deleted from disk by keep_windows")
            text.write("\n")
            write_full_table(history, self.rows(), text)
            data = text.getvalue().encode()
            if isinstance(target, URL):
                return _write_remote(target, data)
            atomic_write(target, data)
            return target
        except Exception as err:  # never fails the run
            log.warning(
                "vt_lightning: could not write the full window table to %s (%s)", printable(root), printable(err)
            )
            return None


def _read(target: str | URL) -> str:
    """The table earlier runs wrote into this root ("" for none)."""
    try:
        if isinstance(target, URL):
            return bytes(get_filesystem(target).cat_file(str(target))).decode()
        with open(target, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _write_remote(target: URL, data: bytes) -> str:
    """Through the filesystem Lightning uses; a hidden temporary, then a move."""
    fs = get_filesystem(target)
    if _is_object_storage(fs):
        fs.pipe_file(target, data)
        return str(target)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fs.pipe_file(temporary, data)
    fs.mv(temporary, target)
    return str(target)
