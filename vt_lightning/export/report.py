"""Summaries for people and scripts: file names, markdown, console tables, finding them on disk.

Pure rendering and reading; computing a summary is ``analysis/summary.py``, writing it is ``export/pipeline.py``.
Console tables use rich when it is installed and plain text otherwise (see ``print_table``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from vt_lightning.analysis.breakdown import ALL_PARTS, BREAKDOWN_PARTS
from vt_lightning.analysis.compile import compile_markdown, compile_text
from vt_lightning.analysis.history import RunHistory, TableRow, WindowRow, history_of, row_of
from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.verdict_report import verdicts_markdown
from vt_lightning.analysis.workers import workers_markdown
from vt_lightning.constants import MEMORY_VIEW_SUFFIX, SUMMARY_JSON_SUFFIX, SUMMARY_MD_SUFFIX, TRACE_SUFFIX
from vt_lightning.export.reading import SummaryNotFound, read_summary
from vt_lightning.export.terminal import printable, printable_lines


def summary_names(trace_name: str) -> tuple[str, str, str]:
    """A trace's name -> its ``.summary.jsonc``, ``.md`` and ``.memory_view.jsonc`` names."""
    stem = trace_name[: -len(TRACE_SUFFIX)] if trace_name.endswith(TRACE_SUFFIX) else trace_name.split(".pt.trace")[0]
    return stem + SUMMARY_JSON_SUFFIX, stem + SUMMARY_MD_SUFFIX, stem + MEMORY_VIEW_SUFFIX


def summary_stem(name: str) -> str | None:
    """``host_0.0000000002`` of a summary file's name (None: not a summary's)."""
    return name[: -len(SUMMARY_JSON_SUFFIX)] if name.endswith(SUMMARY_JSON_SUFFIX) else None


def encode_summary(summary: Summary) -> bytes:
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"


def _num(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _where(entry: Mapping[str, Any]) -> str:
    if entry.get("folded"):
        return f"{entry['folded']} functions"
    if entry.get("file"):
        return f"{os.path.basename(str(entry['file']))}:{entry.get('line')}"
    return entry.get("origin") or ""


def _calls(entry: Mapping[str, Any]) -> str:
    """Calls per counted step (a summary without ``calls_per_step``: its count over the steps)."""
    per_step = entry.get("calls_per_step")
    return f"{per_step:g}" if isinstance(per_step, (int, float)) else f"{entry.get('calls')} (all steps)"


def step_spread_text(summary: Summary) -> str:
    """``median 50.8 ms (min–max 44.1–80.4 over 5 steps)``; two steps or fewer are listed
    (``50.8 and 80.4 ms``), never averaged."""
    ms = (summary.get("steps") or {}).get("ms") or {}
    values = [ms[str(n)] for n in (summary.get("steps") or {}).get("counted") or [] if str(n) in ms]
    if not values:
        return "no counted steps"
    if len(values) <= 2:
        return f"{' and '.join(f'{v:.1f}' for v in values)} ms"
    p50 = (summary.get("step_ms") or {}).get("p50")
    return f"median **{_num(p50)} ms** (min–max {min(values):.1f}–{max(values):.1f} over {len(values)} steps)"


def straggler_text(straggler: Mapping[str, Any] | None) -> str:
    """The straggler's line: the named function and the others' wait in one unit (ms/step)."""
    if not straggler:
        return "no straggler (ranks balanced)"
    wait = _num(straggler.get("others_wait_ms"))
    text = (
        f"straggler: rank {straggler.get('rank')} (others wait {wait} ms/step, "
        f"{100 * float(straggler.get('share_of_step') or 0):.0f}% of the step)"
    )
    if straggler.get("function"):
        where = f"{os.path.basename(str(straggler.get('file')))}:{straggler.get('line')}"
        share = straggler.get("explains_share")
        text += (
            f"; {straggler['function']} ({where}) explains {_num(straggler.get('excess_ms'))} of those {wait} ms/step"
        )
        text += f" ({100 * share:.0f}%)" if isinstance(share, (int, float)) else ""
    return text


def job_markdown(job: Mapping[str, Any]) -> list[str]:
    """The ranks of a job window, their clock offsets and the straggler (rank 0's summary)."""
    verdict = straggler_text(job.get("straggler"))
    lines = ["", f"Job: {job.get('world_size')} ranks on one timeline in `{job.get('file')}`; {verdict}."]
    lines += ["", "| rank | host | clock offset µs | ± µs |", "|---:|---|---:|---:|"]
    for r in job.get("ranks") or []:
        offset, bound = _num(r.get("offset_us"), 1), _num(r.get("uncertainty_us"), 1)
        lines.append(f"| {r.get('rank')} | {r.get('host')} | {offset} | {bound} |")
    if job.get("slow_ops"):
        lines += [
            "",
            "Ops much slower on one rank (self CPU time):",
            *(f"- {op.get('text')}" for op in job["slow_ops"]),
        ]
    if job.get("reduced_ranks"):
        reduced = job["reduced_ranks"]
        lines += ["", f"Over the job file's size budget: ranks {reduced} kept steps, collectives and top functions."]
    return lines


def observer_text(observer: Mapping[str, Any] | None) -> str | None:
    """``traced 1.60 ms/step vs 0.75 ms untraced (2.1x, 2 step(s))``: what observing the window cost."""
    if not observer or observer.get("traced_step_ms") is None:
        return None
    if observer.get("ratio") is None:
        return f"traced {_num(observer['traced_step_ms'], 2)} ms/step (no untraced step before this window)"
    return (
        f"traced {_num(observer['traced_step_ms'], 2)} ms/step vs {_num(observer.get('untraced_step_ms'), 2)} ms "
        f"untraced ({observer['ratio']:.1f}x, {observer.get('untraced_steps')} step(s))"
    )


def window_line(summary: Summary) -> str | None:
    """The console's line for a window: what the run compiled, and the cost of observing it."""
    parts = [compile_text(summary.get("compile")), observer_text(summary.get("observer"))]
    return " · ".join(p for p in parts if p) or None


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
        f"Step time: {step_spread_text(summary)} over batches {', '.join(map(str, counted)) or '–'} "
        f"(breakdown from {steps.get('breakdown_source', '?')})."
    )
    observed = observer_text(summary.get("observer"))
    if observed:
        lines[-1] += f" Observing cost: {observed}."
    if summary.get("verdicts") is not None:  # optional in the schema
        lines += ["", *verdicts_markdown(summary.get("verdicts") or [])]
    lines += ["", "| part | ms/step | share |", "|---|---:|---:|"]
    for part, ms in (summary.get("breakdown_ms") or {}).items():
        share = f"{100 * ms / mean:.0f}%" if mean else "–"
        lines.append(f"| {part.replace('_', ' ')} | {_num(ms)} | {share} |")
    python = (summary.get("top_python") or {}).get("by_inclusive") or []
    if python:
        lines += [
            "",
            "| Python function (user code first) | where | incl. ms/step | self ms/step | calls/step |",
            "|---|---|---:|---:|---:|",
        ]
        for entry in python[: top * 2]:
            lines.append(
                f"| `{entry['function']}` | {_where(entry)} | {_num(entry['inclusive_ms'], 2)} | "
                f"{_num(entry['self_ms'], 2)} | {_calls(entry)} |"
            )
    ops = (summary.get("top_ops") or {}).get("by_cpu") or []
    if ops:
        lines += ["", "| torch op | self CPU ms/step | CPU ms/step | calls/step |", "|---|---:|---:|---:|"]
        for op in ops[:top]:
            lines.append(f"| `{op['name']}` | {_num(op['self_cpu_ms'], 2)} | {_num(op['cpu_ms'], 2)} | {_calls(op)} |")
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
    if summary.get("compile"):
        lines += compile_markdown(summary["compile"] or {})  # analysis/compile.py
    job = summary.get("job")
    if job:
        lines += job_markdown(job)
    if summary.get("workers"):
        lines += workers_markdown(summary["workers"])
    memory = summary.get("memory")
    if memory:
        reserved = f", {_num(memory['peak_reserved_mb'])} MB reserved" if memory.get("peak_reserved_mb") else ""
        lines += ["", f"Memory peak: **{_num(memory.get('peak_allocated_mb'))} MB** allocated{reserved}."]
        sites = memory.get("top_allocation_sites") or []
        if sites:
            lines += ["", "| allocation site | MB allocated | allocations |", "|---|---:|---:|"]
            for site in sites[:top]:
                lines.append(f"| `{site['site']}` | {_num(site['mb'], 2)} | {site['allocations']} |")
    return "\n".join(lines) + "\n"


def hta_trace_files(window_dir: str | os.PathLike[str]) -> dict[int, str]:
    """``{global rank: trace path}`` of one window directory, for HTA's ``TraceAnalysis(trace_files=...)``."""
    out: dict[int, str] = {}
    for trace in sorted(Path(window_dir).glob(f"*{TRACE_SUFFIX}")):
        rank = trace.name.split(".", 1)[0].rsplit("_", 1)[-1]  # <host>_<rank>.<span>...
        if rank.isdigit():
            out[int(rank)] = str(trace)
    if not out:
        raise SummaryNotFound(f"{window_dir}: no vt_lightning traces (*{TRACE_SUFFIX}) in it")
    return out


def gpu_breakdowns_missing(window_dir: str | os.PathLike[str]) -> str | None:
    """None when the window recorded GPU kernels; else why HTA's kernel breakdowns (an ``IndexError``
    without GPU kernels) do not apply."""
    window = Path(window_dir)
    try:
        traces = hta_trace_files(window)
    except SummaryNotFound as err:
        return str(err)
    for trace in traces.values():
        summary_path = window / summary_names(Path(trace).name)[0]
        try:
            summary = read_summary(summary_path)
        except (SummaryNotFound, OSError):
            return f"{window}: no summary beside {Path(trace).name} to tell whether GPU kernels were recorded"
        if summary.get("gpu"):
            return None
    return (
        f"{window}: no GPU kernels were recorded (a CPU run): HTA's temporal, kernel and idle-time "
        "breakdowns need CUDA kernels; its trace parsing and CPU-side views still apply"
    )


# Console tables: rich when installed, plain text otherwise (a dependency on rich would switch every
# user's Lightning progress bar and model summary to rich).

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
    caption = printable_lines(caption) if caption is not None else None
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

        class PipeConsole(Console):
            def on_broken_pipe(self) -> None:  # rich's own ends the process with status 1 (training too)
                raise BrokenPipeError  # the caller's boundary decides: `vt-lightning diff | head` exits 0

        PipeConsole(file=file).print(table)
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
        for part in caption.split("\n"):  # each caption line wrapped on its own
            print(textwrap.fill(part, width=100), file=out)


SHORT_PARTS = {  # the column of each part of the breakdown whose name is too long for it
    "data_wait": "data",
    "forward": "fwd",
    "backward": "bwd",
    "optimizer": "optim",
    "validation": "val",
    "predict": "pred",
    "compile": "comp",
}


def print_windows_table(summaries: Sequence[Summary], file: Any = None, title: str | None = None) -> None:
    """A row per window (80 columns), ms per step, the largest part in bold, the busiest user function."""
    rows = [row_of(summary) for summary in summaries]
    history = history_of(rows)
    runs = run_labels(summaries)
    tops = [(f"{run} {r.name}" if runs else r.name, r.top_user) for r, run in zip(rows, runs or rows) if r.top_user]
    _print_rows(
        [TableRow(r.name, r) for r in rows], _shown_parts(history), history.with_gpu, _caption(tops), title, file, runs
    )


def run_labels(summaries: Sequence[Summary]) -> list[str] | None:
    """Each window's run relative to the runs' common directory; None when the windows are of one run."""
    runs = [str(Path(str(s.get("_path") or "")).parent.parent) for s in summaries]
    if len(set(runs)) < 2:
        return None
    common = os.path.commonpath(runs) or os.curdir  # "" for relative runs with nothing in common
    return [os.path.relpath(run, common) for run in runs]


def print_history_table(history: RunHistory, file: Any = None) -> None:
    """The end-of-run table, as long after 10 windows as after 10,000 (first, latest, slowest, median, p90)."""
    rows = history.table()
    latest = history.latest_top_user(limit=1)  # one line, whatever the run's length
    caption = f"busiest user function (incl.) of window {latest[0][0]}: {latest[0][1]}" if latest else None
    _print_rows(rows, _shown_parts(history), history.with_gpu, caption, None, file)


def write_full_table(history: RunHistory, rows: Iterable[WindowRow], out: Any) -> None:
    """Every window's row as tab-separated text into ``out``: the table the console shortens."""
    parts = _shown_parts(history)
    columns = _columns(parts, history.with_gpu)
    out.write("\t".join([*(h for h, _ in columns), "run directory"]) + "\n")
    for row in rows:
        out.write("\t".join([*_cells(row, parts, history.with_gpu), row.run_dir]) + "\n")
    for label, q in (("median", 0.5), ("p90", 0.9)):
        out.write("\t".join([label, "all", *_cells(history.aggregate(q), parts, history.with_gpu)[2:], ""]) + "\n")


def _shown_parts(history: RunHistory) -> list[str]:
    return [p for p in ALL_PARTS if p in BREAKDOWN_PARTS or p in history.parts_seen]  # the others when seen


def _caption(tops: Sequence[tuple[str, str | None]]) -> str | None:
    shown = tops[-4:]  # the latest windows; `vt-lightning summary` has them all
    if not shown:
        return None
    return "busiest user function (incl.): " + "; ".join(
        (["..."] if len(tops) > len(shown) else []) + [f"window {name}: {top}" for name, top in shown]
    )


def _columns(parts: Sequence[str], with_gpu: bool) -> list[Column]:
    columns: list[Column] = [("win", False), ("batches", True), ("step", True)]
    columns += [(SHORT_PARTS.get(p, p), True) for p in parts]
    columns += [("GPU", True)] if with_gpu else []
    return [*columns, ("peak MB", True)]


def _cells(row: WindowRow, parts: Sequence[str], with_gpu: bool) -> list[str]:
    return [
        row.name,
        row.batches,
        _num(row.step_ms),
        *(_num(row.parts.get(p)) for p in parts),
        *([f"{row.gpu_busy:.0f}%" if row.gpu_busy is not None else "–"] if with_gpu else []),
        _num(row.peak_mb),
    ]


def _print_rows(
    rows: Sequence[TableRow],
    parts: list[str],
    with_gpu: bool,
    caption: str | None,
    title: str | None,
    file: Any,
    runs: Sequence[str] | None = None,
) -> None:
    columns = _columns(parts, with_gpu)
    cells: list[list[str]] = []
    styles: dict[tuple[int, int], str] = {}
    for r, table_row in enumerate(rows):
        row = table_row.row
        if row is None:  # the gap between the first and the latest windows
            cells.append(["…", table_row.label.removeprefix("… ")] + [""] * (len(columns) - 2))
            continue
        line = _cells(row, parts, with_gpu)
        if table_row.kind != "window":
            line[0], line[1] = table_row.label, "all"
            styles.update({(r, c): "dim" for c in range(len(columns))})
        elif "slowest" in table_row.marks:
            line[0] += " *"
            styles[(r, 2)] = "bold red"
        if row.parts and table_row.kind == "window":
            largest = max(row.parts, key=lambda p: row.parts[p] or 0.0)
            if largest in parts:  # a part this version has no column for is not shown
                styles[(r, 3 + parts.index(largest))] = "bold"
        cells.append(line)
    if any("slowest" in r.marks for r in rows):
        caption = "* the slowest steps of the windows not shown" + (f"\n{caption}" if caption else "")
    if runs:  # windows of several runs: which run each row is, first
        columns = [("run", False), *columns]
        cells = [[run, *line] for run, line in zip(runs, cells)]
        styles = {(r, c + 1): style for (r, c), style in styles.items()}
    print_table(title or "vt_lightning: where the step went (ms per step)", columns, cells, styles, caption, file)
