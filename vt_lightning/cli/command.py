"""``vt-lightning`` (also ``python -m vt_lightning``): read, compare and open recorded windows.

    vt-lightning summary [LOGDIR] [--json]   every window's summary under LOGDIR (default: .)
    vt-lightning diff A B [--json]           what got slower/faster from A to B (windows or runs)
    vt-lightning view [LOGDIR|FILE]          the latest (or given) window in the Perfetto UI
    vt-lightning job LOGDIR LOGDIR...        the job files of ranks that wrote into node-local log dirs

Files are never trusted (export/reading.py), and every character printed is made safe for a
terminal (export/terminal.py). Exit status: 0, all read (or the reader of its output stopped early,
as ``| head`` does); 1, nothing readable where the user pointed or a file refused (a file named on
the command line ends the command, one found in a directory is skipped with one warning line); 2,
bad arguments (jsonargparse). Never a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import orjson

from vt_lightning.analysis.schema import Summary
from vt_lightning.constants import ENV_COMMAND_PREFIX, SUMMARY_JSON_SUFFIX, TRACE_SUFFIX
from vt_lightning.export.job import URL, Location
from vt_lightning.export.job_file import job_file_of
from vt_lightning.export.reading import (
    DEFAULT_MEMORY_BUDGET,
    MIB,
    MemoryBudget,
    SummaryNotFound,
    UnreadableFile,
    check_summary,
    check_trace_stream,
    download,
    is_regular_file,
    list_files,
    locate_target,
    parsed_size_bound,
    read_summary,
    read_trace,
)
from vt_lightning.export.report import print_table, print_windows_table, render_markdown, summary_names, summary_stem
from vt_lightning.export.source_lines import excerpt_lines
from vt_lightning.export.terminal import json_for_terminal, printable, printable_lines

EXIT_OK = 0
EXIT_NOT_FOUND = 1  # nothing readable where the user pointed, a file refused, or a fault of the command
EXIT_INTERRUPTED = 130
CURRENT_DIR = "."  # what `summary` and `view` read when no target is given

Warn = Callable[[UnreadableFile], None]


def _parser() -> Any:
    from jsonargparse import ArgumentParser
    from jsonargparse.typing import PositiveInt

    parser = ArgumentParser(
        prog="vt-lightning",
        description="Read, compare and open vt_lightning windows (summaries and traces).",
        env_prefix=ENV_COMMAND_PREFIX,
        default_env=False,
    )
    commands = parser.add_subcommands(dest="command")
    memory_help = (
        f"memory the command may spend parsing files, in MiB (default {DEFAULT_MEMORY_BUDGET // MIB}); "
        "a trace without its .summary.jsonc takes about 14 MiB per MB of inflated JSON"
    )

    summary = ArgumentParser(description="Print every window's summary found under LOGDIR.")
    # No default on an optional positional (jsonargparse 4.38-4.46 refuse one): ``main`` reads None as CURRENT_DIR.
    summary.add_argument("logdir", nargs="?", help="a log dir, run dir, window dir, trace or summary file (default .)")
    summary.add_argument("--json", action="store_true", default=False, help="print the summaries as JSON (a list)")
    summary.add_argument("--max-memory-mb", type=PositiveInt, default=DEFAULT_MEMORY_BUDGET // MIB, help=memory_help)
    commands.add_subcommand("summary", summary, help="print every window's summary")

    diff = ArgumentParser(description="Compare two windows or two runs: what got slower or faster.")
    diff.add_argument("a", help="baseline: a window (trace/summary/window dir) or a run's log dir")
    diff.add_argument("b", help="the one to compare with A")
    diff.add_argument("--top", type=PositiveInt, default=10, help="rows per table")
    diff.add_argument("--json", action="store_true", default=False, help="print the comparison as JSON")
    diff.add_argument("--max-memory-mb", type=PositiveInt, default=DEFAULT_MEMORY_BUDGET // MIB, help=memory_help)
    commands.add_subcommand("diff", diff, help="compare two windows or two runs")

    view = ArgumentParser(description="Open the latest (or the given) window in vizviewer's bundled Perfetto UI.")
    view.add_argument("target", nargs="?", help="a log dir (its latest window) or a trace file (default .)")
    view.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a random free port)")
    view.add_argument("--no-browser", action="store_true", default=False, help="only serve; do not open a browser")
    commands.add_subcommand("view", view, help="open a window in the Perfetto UI (offline)")

    job = ArgumentParser(description="Build the job files of windows whose ranks wrote into node-local log dirs.")
    job.add_argument("logdirs", nargs="+", help="rank 0's local log dir first, then each other node's (copied here)")
    commands.add_subcommand("job", job, help="every rank on one timeline, from the nodes' log dirs")
    return parser


def _out(text: str = "", end: str = "\n") -> None:
    sys.stdout.write(printable_lines(text) + end)


def _err(text: str) -> None:
    print(printable(text), file=sys.stderr, flush=True)


def _out_json(value: Any) -> None:
    sys.stdout.write(json_for_terminal(orjson.dumps(value, option=orjson.OPT_INDENT_2)) + "\n")


class Refusals:
    """Files a command skipped: each one warned about once; any of them makes the exit status 1."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.count = 0

    def __call__(self, problem: UnreadableFile) -> None:
        self.count += 1
        _err(f"vt-lightning {self.command}: skipped {problem}")

    def status(self) -> int:
        return EXIT_NOT_FOUND if self.count else EXIT_OK


def _summary_of_trace(trace: Location, budget: MemoryBudget, refused: Warn | None, beside_first: bool) -> Summary:
    """The summary beside the trace if it reads (else, with ``refused``, a warning), or the trace's
    own, computed now."""
    beside = trace.with_name(summary_names(trace.name)[0])
    if beside_first and beside != trace and is_regular_file(beside):
        try:
            return read_summary(beside, budget)
        except UnreadableFile as problem:
            if refused is None:
                raise
            refused(problem)  # and summarise the trace itself
    from vt_lightning.analysis.summary import summarize

    data = read_trace(trace, budget)
    try:
        summary = summarize(data)
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError) as err:
        # summarize is pure code over the file's values: a value of the wrong type ends up here.
        raise UnreadableFile(f"{trace}: not a trace vt-lightning can summarise ({type(err).__name__}: {err})") from None
    del data
    # The file's name, as JSON can hold it (a name with undecodable bytes keeps a replacement char).
    summary.setdefault("window", {})["trace"] = trace.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    summary = check_summary(summary, f"{trace} (summarised on the spot)")
    try:
        budget.charge(parsed_size_bound(orjson.dumps(summary)))
    except orjson.JSONEncodeError as err:  # an integer past 64 bits, summed from the file's
        raise UnreadableFile(f"{trace}: not a trace vt-lightning can summarise ({err})") from None
    cast(dict[str, Any], summary)["_path"] = str(trace)  # where it came from, as read_summary marks it
    return summary


def _load_file(path: Location, budget: MemoryBudget, refused: Warn | None = None, beside_first: bool = True) -> Summary:
    if path.name.endswith(SUMMARY_JSON_SUFFIX):
        return read_summary(path, budget)
    if path.name.endswith((".json", ".json.gz")):
        return _summary_of_trace(path, budget, refused, beside_first)
    raise SummaryNotFound(f"{path}: not a vt_lightning trace (*{TRACE_SUFFIX}) or summary (*{SUMMARY_JSON_SUFFIX})")


def load_windows(target: str, budget: MemoryBudget | None = None, refused: Warn | None = None) -> list[Summary]:
    """Summaries of every window at ``target``, in (directory, name) order. In a directory, a file
    that cannot be read goes to ``refused`` and is skipped (without ``refused``: it raises)."""
    budget = budget or MemoryBudget()
    found_summaries, found_traces = _window_files(target)
    if found_summaries is None:
        return [_load_file(found_traces[0], budget, refused)]
    windows: dict[str, Summary] = {}
    covered: set[str] = set()  # the windows read, as "<directory>/<stem>"

    def attempt(found: Location, stem: str) -> None:
        try:  # a trace is reached only when its summary was not read: summarise the trace itself
            windows[str(found)] = _load_file(found, budget, refused, beside_first=False)
            covered.add(stem)
        except UnreadableFile as problem:
            if refused is None:
                raise
            refused(problem)

    for summary_path in found_summaries:
        attempt(summary_path, str(summary_path.parent / str(summary_stem(summary_path.name))))
    for trace in found_traces:  # windows written with summary=False, or whose summary was refused
        stem = str(trace.parent / trace.name[: -len(TRACE_SUFFIX)])
        if stem not in covered:
            attempt(trace, stem)
    if not windows:
        raise SummaryNotFound(
            f"{target}: no readable vt_lightning windows (*{TRACE_SUFFIX}, *{SUMMARY_JSON_SUFFIX}) under it"
        )
    return [windows[k] for k in sorted(windows, key=lambda k: k.rpartition("/")[::2])]


def _window_files(target: str) -> tuple[list[Location] | None, list[Location]]:
    """(summary files, trace files) under the directory ``target``, each sorted; (None, [target])
    when ``target`` is a file."""
    place = locate_target(target)
    listed = list_files(place, (SUMMARY_JSON_SUFFIX, TRACE_SUFFIX))
    if listed is None:
        return None, [place]
    files = [found for found, _ in listed]
    summaries = [f for f in files if f.name.endswith(SUMMARY_JSON_SUFFIX)]
    return summaries, [f for f in files if f.name.endswith(TRACE_SUFFIX)]


def run_summary(logdir: str, as_json: bool, max_memory_mb: int = DEFAULT_MEMORY_BUDGET // MIB) -> int:
    refused = Refusals("summary")
    windows = load_windows(logdir, MemoryBudget(max_memory_mb * MIB), refused)
    if as_json:
        _out_json([{k: v for k, v in w.items() if not k.startswith("_")} for w in windows])  # no _path
        return refused.status()
    print_windows_table(windows, title=f"vt_lightning: {len(windows)} window(s) under {logdir} (ms per step)")
    for window in windows:
        _out()
        _out(render_markdown(window), end="")
        for line in excerpt_lines(window):  # the lines as they were, and whether the file changed since
            _out(line)
        _out(f"({window.get('_path')})")
    return refused.status()


def run_diff(a: str, b: str, top: int, as_json: bool, max_memory_mb: int = DEFAULT_MEMORY_BUDGET // MIB) -> int:
    from vt_lightning.analysis.compare import DIFF_COLUMNS, diff, diff_table

    refused = Refusals("diff")
    budget = MemoryBudget(max_memory_mb * MIB)
    result = diff(load_windows(a, budget, refused), load_windows(b, budget, refused), limit=top)
    if as_json:
        _out_json(result)
        return refused.status()
    _out(
        f"A: {a} ({result['a_windows']} window(s))\nB: {b} ({result['b_windows']} window(s))\n"
        f"step: {step_change(result)}\n{result['noise']['text']}.\n{result['rule']}."
    )
    for title, rows in (
        ("breakdown (ms per step)", result["breakdown"]),
        ("your functions (inclusive ms per step)", result.get("user_python") or []),
        ("all Python functions (self ms per step)", result["python"]),
        ("torch ops (self CPU ms per step)", result["ops"]),
    ):
        cells, styles = diff_table(rows)
        names, base = short_paths([row[0] for row in cells])
        for row, name in zip(cells, names):
            row[0] = name
        _out()
        print_table(title, DIFF_COLUMNS, cells, styles, f"paths relative to {base}" if base else None)
    if result.get("verdicts"):
        from vt_lightning.analysis.verdict_report import verdict_change_lines

        _out("\nverdicts (docs/verdicts.md):\n" + "\n".join(verdict_change_lines(result["verdicts"])))
    return refused.status()


_LOCATED = re.compile(r"^(?P<name>.*) \((?P<path>/.+):(?P<line>\w+)\)$")  # function_key's "f (/src/m.py:12)"


def _library_file(path: str) -> str | None:
    """A package's or the standard library's file from its package: ``torch/nn/modules/module.py``."""
    if "-packages/" in path:
        return path.rsplit("-packages/", 1)[1]
    stdlib = sysconfig.get_paths()["stdlib"].rstrip(os.sep) + os.sep
    return path[len(stdlib) :] if path.startswith(stdlib) else None


def short_paths(names: Sequence[str], cwd: str | None = None) -> tuple[list[str], str | None]:
    """Function names with readable paths: relative to the working directory, library files from
    their package, any others relative to their common directory (returned, for a caption; None
    when no name needed it)."""
    inside = (cwd or os.getcwd()).rstrip(os.sep) + os.sep
    found = [_LOCATED.match(name) for name in names]
    elsewhere = [
        os.path.dirname(m["path"])
        for m in found
        if m and not m["path"].startswith(inside) and _library_file(m["path"]) is None
    ]
    base = os.path.commonpath(elsewhere) if elsewhere else None
    out = []
    for name, m in zip(names, found):
        if m is None:
            out.append(name)
            continue
        path = m["path"]
        if path.startswith(inside):
            path = path[len(inside) :]
        elif _library_file(path) is not None:
            path = str(_library_file(path))
        elif base is not None:
            path = os.path.relpath(path, base)
        out.append(f"{m['name']} ({path}:{m['line']})")
    return out, base


def step_change(result: dict[str, Any]) -> str:
    """``27.4 -> 17.6 ms (-9.80 ms, -35.7%, within noise); steps: A 14.1–40.6 ms (2), B 14.8–20.4 ms (2)``."""
    step, noise = result["step"], result["noise"]
    percent = "" if step["delta_percent"] is None else f", {step['delta_percent']:+.1f}%"
    verdict = ", within noise" if step["within_noise"] else ""

    def spread(side: dict[str, Any]) -> str:
        return f"{side['min_ms']:.1f}–{side['max_ms']:.1f} ms ({side['steps']})" if side["steps"] else "no steps"

    return (
        f"{step['a_ms']:.1f} -> {step['b_ms']:.1f} ms ({step['delta_ms']:+.2f} ms{percent}{verdict}); "
        f"steps: A {spread(noise['a'])}, B {spread(noise['b'])}"
    )


def latest_trace(target: str, refused: Warn | None = None) -> Location:
    """The trace itself, the trace beside a summary file, or the newest trace under a directory (by
    modification time, by name where a store keeps none; local entries that are not regular files
    go to ``refused``)."""
    place = locate_target(target)
    listed = list_files(place, (TRACE_SUFFIX,))
    if listed is None and place.name.endswith(SUMMARY_JSON_SUFFIX):
        trace = place.with_name(str(summary_stem(place.name)) + TRACE_SUFFIX)
        if not is_regular_file(trace):
            raise SummaryNotFound(f"{place}: no trace beside this summary ({trace.name})")
        return trace
    if listed is None:
        if not place.name.endswith((TRACE_SUFFIX, ".json", ".json.gz")):
            raise SummaryNotFound(f"{place}: not a trace file (*{TRACE_SUFFIX})")
        return place
    traces = []
    for trace, modified in listed:
        if isinstance(trace, URL) or is_regular_file(trace):  # a store lists only files
            traces.append((modified, str(trace), trace))
        elif refused is not None:
            refused(UnreadableFile(f"{trace}: not a regular file, skipped"))
    if not traces:
        raise SummaryNotFound(f"{place}: no vt_lightning traces (*{TRACE_SUFFIX}) under it")
    return max(traces)[2]


def run_view(target: str, port: int, open_browser: bool) -> int:
    """Serve one trace with vizviewer's bundled Perfetto UI on 127.0.0.1 until Ctrl-C (cli/serve.py:
    a random path, no cross-origin header). A trace under a URL is served from a local copy."""
    import tempfile

    refused = Refusals("view")
    found = latest_trace(target, refused)
    place = locate_target(target)
    trace = found if isinstance(found, URL) else Path(found).resolve()
    if isinstance(place, URL) or place.is_dir():  # a DDP window: its job file holds every rank
        trace = job_file_of(trace) or trace
    with tempfile.TemporaryDirectory(prefix="vt-lightning-view-") as scratch:  # a remote trace's copy, within its cap
        local = download(trace, Path(scratch)) if isinstance(trace, URL) else trace
        check_trace_stream(local)  # one line now rather than a blank Perfetto tab later
        visible = None if isinstance(found, URL) else _steps_shown(Path(found), job=trace != Path(found).resolve())
        return _serve(local, found if isinstance(found, URL) else local, port, open_browser, refused, visible)


def _steps_shown(rank_trace: Path, job: bool) -> list[int] | None:
    """Where Perfetto opens (``serve.perfetto_range``): the steps of the summary beside the rank's
    trace, or for the job file those of the window's summary that holds the job (on the job file's
    timeline); None (the whole trace) without a readable one."""
    from vt_lightning.cli.serve import perfetto_range

    beside = rank_trace.with_name(rank_trace.name.removesuffix(TRACE_SUFFIX) + SUMMARY_JSON_SUFFIX)
    for path in sorted(rank_trace.parent.glob(f"*{SUMMARY_JSON_SUFFIX}")) if job else [beside]:
        try:
            summary = read_summary(path)
        except SummaryNotFound:
            continue
        if not job or summary.get("job"):
            return perfetto_range(summary, job=job)
    return None


def _serve(
    trace: Path, shown: Location, port: int, open_browser: bool, refused: Refusals, visible: list[int] | None
) -> int:
    from vt_lightning.cli.serve import TraceServer

    server = TraceServer(trace, port, visible=visible)
    server.start()
    _out(f"vt-lightning: serving {shown}")
    _out(f"  open {server.url}  (Perfetto UI, works offline; only this URL works; Ctrl-C to stop)")
    sys.stdout.flush()
    if open_browser:
        import webbrowser

        webbrowser.open_new_tab(server.url)
    signal.signal(signal.SIGTERM, _stop_serving)  # `kill` stops it as Ctrl-C does: "stopped", status 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
        _out("vt-lightning: stopped")
        sys.stdout.flush()
    return refused.status()


def _stop_serving(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_job(logdirs: Sequence[str]) -> int:
    """Every window of rank 0's log dir that kept its clock exchange for lack of the other hosts'
    traces (``job_file.clock_name``), built from the window's directory under each log dir."""
    from vt_lightning.export.job_file import CLOCK_SUFFIX, JOB_DIR, build_job, read_clock

    first, *others = (Path(d) for d in logdirs)
    clocks = sorted(first.rglob(f"{JOB_DIR}/job.*{CLOCK_SUFFIX}"))
    if not clocks:
        raise SummaryNotFound(f"{first}: no window waiting for its job file under it (give rank 0's log dir first)")
    built = 0
    for clock in clocks:
        window = clock.parent.parent
        relative = window.relative_to(first)
        dirs = [window]
        for other in others:  # the same window's directory on each node: by its path below the log dir, else by name
            here = other / relative
            if relative.parts and here.is_dir():
                dirs.append(here)
            else:
                dirs.extend(d for d in [other, *sorted(other.rglob(window.name))] if d.name == window.name)
        sync, span = read_clock(clock)
        info, notes = build_job(sync, span, dirs, window)
        for note in notes:
            _err(f"vt-lightning job: {note}")
        if info is not None:
            built += 1
            hosts = sorted({str(r["host"]) for r in info["ranks"]})
            _out(f"{window / info['file']}: {info['world_size']} ranks on one timeline (hosts {', '.join(hosts)})")
    return EXIT_OK if built == len(clocks) else EXIT_NOT_FOUND


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command
    options = args[command]
    for stream in (sys.stdout, sys.stderr):  # a name the terminal's encoding lacks: escaped, not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        if command == "summary":
            return run_summary(options.logdir or CURRENT_DIR, options.json, options.max_memory_mb)
        if command == "diff":
            return run_diff(options.a, options.b, options.top, options.json, options.max_memory_mb)
        if command == "view":
            return run_view(options.target or CURRENT_DIR, options.port, not options.no_browser)
        if command == "job":
            return run_job(options.logdirs)
    except SummaryNotFound as err:
        _err(f"vt-lightning {command}: {err}")
        return EXIT_NOT_FOUND
    except MemoryError:
        _err(f"vt-lightning {command}: out of memory; lower --max-memory-mb")
        return EXIT_NOT_FOUND
    except BrokenPipeError:  # `vt-lightning diff A B | head`: the reader left, nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at the final flush
        return EXIT_OK
    except OSError as err:  # the target itself: a name too long, a directory it may not list
        _err(f"vt-lightning {command}: {err.filename or ''}: {err.strerror or err}")
        return EXIT_NOT_FOUND
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as err:  # the command's fault boundary: one line, never a traceback
        _err(f"vt-lightning {command}: failed ({type(err).__name__}: {err}); please report it")
        return EXIT_NOT_FOUND
    return 2


def console_main() -> None:
    sys.exit(main())
