"""The user's source lines as they were when the window was written: the writer records the lines
around every place a summary names (``sources``), so the tab and ``vt-lightning summary`` show
those and never read a file a summary names; they say when the file on disk changed since."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from vt_lightning.analysis.schema import SourceFile, Sources, Summary
from vt_lightning.export.reading import UnreadableFile, open_regular

CONTEXT = 4  # lines kept each side of a named line
NOT_HERE = "not on this machine: lines as recorded"
CHANGED = "changed since this window: lines as they were"
MAX_FILE_BYTES = 4 << 20  # a larger file is no source file worth keeping lines of
MAX_LINE_CHARS = 240
MAX_TOTAL_CHARS = 64 << 10  # over every file of one summary


def named_places(summary: Summary) -> set[tuple[str, int]]:
    """Every (file, line) of the user's code a summary names: its verdicts, its user functions,
    compiled functions and graph breaks, the job's straggler and the memory sites at the peak."""
    places: set[tuple[str, int]] = set()

    def add(entry: Any) -> None:
        if isinstance(entry, Mapping) and isinstance(entry.get("file"), str) and isinstance(entry.get("line"), int):
            places.add((entry["file"], entry["line"]))

    for verdict in summary.get("verdicts") or []:
        for where in verdict.get("where") or []:
            add(where)
    top = summary.get("top_python") or {}
    for entry in [*(top.get("by_self") or []), *(top.get("by_inclusive") or [])]:
        if entry.get("origin") == "user":
            add(entry)
    compiled: Mapping[str, Any] = summary.get("compile") or {}
    for key in ("functions", "graph_breaks", "recompiles"):
        for entry in compiled.get(key) or []:
            add(entry)
    job = summary.get("job")
    add(job.get("straggler") if job else None)
    memory = summary.get("memory")
    for site in (memory.get("top_sites_at_peak") if memory else None) or []:
        if site.get("origin") == "user":
            add(site)
    return places


def record_sources(places: Iterable[tuple[str, int]]) -> Sources:
    """The lines around each place, per file, with the file's stat to tell a later edit."""
    wanted: dict[str, set[int]] = defaultdict(set)
    for file, line in places:
        wanted[file].update(range(max(1, line - CONTEXT), line + CONTEXT + 1))
    files: dict[str, SourceFile] = {}
    total, truncated = 0, False
    for file in sorted(wanted):
        try:
            with open_regular(file) as f:
                data = f.read(MAX_FILE_BYTES + 1)
                st = os.fstat(f.fileno())
        except (UnreadableFile, OSError) as problem:
            files[file] = {"error": str(problem)}
            continue
        if len(data) > MAX_FILE_BYTES:
            files[file] = {"error": f"larger than {MAX_FILE_BYTES >> 20} MiB"}
            continue
        text = data.decode("utf-8", "replace").splitlines()
        lines = {str(n): text[n - 1][:MAX_LINE_CHARS] for n in sorted(wanted[file]) if n <= len(text)}
        total += sum(map(len, lines.values()))
        if total > MAX_TOTAL_CHARS:
            truncated = True
            break
        files[file] = {
            "mtime_ns": st.st_mtime_ns,
            "size": st.st_size,
            "lines": lines,
        }
    return {"files": files, "truncated": truncated}


def changed_since(file: str, recorded: SourceFile) -> str | None:
    """Why the file on disk may no longer hold the recorded lines (None: same mtime and size). A stat,
    never a read: the tab, which anyone who can write the log dir may point at any file, learns
    nothing of a file's content from it."""
    try:
        st = os.stat(file)
    except (OSError, ValueError):
        return NOT_HERE
    return None if (st.st_mtime_ns, st.st_size) == (recorded.get("mtime_ns"), recorded.get("size")) else CHANGED


def excerpt_lines(summary: Summary, context: int = 2) -> list[str]:
    """``vt-lightning summary``'s excerpt of each verdict's places, from the recorded lines."""
    sources = summary.get("sources")
    files = sources["files"] if sources else {}
    out: list[str] = []
    for verdict in summary.get("verdicts") or []:
        for where in verdict.get("where") or []:
            file, line = where.get("file"), where.get("line")
            if not isinstance(file, str) or not isinstance(line, int):
                continue
            recorded = files.get(file)
            if recorded is None or "lines" not in recorded:
                why = (recorded or {}).get("error") or "no recorded lines (written by an older version)"
                out.append(f"{verdict.get('kind')}: {where.get('function')} ({file}:{line}): {why}")
                continue
            note = changed_since(file, recorded)
            out.append(
                f"{verdict.get('kind')}: {where.get('function')} ({file}:{line})" + (f" [{note}]" if note else "")
            )
            for n in range(line - context, line + context + 1):
                if str(n) in recorded["lines"]:
                    out.append(f"  {'>' if n == line else ' '}{n:5d} | {recorded['lines'][str(n)]}")
    return out
