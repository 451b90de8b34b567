"""Summaries for people and scripts: file names, markdown, console tables, finding them on disk.

Pure rendering and reading; computing a summary is ``summary.py``, writing it is ``finish.py``.
Console tables use rich when it is installed and plain text otherwise (see ``print_table``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from vt_lightning.analysis.schema import Summary
from vt_lightning.export.reading import MemoryBudget, SummaryNotFound, is_regular_file, read_summary
from vt_lightning.export.terminal import printable

TRACE_SUFFIX = ".pt.trace.json.gz"  # as output.TRACE_SUFFIX; kept here so readers import no writer code
SUMMARY_JSON_SUFFIX = ".summary.json"
SUMMARY_MD_SUFFIX = ".summary.md"
PART_LABELS = {
    "data_wait": "data wait",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
}


def summary_names(trace_name: str) -> tuple[str, str]:
    """``host_0.0000000002.pt.trace.json.gz`` -> (``host_0.0000000002.summary.json``, ``... .md``)."""
    stem = trace_name[: -len(TRACE_SUFFIX)] if trace_name.endswith(TRACE_SUFFIX) else trace_name.split(".pt.trace")[0]
    return stem + SUMMARY_JSON_SUFFIX, stem + SUMMARY_MD_SUFFIX


def encode_summary(summary: Summary) -> bytes:
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"


# --------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------


def _num(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _where(entry: Mapping[str, Any]) -> str:
    if entry.get("folded"):
        return f"{entry['folded']} functions"
    if entry.get("file"):
        return f"{os.path.basename(str(entry['file']))}:{entry.get('line')}"
    return entry.get("origin") or ""


def window_title(summary: Summary) -> str:
    window = summary.get("window") or {}
    recorded = (summary.get("steps") or {}).get("recorded") or []
    steps = f"batches {recorded[0]}-{recorded[-1]}" if recorded else "no steps"
    return f"window {window.get('index')} ({steps}, {window.get('worker')})"


def render_markdown(summary: Summary, top: int = 5) -> str:
    """A short report of one window: step time, breakdown, top Python, top ops, GPU, memory."""
    steps = summary.get("steps") or {}
    step = summary.get("step_ms") or {}
    mean = step.get("mean") or 0.0
    lines = [f"### vt_lightning {window_title(summary)}", ""]
    counted = steps.get("counted") or []
    lines.append(
        f"Step time: mean **{_num(step.get('mean'))} ms**, p50 {_num(step.get('p50'))} ms, "
        f"max {_num(step.get('max'))} ms over batches {', '.join(map(str, counted)) or '–'} "
        f"(breakdown from {steps.get('breakdown_source', '?')})."
    )
    lines += ["", "| part | ms/step | share |", "|---|---:|---:|"]
    for part, ms in (summary.get("breakdown_ms") or {}).items():
        share = f"{100 * ms / mean:.0f}%" if mean else "–"
        lines.append(f"| {PART_LABELS.get(part, part)} | {_num(ms)} | {share} |")
    python = (summary.get("top_python") or {}).get("by_inclusive") or []
    if python:
        lines += [
            "",
            "| Python function (user code first) | where | incl. ms/step | self ms/step | calls |",
            "|---|---|---:|---:|---:|",
        ]
        for entry in python[: top * 2]:
            lines.append(
                f"| `{entry['function']}` | {_where(entry)} | {_num(entry['inclusive_ms'], 2)} | "
                f"{_num(entry['self_ms'], 2)} | {entry['calls']} |"
            )
    ops = (summary.get("top_ops") or {}).get("by_cpu") or []
    if ops:
        lines += ["", "| torch op | self CPU ms/step | CPU ms/step | calls |", "|---|---:|---:|---:|"]
        for op in ops[:top]:
            lines.append(f"| `{op['name']}` | {_num(op['self_cpu_ms'], 2)} | {_num(op['cpu_ms'], 2)} | {op['calls']} |")
    kernel_ops = (summary.get("top_ops") or {}).get("by_kernel") or []
    if kernel_ops:
        lines += ["", "| torch op | kernel ms/step | kernels |", "|---|---:|---:|"]
        for by_op in kernel_ops[:top]:
            lines.append(f"| `{by_op['name']}` | {_num(by_op['kernel_ms'], 2)} | {by_op['kernels']} |")
    gpu = summary.get("gpu")
    if gpu:
        lines += ["", f"GPU busy **{_num(gpu['busy_percent'])}%** of {_num(gpu['wall_ms'])} ms."]
        if gpu.get("idle_gaps"):
            lines += ["", "| GPU idle gap | ms | training thread was in | user code |", "|---|---:|---|---|"]
            for i, gap in enumerate(gpu["idle_gaps"][:top], 1):
                lines.append(
                    f"| {i} | {_num(gap['ms'], 2)} | `{gap.get('python') or '–'}` | `{gap.get('user_python') or '–'}` |"
                )
    memory = summary.get("memory")
    if memory:
        reserved = memory.get("peak_reserved_mb")
        lines += [
            "",
            f"Memory peak: **{_num(memory.get('peak_allocated_mb'))} MB** allocated"
            + (f", {_num(reserved)} MB reserved" if reserved else "")
            + ".",
        ]
        sites = memory.get("top_allocation_sites") or []
        if sites:
            lines += ["", "| allocation site | MB allocated | allocations |", "|---|---:|---:|"]
            for site in sites[:top]:
                lines.append(f"| `{site['site']}` | {_num(site['mb'], 2)} | {site['allocations']} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Finding summaries on disk
# --------------------------------------------------------------------------------------------------


def load_summary(path: str | os.PathLike[str], budget: MemoryBudget | None = None) -> Summary:
    """A ``summary.json`` read back without trusting it (bounded, regular files only, checked
    against analysis/schema.py): any problem is a SummaryNotFound naming the file and the field."""
    return read_summary(path, budget)


def find_traces(target: str | os.PathLike[str], skipped: list[str] | None = None) -> list[Path]:
    """Trace files under a directory (or the file itself), oldest first by modification time.
    Entries that are not regular files (FIFOs, directories named like traces) are left out and
    named in ``skipped``."""
    path = Path(target)
    if not path.exists():
        raise SummaryNotFound(f"{path}: no such file or directory")
    if not path.is_dir():
        if not path.name.endswith((TRACE_SUFFIX, ".json", ".json.gz")):
            raise SummaryNotFound(f"{path}: not a trace file (*{TRACE_SUFFIX})")
        return [path]
    found: list[tuple[float, str, Path]] = []
    for trace in path.rglob(f"*{TRACE_SUFFIX}"):
        if is_regular_file(trace):
            found.append((trace.stat().st_mtime, str(trace), trace))
        elif skipped is not None:
            skipped.append(f"{trace}: not a regular file, skipped")
    if not found:
        raise SummaryNotFound(f"{path}: no vt_lightning traces (*{TRACE_SUFFIX}) under it")
    return [trace for _, _, trace in sorted(found)]


def hta_trace_files(window_dir: str | os.PathLike[str]) -> dict[int, str]:
    """``{global rank: trace path}`` of one window directory, for HTA's
    ``TraceAnalysis(trace_files=..., trace_dir=...)``. HTA's own directory scan takes every
    ``*.json`` / ``*.gz`` for a trace, the ``.summary.json`` files included."""
    out: dict[int, str] = {}
    for trace in sorted(Path(window_dir).glob(f"*{TRACE_SUFFIX}")):
        worker = trace.name.split(".", 1)[0]
        rank = worker.rsplit("_", 1)[-1]
        if rank.isdigit():
            out[int(rank)] = str(trace)
    if not out:
        raise SummaryNotFound(f"{window_dir}: no vt_lightning traces (*{TRACE_SUFFIX}) in it")
    return out


# --------------------------------------------------------------------------------------------------
# Console tables: rich when it is installed, plain text otherwise
# --------------------------------------------------------------------------------------------------
#
# rich is optional on purpose: Lightning switches its default progress bar and model summary to
# their rich versions whenever rich is importable, so depending on it would change every user's
# Trainer output just by installing a profiler.

Column = tuple[str, bool]  # (header, right-aligned)
MAX_CELL_CHARS = 300


def rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def print_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    styles: Mapping[tuple[int, int], str] | None = None,
    caption: str | None = None,
    file: Any = None,
) -> None:
    """One table on the console; ``styles`` maps (row, column) to a rich style (ignored in plain text)."""
    styles = styles or {}
    # Cells come from files (function names, paths): control characters escaped, lengths capped.
    title = printable(title)
    caption = printable(caption) if caption is not None else None
    rows = [[printable(cell, limit=MAX_CELL_CHARS) for cell in row] for row in rows]
    if rich_available():
        from rich import box
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(
            title=title,
            title_justify="left",
            caption=caption,
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        for header, right in columns:
            table.add_column(header, justify="right" if right else "left", no_wrap=right, overflow="fold")
        for r, row in enumerate(rows):
            cells = []
            for c, cell in enumerate(row):
                style = styles.get((r, c))
                cells.append(f"[{style}]{escape(cell)}[/{style}]" if style else escape(cell))
            table.add_row(*cells)
        Console(file=file).print(table)
        return
    import textwrap

    out = file or sys.stdout
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, (h, _) in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if right else cell.ljust(w) for cell, w, (_, right) in zip(cells, widths, columns)
        ).rstrip()

    print(title, file=out)
    print(line([h for h, _ in columns]), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in rows:
        print(line(row), file=out)
    if caption:
        print(textwrap.fill(caption, width=100), file=out)


def _top_user_function(summary: Summary) -> str | None:
    for entry in (summary.get("top_python") or {}).get("by_inclusive") or []:
        if entry.get("origin") == "user":
            return f"{entry['function']} ({entry['inclusive_ms']:.1f} ms)"
    return None


SHORT_PARTS = {
    "data_wait": "data",
    "forward": "fwd",
    "backward": "bwd",
    "optimizer": "optim",
    "hooks": "hooks",
    "validation": "val",
    "test": "test",
    "predict": "pred",
    "other": "other",
}
ALWAYS_SHOWN = ("data_wait", "forward", "backward", "optimizer", "other")  # the others when a window has them


def print_windows_table(summaries: Sequence[Summary], file: Any = None, title: str | None = None) -> None:
    """One compact table (fits 80 columns): a row per window, ms per step, the largest part in
    bold; the busiest user function of the latest windows in the caption."""
    with_gpu = any(s.get("gpu") for s in summaries)
    present = {p for s in summaries for p, ms in (s.get("breakdown_ms") or {}).items() if ms}
    shown_parts = [p for p in SHORT_PARTS if p in ALWAYS_SHOWN or p in present]
    columns: list[Column] = [("win", False), ("batches", True), ("step", True)]
    columns += [(SHORT_PARTS[p], True) for p in shown_parts]
    columns += [("GPU", True)] if with_gpu else []
    columns += [("peak MB", True)]
    rows: list[list[str]] = []
    styles: dict[tuple[int, int], str] = {}
    caption = []
    for r, summary in enumerate(summaries):
        window = summary.get("window") or {}
        recorded = (summary.get("steps") or {}).get("recorded") or []
        step = summary.get("step_ms") or {}
        parts = summary.get("breakdown_ms") or {}
        gpu = summary.get("gpu")
        memory = summary.get("memory")
        name = str(window.get("index"))
        if window.get("global_rank"):
            name += f" r{window['global_rank']}"
        if parts:
            largest = max(parts, key=lambda p: parts[p] or 0.0)
            if largest in shown_parts:  # a part this version has no column for is not shown
                styles[(r, 3 + shown_parts.index(largest))] = "bold"
        rows.append(
            [
                name,
                f"{recorded[0]}-{recorded[-1]}" if recorded else "–",
                _num(step.get("mean")),
                *(_num(parts.get(p)) for p in shown_parts),
                *([f"{gpu['busy_percent']:.0f}%" if gpu is not None else "–"] if with_gpu else []),
                _num(memory.get("peak_allocated_mb") if memory is not None else None),
            ]
        )
        top = _top_user_function(summary)
        if top:
            caption.append(f"window {name}: {top}")
    shown = caption[-4:]  # the latest windows; `vt-lightning summary` has them all
    text = "busiest user function (incl.): " + "; ".join((["..."] if len(caption) > len(shown) else []) + shown)
    print_table(
        title or "vt_lightning: where the step went (ms per step)",
        columns,
        rows,
        styles,
        text if caption else None,
        file,
    )
