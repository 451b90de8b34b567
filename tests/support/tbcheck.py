"""Check trace files against the REAL TensorBoard PyTorch Profiler plugin (torch-tb-profiler 0.4.3).

Two levels:

* In process, with the plugin's own code: :func:`parse_trace` / :func:`load_run_dir` call exactly
  what ``torch_tb_profiler.profiler.loader.RunLoader`` calls for each file
  (``RunProfileData.parse`` -- which itself runs ``process()`` and ``analyze()`` --, then
  ``RunGenerator(...).generate_run_profile()``, then ``DistributedRunProfileData`` +
  ``RunLoader._process_spans`` for the Distributed view), but without the loader's spawned
  processes, and they fail loudly where the plugin would only log. :func:`exercise_views` then calls
  the ``RunProfile`` methods the plugin's HTTP routes call lazily (memory, operator tree, module).

* Out of process: :class:`TensorBoardServer` starts a real ``tensorboard`` on 127.0.0.1 and talks
  to the plugin's HTTP API (``/data/plugin/pytorch_profiler/...``).

Plugin facts this module relies on (read from torch_tb_profiler 0.4.3):

* A run is a directory holding >= 1 file matching ``consts.WORKER_PATTERN``; it is loaded ONCE, the
  first time the monitor thread sees it (rescan every ``MONITOR_RUN_REFRESH_INTERNAL_IN_SECONDS`` =
  10 s, hard-coded; TensorBoard's ``--reload_interval`` does not affect it).
* A run only shows in ``/runs`` after ALL its files were parsed; a file that fails to parse is
  logged (``Failed to parse profile data for Run ...``) and the run is still added, with no profile
  for that worker (a run with no profile at all has no views and breaks ``/workers``).
* Span names are not kept: the loader replaces them by their 1-based rank among that worker's
  spans in the run directory, compared AS STRINGS (``bisect.insort``). ``/spans`` returns those
  indexes (``["1"]``), or ``null`` when a file has no span part.
* ``/trace`` returns the file's bytes gzip-compressed with ``Content-Encoding: gzip``; ``/memory``,
  ``/memory_curve``, ``/memory_events``, ``/module`` and ``/tree`` are gzip-compressed too.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PLUGIN_LOGGER = "pytorch_profiler"  # torch_tb_profiler.consts.PLUGIN_NAME
API = "/data/plugin/pytorch_profiler"

# Views are identified by their display names, as ``/views`` returns them.
OVERVIEW, OPERATOR, KERNEL, TRACE = "Overview", "Operator", "Kernel", "Trace"
DISTRIBUTED, MEMORY, MODULE, LIGHTNING = "Distributed", "Memory", "Module", "Lightning"
BASIC_VIEWS = (OVERVIEW, OPERATOR, TRACE)

# Plugin log lines that mean a file, or an event of it, was rejected or mis-read.
_PROBLEM_LOG = re.compile(
    r"Failed to parse|Failed to load run|Failed to scan|JSONDecodeError|Traceback|"
    r"should not intersect|cannot find forward nodes|don't match between workers|"
    r"not belong to any step|don't correlate to any operator",
)


class PluginRejected(AssertionError):
    """The plugin's parser failed on a trace file, or logged problems while reading it."""


# --------------------------------------------------------------------------- file helpers
def trace_files(root: str | os.PathLike) -> list[Path]:
    """Every file under ``root`` whose name the plugin takes for a trace, sorted."""
    from torch_tb_profiler import consts

    root = Path(root)
    return sorted(p for p in root.rglob("*") if p.is_file() and consts.WORKER_PATTERN.match(p.name))


def split_name(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(worker, raw_span)`` as the plugin's ``WORKER_PATTERN`` reads a file name."""
    from torch_tb_profiler import consts

    name = Path(path).name
    match = consts.WORKER_PATTERN.match(name)
    if not match:
        raise PluginRejected(f"{name!r} is not a trace name for the plugin (pattern {consts.WORKER_PATTERN.pattern!r})")
    span = match.group(2)
    return match.group(1), (span[1:] if span is not None else None)


def load_json(path: str | os.PathLike) -> dict:
    """The trace file's JSON (gz or not), with the stdlib (strict) decoder."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    return json.loads(data)


def event_categories(trace: dict | bytes | str) -> dict[str, int]:
    """Count of ``X`` events per ``cat`` in a trace dict or its JSON text."""
    if not isinstance(trace, dict):
        trace = json.loads(trace)
    counts: dict[str, int] = defaultdict(int)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X":
            counts[str(event.get("cat"))] += 1
    return dict(counts)


def contract_problems(trace: dict) -> list[str]:
    """Breaches of the trace file's contract with the plugin (docs/files.md, "Trace file": ``traceEvents``
    last, a string ``name`` on every event, a string ``cat`` and numeric ``ts`` and ``dur`` on every
    ``X`` event) that the parser does not always report itself."""
    problems = []
    keys = list(trace)
    if not keys or keys[-1] != "traceEvents":
        problems.append(f"'traceEvents' must be the last top-level key, keys are {keys}")
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        return [*problems, "'traceEvents' is missing or empty"]
    bad = defaultdict(list)
    for i, event in enumerate(events):
        if not isinstance(event.get("name"), str):
            bad["event without a string 'name'"].append(i)
        if event.get("ph") == "X":
            if not isinstance(event.get("cat"), str):
                bad["X event without a string 'cat'"].append(i)
            if not isinstance(event.get("ts"), (int, float)) or not isinstance(event.get("dur"), (int, float)):
                bad["X event without numeric 'ts'/'dur'"].append(i)
            elif event["dur"] < 0:
                bad["X event with negative 'dur'"].append(i)
    for what, where in bad.items():
        problems.append(f"{len(where)} {what}, e.g. {events[where[0]]!r}")
    return problems


# --------------------------------------------------------------------------- in-process parsing
class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, level: int = logging.WARNING) -> list[str]:
        out = []
        for r in self.records:
            if r.levelno >= level:
                text = f"{r.levelname}: {r.getMessage()}"
                if r.exc_info and r.exc_info[1] is not None:
                    text += f" [{type(r.exc_info[1]).__name__}: {r.exc_info[1]}]"
                out.append(text)
        return out


@contextlib.contextmanager
def _plugin_log() -> Iterator[_Capture]:
    logger = logging.getLogger(PLUGIN_LOGGER)
    handler = _Capture()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _check_log(handler: _Capture, what: str, allowed_warnings: Iterable[str]) -> None:
    allowed = [re.compile(a) for a in allowed_warnings]
    bad = [line for line in handler.lines() if not any(a.search(line) for a in allowed)]
    if bad:
        raise PluginRejected(f"torch-tb-profiler logged problems for {what}:\n  " + "\n  ".join(bad[:20]))


def _span_indexes(directory: Path) -> dict[tuple[str, str | None], str | None]:
    """The loader's span -> index mapping for one run directory (string sort, 1-based)."""
    spans: dict[str, list[str]] = defaultdict(list)
    found = []
    for p in directory.iterdir():
        if p.is_dir():
            continue
        try:
            worker, span = split_name(p)
        except PluginRejected:
            continue
        found.append((worker, span))
        if span is not None:
            spans[worker].append(span)
    out: dict[tuple[str, str | None], str | None] = {}
    for worker, span in found:
        out[(worker, span)] = None if span is None else str(sorted(spans[worker]).index(span) + 1)
    return out


def _parse_one(path: Path, cache_dir: str, worker: str, span: str | None):
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    # Exactly RunLoader._process_data (minus the remote cache and the mp.Queue).
    data = RunProfileData.parse(worker, span, str(path), cache_dir)  # runs process() + analyze()
    profile = RunGenerator(worker, span, data).generate_run_profile()
    return data, profile


def parse_trace(
    path: str | os.PathLike,
    *,
    span: str | None = None,
    allowed_warnings: Iterable[str] = (),
    cache_dir: str | None = None,
):
    """Parse one trace file as the plugin does; return its ``torch_tb_profiler.run.RunProfile``.

    ``span`` defaults to the index the plugin's loader gives the file in its directory. Raises
    :class:`PluginRejected` if the parser raises, logs a warning/error (minus ``allowed_warnings``
    regexes), produces no profile, or finds no ``ProfilerStep`` / operator to show.
    """
    path = Path(path)
    worker, raw_span = split_name(path)
    if span is None and raw_span is not None:
        span = _span_indexes(path.parent).get((worker, raw_span))
    own_cache = cache_dir is None
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="tbcheck-")
    try:
        with _plugin_log() as log:
            try:
                data, profile = _parse_one(path, cache_dir, worker, span)
            except Exception as ex:
                lines = "\n  ".join(log.lines())
                raise PluginRejected(
                    f"torch-tb-profiler failed to parse {path}: {type(ex).__name__}: {ex}"
                    + (f"\n  plugin log:\n  {lines}" if lines else "")
                ) from ex
        _check_log(log, str(path), allowed_warnings)
        if profile is None or not profile.views:
            raise PluginRejected(f"torch-tb-profiler produced no profile/views for {path}")
        if not data.events or not profile.tid2tree:
            raise PluginRejected(f"torch-tb-profiler found no events/operators in {path}")
        if profile.trace_file_path != str(path):
            # The parser re-encodes a file it could not read as strict JSON into a temp file.
            raise PluginRejected(f"torch-tb-profiler had to re-encode {path} (invalid JSON)")
        return profile
    finally:
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)


def views(profile) -> list[str]:
    """Display names of the views the plugin offers for a ``RunProfile``, a ``Run`` or a file path."""
    if isinstance(profile, (str, os.PathLike)):
        profile = parse_trace(profile)
    return [v.display_name for v in profile.views]


def load_run_dir(directory: str | os.PathLike, *, allowed_warnings: Iterable[str] = ()):
    """Load one run directory as ``RunLoader.load`` does (in process); return the plugin's ``Run``.

    Includes the Distributed view (``DistributedRunProfile``, worker ``"All"``) when every worker
    of a span has communication ops. Raises :class:`PluginRejected` on any file the plugin would drop.
    """
    from torch_tb_profiler.profiler.data import DistributedRunProfileData
    from torch_tb_profiler.profiler.loader import RunLoader
    from torch_tb_profiler.run import Run

    directory = Path(directory)
    name = directory.name
    cache_dir = tempfile.mkdtemp(prefix="tbcheck-")
    try:
        indexes = _span_indexes(directory)
        if not indexes:
            raise PluginRejected(f"{directory} holds no trace file: the plugin would not list it as a run")
        run, distributed = Run(name, str(directory)), Run(name, str(directory))
        for (worker, raw_span), span in sorted(indexes.items(), key=lambda kv: (kv[0][0], str(kv[1]))):
            suffix = "" if raw_span is None else f".{raw_span}"
            matches = [
                p
                for p in directory.iterdir()
                if re.fullmatch(re.escape(worker + suffix) + r"\.pt\.trace\.json(\.gz)?", p.name)
            ]
            for path in matches:
                with _plugin_log() as log:
                    try:
                        data, profile = _parse_one(path, cache_dir, worker, span)
                    except Exception as ex:
                        raise PluginRejected(
                            f"torch-tb-profiler failed to parse {path}: {type(ex).__name__}: {ex}"
                        ) from ex
                _check_log(log, str(path), allowed_warnings)
                run.add_profile(profile)
                distributed.add_profile(DistributedRunProfileData(data))
        loader = RunLoader.__new__(RunLoader)  # only _process_spans: no mp.Queue needed
        loader.run_name = name
        with _plugin_log() as log:
            for d in loader._process_spans(distributed):
                if d is not None:
                    run.add_profile(d)
        _check_log(log, f"run {directory}", allowed_warnings)
        return run
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def exercise_views(profile) -> dict[str, Any]:
    """Call what the plugin's HTTP routes call for each view of ``profile``; return the payloads.

    Raises :class:`PluginRejected` when a route would answer 500 (or an empty view).
    """
    from torch_tb_profiler.run import RunProfile

    if not isinstance(profile, RunProfile):
        raise TypeError(f"expected a RunProfile, got {type(profile).__name__}")
    names = views(profile)
    out: dict[str, Any] = {}
    calls = {
        OVERVIEW: lambda: profile.overview,
        OPERATOR: lambda: (profile.operation_pie_by_name, profile.operation_table_by_name),
        TRACE: lambda: Path(profile.trace_file_path).stat().st_size,
        MEMORY: lambda: (profile.get_memory_stats(), profile.get_memory_curve(), profile.get_memory_events()),
        MODULE: lambda: (profile.get_module_view(), profile.get_operator_tree()),
        LIGHTNING: lambda: (profile.get_module_view(), profile.get_operator_tree()),
        KERNEL: lambda: (profile.kernel_pie, profile.kernel_table),
    }
    with _plugin_log() as log:
        for view in names:
            if view not in calls:
                continue
            try:
                out[view] = calls[view]()
            except Exception as ex:
                raise PluginRejected(f"the plugin's {view} view fails: {type(ex).__name__}: {ex}") from ex
            if not out[view]:
                raise PluginRejected(f"the plugin's {view} view is empty")
    # Memory-route warnings ('Address ... freed multiple times') are data-quality hints, not failures.
    _check_log(log, "the view routes", allowed_warnings=[r"freed multiple times"])
    return out


# --------------------------------------------------------------------------- live TensorBoard
# The plugin routes the frontend calls to render each view (besides /workers and /spans).
VIEW_ROUTES = {
    OVERVIEW: ("overview",),
    OPERATOR: ("operation", "operation/table"),
    KERNEL: ("kernel", "kernel/table", "kernel/tc_pie"),
    TRACE: ("trace",),
    MEMORY: ("memory", "memory_curve", "memory_events"),
    MODULE: ("module", "tree"),
    LIGHTNING: ("module", "tree"),
}
DISTRIBUTED_ROUTES = ("distributed/gpuinfo", "distributed/overlap", "distributed/waittime", "distributed/commops")
_URL_LINE = re.compile(r"TensorBoard \S+ at (http://127\.0\.0\.1:(\d+)/)")


class TensorBoardServer:
    """A real ``tensorboard`` process serving ``logdir`` on 127.0.0.1 (OS-chosen port).

    ``with TensorBoardServer(logdir) as tb: tb.get_json("runs")``. The server's stdout+stderr go to
    ``tb.log_path``; :meth:`log_text` / :meth:`plugin_problems` read them (inside the ``with``; the
    files are removed on exit unless ``keep_files``). The process is always stopped on exit
    (SIGTERM to its process group, then SIGKILL after ``stop_timeout`` s).
    """

    def __init__(
        self,
        logdir: str | os.PathLike,
        *,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        extra_args: Iterable[str] = (),
        python: str = sys.executable,
        keep_files: bool = False,
    ) -> None:
        self.logdir = str(logdir)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args)
        self.python = python
        self.keep_files = keep_files  # keep log_path (and the plugin's cache dir) after __exit__
        self.proc: subprocess.Popen | None = None
        self.base_url: str | None = None
        self.port: int | None = None
        self._tmp = tempfile.mkdtemp(prefix="tbserver-")
        self.log_path = Path(self._tmp) / "tensorboard.log"
        self._log_file = None

    # -- lifecycle
    def __enter__(self) -> TensorBoardServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if not self.keep_files:
            self.cleanup()

    def start(self) -> None:
        cmd = [
            self.python,
            "-m",
            "tensorboard.main",
            "--logdir",
            self.logdir,
            "--host",
            "127.0.0.1",
            "--port",
            "0",  # TensorBoard >= 2.x: 0 = OS-chosen port, printed on the URL line
            "--load_fast",
            "false",  # no Rust data server subprocess
            "--reload_interval",
            "1",  # scalars only: the profiler plugin rescans every 10 s regardless
            *self.extra_args,
        ]
        env = dict(os.environ)
        env.setdefault("TORCH_PROFILER_LOG_LEVEL", "INFO")
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = self._tmp  # TensorBoard's .tensorboard-info and the plugin's cache stay ours
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 (open while the server runs; stop() closes it)
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own group: the plugin's spawned loaders die with it
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tensorboard exited with {self.proc.returncode} before serving:\n{self.log_text()[-3000:]}"
                )
            if self.base_url is None:
                match = _URL_LINE.search(self.log_text())
                if match:
                    self.base_url, self.port = match.group(1).rstrip("/"), int(match.group(2))
            if self.base_url is not None:
                try:
                    self.get_raw("/data/plugins_listing", timeout=2)
                    return
                except (OSError, urllib.error.URLError):
                    pass
            time.sleep(0.2)
        raise TimeoutError(f"tensorboard did not answer within {self.start_timeout} s:\n{self.log_text()[-3000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)  # the group we created: tensorboard + its loader processes
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            # Loader children may outlive a killed parent in the same group: reap the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -- logs
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def plugin_problems(self) -> list[str]:
        """Server log lines where the plugin reports a rejected file or event."""
        return [line for line in self.log_text().splitlines() if _PROBLEM_LOG.search(line)]

    # -- HTTP
    def get_raw(self, path: str, params: dict | None = None, timeout: float = 30.0) -> tuple[bytes, dict]:
        """GET ``path`` (absolute, or relative to the plugin API); body (gunzipped) and headers."""
        if self.base_url is None:
            raise RuntimeError("server not started")
        if not path.startswith("/"):
            path = f"{API}/{path}"
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            headers = dict(response.headers.items())
        if headers.get("Content-Encoding", "").lower() == "gzip" or body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        return body, headers

    def get_json(self, path: str, params: dict | None = None, timeout: float = 30.0) -> Any:
        body, _ = self.get_raw(path, params, timeout)
        return json.loads(body)

    def runs(self) -> dict:
        """``{"runs": [...], "loading": bool}``"""
        return self.get_json("runs")

    def views(self, run: str) -> list[str]:
        return self.get_json("views", {"run": run})

    def workers(self, run: str, view: str) -> list[str]:
        return self.get_json("workers", {"run": run, "view": view})

    def spans(self, run: str, worker: str) -> list[str] | None:
        return self.get_json("spans", {"run": run, "worker": worker})

    def trace(self, run: str, worker: str, span: str | None) -> dict:
        body, _ = self.get_raw("trace", {"run": run, "worker": worker, "span": span}, timeout=120)
        return json.loads(body)

    def check_view_routes(self, run: str, worker: str, span: str | None) -> dict[str, Any]:
        """GET every route behind every view ``/views`` offers for ``run``; return route -> JSON.

        Raises :class:`PluginRejected` naming the route on an HTTP error (the server log has the
        traceback) or an empty answer.
        """
        out: dict[str, Any] = {}
        for view in self.views(run):
            routes = DISTRIBUTED_ROUTES if view == DISTRIBUTED else VIEW_ROUTES.get(view, ())
            for route in routes:
                if route in out:
                    continue
                params = {"run": run, "worker": "All" if view == DISTRIBUTED else worker, "span": span}
                try:
                    out[route] = self.get_json(route, params, timeout=120)
                except urllib.error.HTTPError as ex:
                    raise PluginRejected(f"{view} view: /{route} {params} -> HTTP {ex.code}") from ex
                if not out[route] and route not in ("distributed/gpuinfo",):
                    raise PluginRejected(f"{view} view: /{route} {params} answered {out[route]!r}")
        return out

    def wait_for_runs(
        self, expected_count: int, timeout: float = 60.0, interval: float = 0.5, on_poll=None
    ) -> list[str]:
        """Poll ``/runs`` until it lists >= ``expected_count`` runs and is not loading; return them.

        ``on_poll(runs_list)`` is called after each poll (e.g. to check each new run at once).
        """
        deadline = time.monotonic() + timeout
        last: dict = {}
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"tensorboard is not running:\n{self.log_text()[-3000:]}")
            try:
                last = self.runs()
            except (OSError, urllib.error.URLError):
                last = {}
            names = list(last.get("runs", []))
            if on_poll is not None:
                on_poll(names)
            if len(names) >= expected_count and not last.get("loading", True):
                return names
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"after {timeout} s the plugin lists {names} (loading={last.get('loading')}), "
                    f"expected {expected_count} run(s); plugin problems: {self.plugin_problems()}"
                )
            time.sleep(interval)


ANNOTATION_PREFIXES = ("[pl][", "ProfilerStep#")


def is_annotation(event: dict) -> bool:
    """record_function-style spans written as ``cpu_op`` (Lightning's ``[pl][...]`` for the
    Lightning view, ``ProfilerStep#N``): they open in one Python call and close in another, so
    they cannot nest inside Python frames."""
    return str(event.get("name", "")).startswith(ANNOTATION_PREFIXES)


def nesting_report(
    trace: dict, *, python_cat: str = "FEE", torch_cat: str = "cpu_op", tolerance_us: float = 0.0
) -> dict[str, int]:
    """How Python (``python_cat``) and torch (``torch_cat``) ``X`` events of each thread nest.

    Returns counts over all threads: ``shared_threads`` (pid/tid holding both kinds),
    ``torch_ops`` on those threads, ``torch_in_python`` (ops inside some Python call),
    ``crossings`` (a Python call and a torch op that overlap without one containing the other by
    more than ``tolerance_us``: what a misaligned clock shows as in Perfetto / the trace viewer).
    Annotations (:func:`is_annotation`) are left out and counted in ``annotations``.
    """
    threads: dict[tuple, list[dict]] = defaultdict(list)
    annotations = 0
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") in (python_cat, torch_cat):
            if event.get("cat") == torch_cat and is_annotation(event):
                annotations += 1
                continue
            threads[(event.get("pid"), event.get("tid"))].append(event)
    report = {"shared_threads": 0, "torch_ops": 0, "torch_in_python": 0, "crossings": 0, "annotations": annotations}
    for events in threads.values():
        cats = {e["cat"] for e in events}
        if cats != {python_cat, torch_cat}:
            continue
        report["shared_threads"] += 1
        events.sort(key=lambda e: (e["ts"], -e["dur"], e["cat"] != python_cat))
        stack: list[tuple[float, bool]] = []  # (end, is_python)
        python_open = 0
        for e in events:
            start, end, is_py = e["ts"], e["ts"] + e["dur"], e["cat"] == python_cat
            while stack and stack[-1][0] <= start + tolerance_us:
                python_open -= stack.pop()[1]
            if stack and end > stack[-1][0] + tolerance_us and is_py != stack[-1][1]:
                report["crossings"] += 1
            if not is_py:
                report["torch_ops"] += 1
                report["torch_in_python"] += python_open > 0
            stack.append((end, is_py))
            python_open += is_py
    return report
