"""The ``vt-lightning`` command on files it must not trust, and ``view``'s server (issue 22, items
12 and 13). Every scenario runs the real command in a subprocess and asserts its exit status, what
it printed and a generous wall-time bound; memory is the subprocess's own peak RSS."""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.paths import REPO

from vt_lightning.analysis.summary import summarize
from vt_lightning.export.reading import DEFAULT_MEMORY_BUDGET, SUMMARY_MAX_BYTES, parsed_size_bound

COMMAND = [sys.executable, "-m", "vt_lightning"]
# rich styles nothing when stdout is a pipe, unless told to: every ESC byte would then be ours.
ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "CLICOLOR_FORCE")}
ENV |= {"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUTF8": "1"}
GIB = 1 << 30
SUMMARY_NAME = "h_0.0000000005.summary.jsonc"
TRACE_NAME = "h_0.0000000005.pt.trace.json.gz"


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*COMMAND, *args], capture_output=True, timeout=timeout, cwd=REPO, env=ENV)


def _x(name: str, ts: float, dur: float, cat: str, thread: tuple[int, int] = (1, 1), **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": thread[0], "tid": thread[1]}
    if args:
        event["args"] = args
    return event


def _trace(function: str = "training_step", op: str = "aten::addmm") -> dict[str, Any]:
    """Two steps with a Lightning stage, user functions, ops and kernels: every summary list filled."""
    user = "/home/me/train.py"
    events = [
        _x("ProfilerStep#5", 0.0, 1000.0, "user_annotation"),
        _x("ProfilerStep#6", 1000.0, 1000.0, "user_annotation"),
        _x("[pl][profile][_TrainingEpochLoop].train_dataloader_next", 1000.0, 300.0, "cpu_op"),
        _x("[pl][profile][Strategy]S.training_step", 1300.0, 400.0, "cpu_op"),
        _x(f"load_batch ({user}:3)", 1000.0, 300.0, "FEE"),
        _x(f"{function} ({user}:10)", 1300.0, 400.0, "FEE"),
        _x("aten::linear", 1310.0, 50.0, "cpu_op"),
        _x(op, 1320.0, 30.0, "cpu_op"),
        _x("cudaLaunchKernel", 1330.0, 5.0, "cuda_runtime", correlation=42),
        _x("gemm_kernel", 1340.0, 200.0, "kernel", thread=(0, 7), correlation=42),
    ]
    window = {"window": 0, "worker": "h_0", "span": "0000000005", "global_rank": 0}
    return {"vt_lightning": window, "traceEvents": events}


def _write_trace(path: Path, trace: dict[str, Any]) -> Path:
    path.write_bytes(gzip.compress(orjson.dumps(trace)))
    return path


@pytest.fixture(scope="module")
def good_summary() -> dict[str, Any]:
    summary = summarize(_trace())
    assert summary["top_python"]["by_inclusive"] and summary["top_ops"]["by_cpu"] and summary["gpu"]
    return summary


@pytest.fixture
def good_file(tmp_path: Path, good_summary: dict[str, Any]) -> Path:
    (tmp_path / "good").mkdir()
    path = tmp_path / "good" / SUMMARY_NAME
    path.write_bytes(orjson.dumps(good_summary))
    return path


def _fresh(summary: dict[str, Any]) -> dict[str, Any]:
    """A copy as a file holds it: no list shared between two fields (summarize shares some)."""
    return orjson.loads(orjson.dumps(summary))


def _no_traceback(proc: subprocess.CompletedProcess[bytes]) -> str:
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "Traceback" not in proc.stdout.decode(), stderr
    return stderr


# --------------------------------------------------------------------------------------------------
# Schema-checked reads: 9 fields x 3 wrong types, for `summary` and `diff`
# --------------------------------------------------------------------------------------------------

BAD_VALUES = {  # values of the wrong type for each kind of field
    "int": ["text", 7.5, True],
    "number": ["text", [1], True],
    "string": [7.5, ["a"], None],
    "list": ["text", 7.5, {"k": 1}],
    "object": ["text", [1], 7.5],
}
FIELDS = {
    "schema": "int",
    "window.index": "int",
    "steps.recorded": "list",
    "steps.counted.0": "int",
    "step_ms.mean": "number",
    "breakdown_ms": "object",
    "breakdown_ms.forward": "number",
    "top_python.by_inclusive.0.function": "string",
    "top_ops.by_cpu.0.self_cpu_ms": "number",
}
CASES = [(field, bad) for field, kind in FIELDS.items() for bad in BAD_VALUES[kind]]


def _set(summary: dict[str, Any], field: str, value: Any) -> None:
    *parents, last = field.split(".")
    node: Any = summary
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize(("field", "bad"), CASES, ids=[f"{f}={orjson.dumps(b).decode()}" for f, b in CASES])
def test_a_wrongly_typed_field_is_one_line_naming_file_and_field(
    tmp_path: Path, good_summary: dict[str, Any], good_file: Path, field: str, bad: Any
) -> None:
    assert len(CASES) == 27
    summary = _fresh(good_summary)
    _set(summary, field, bad)
    path = tmp_path / SUMMARY_NAME
    path.write_bytes(orjson.dumps(summary))
    for args in (["summary", str(path)], ["summary", str(path), "--json"], ["diff", str(path), str(good_file)]):
        started = time.monotonic()
        proc = _run(*args)
        assert time.monotonic() - started < 60
        stderr = _no_traceback(proc)
        assert proc.returncode == 1, (args, stderr)
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert str(path) in stderr and f"field {field}: expected" in stderr, stderr
        assert proc.stdout == b""


@pytest.mark.parametrize("field", ["steps", "step_ms.mean", "top_python.by_inclusive.0.calls", "gpu.busy_percent"])
def test_a_missing_field_is_named(tmp_path: Path, good_summary: dict[str, Any], field: str) -> None:
    summary = _fresh(good_summary)
    *parents, last = field.split(".")
    node: Any = summary
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    del node[last]
    path = tmp_path / SUMMARY_NAME
    path.write_bytes(orjson.dumps(summary))
    proc = _run("summary", str(path))
    stderr = _no_traceback(proc)
    assert proc.returncode == 1 and f"{path}: field {field}: missing" in stderr, stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[1, 2]", "not a vt_lightning file"),
        (b'{"schema": 1', "not valid JSON"),
        (b'{"window": {}}', "no 'schema' field"),
        (b'{"schema": 99}', "newer vt_lightning"),
        (b"", "not valid JSON"),
    ],
)
def test_not_a_summary_at_all(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / SUMMARY_NAME
    path.write_bytes(content)
    proc = _run("summary", str(path))
    stderr = _no_traceback(proc)
    assert proc.returncode == 1 and str(path) in stderr and says in stderr, stderr


def test_in_a_directory_a_bad_summary_is_skipped_with_a_warning(tmp_path: Path, good_summary: dict[str, Any]) -> None:
    run = tmp_path / "run"
    for index, window in enumerate(["window_000", "window_001", "window_002"]):
        (run / window).mkdir(parents=True)
        summary = _fresh(good_summary)
        summary["window"]["index"] = index
        if index == 1:
            summary["step_ms"]["mean"] = "slow"
        (run / window / SUMMARY_NAME).write_bytes(orjson.dumps(summary))
    proc = _run("summary", str(run), "--json")
    stderr = _no_traceback(proc)
    assert proc.returncode == 1  # something was refused, though the rest is shown
    assert [w["window"]["index"] for w in orjson.loads(proc.stdout)] == [0, 2]
    assert "skipped" in stderr and "window_001" in stderr and "field step_ms.mean" in stderr
    proc = _run("diff", str(run / "window_000"), str(run))  # a run with a bad window: diffed without it
    assert proc.returncode == 1 and b"B: " in proc.stdout and b"(2 window(s))" in proc.stdout
    assert "window_001" in _no_traceback(proc)


def test_a_broken_summary_beside_its_trace_gives_way_to_the_trace(tmp_path: Path) -> None:
    window = tmp_path / "run" / "window_000"
    window.mkdir(parents=True)
    trace = _write_trace(window / TRACE_NAME, _trace())
    (window / SUMMARY_NAME).write_bytes(b'{"schema": 1, "steps": 5}')
    for target in (tmp_path / "run", trace):  # a directory scan, and the trace named on the command line
        proc = _run("summary", str(target), "--json")
        stderr = _no_traceback(proc)
        assert proc.returncode == 1  # the broken file is reported...
        assert stderr.count("skipped") == 1 and f"{window / SUMMARY_NAME}: field " in stderr, stderr
        (summary,) = orjson.loads(proc.stdout)  # ...and the window is summarised from its trace
        assert summary["window"]["trace"] == TRACE_NAME and summary["steps"]["counted"] == [6]


def test_a_path_the_system_refuses_is_one_line(tmp_path: Path) -> None:
    proc = _run("summary", str(tmp_path / ("a" * 5000)))
    stderr = _no_traceback(proc)
    assert proc.returncode == 1 and len(stderr.splitlines()) == 1 and "too long" in stderr


def test_a_trace_with_wrongly_typed_events_is_refused_not_a_traceback(tmp_path: Path) -> None:
    trace = _trace()
    trace["traceEvents"][1]["ts"] = "soon"
    trace["traceEvents"].append({"ph": "X", "name": ["a"], "dur": {}, "ts": None})
    path = _write_trace(tmp_path / TRACE_NAME, trace)
    proc = _run("summary", str(path))
    stderr = _no_traceback(proc)
    assert proc.returncode == 1 and str(path) in stderr, stderr


# --------------------------------------------------------------------------------------------------
# Regular files only
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifos_and_directories_named_like_our_files_never_block(tmp_path: Path, good_summary: dict[str, Any]) -> None:
    run = tmp_path / "run"
    (run / "window_000").mkdir(parents=True)
    (run / "window_001").mkdir()
    (run / "window_002" / SUMMARY_NAME).mkdir(parents=True)  # a directory named like a summary
    os.mkfifo(run / "window_000" / SUMMARY_NAME)
    os.mkfifo(run / "window_000" / TRACE_NAME)
    (run / "window_001" / SUMMARY_NAME).write_bytes(orjson.dumps(good_summary))
    fifo_summary, fifo_trace = run / "window_000" / SUMMARY_NAME, run / "window_000" / TRACE_NAME
    for args in (
        ["summary", str(fifo_summary)],
        ["summary", str(fifo_trace)],
        ["diff", str(fifo_summary), str(run / "window_001")],
        ["view", str(fifo_trace), "--no-browser"],
    ):
        started = time.monotonic()
        proc = _run(*args, timeout=60)  # a blocked open would hang here until the timeout
        assert time.monotonic() - started < 30
        stderr = _no_traceback(proc)
        assert proc.returncode == 1, (args, stderr)
        assert "named pipe (FIFO), not a regular file" in stderr and "window_000" in stderr, stderr
    started = time.monotonic()
    proc = _run("summary", str(run), "--json", timeout=60)
    assert time.monotonic() - started < 30
    stderr = _no_traceback(proc)
    assert proc.returncode == 1 and len(orjson.loads(proc.stdout)) == 1  # the one real window
    assert stderr.count("named pipe (FIFO)") == 2 and "a directory, not a regular file" in stderr, stderr
    proc = _run("view", str(run / "window_000"), "--no-browser", timeout=60)  # only a FIFO trace there
    assert proc.returncode == 1 and "no vt_lightning traces" in _no_traceback(proc)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / SUMMARY_NAME).symlink_to("/dev/zero")
    (tmp_path / TRACE_NAME).symlink_to("/dev/zero")
    for name in (SUMMARY_NAME, TRACE_NAME):
        proc = _run("summary", str(tmp_path / name), timeout=60)
        assert proc.returncode == 1 and "character device, not a regular file" in _no_traceback(proc)


# --------------------------------------------------------------------------------------------------
# Bounded reads: gzip bombs refused within the budget, peak RSS of the command under 1 GB
# --------------------------------------------------------------------------------------------------

PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(peak * (1 if sys.platform == 'darwin' else 1024), code)\n"
)


def _peak_rss(*args: str, timeout: float = 120) -> tuple[int, int, str]:
    """(peak RSS in bytes of the command alone, its exit status, its stderr), measured by a fresh
    parent whose only child it is."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *COMMAND, *args], capture_output=True, timeout=timeout, cwd=REPO, env=ENV
    )
    peak, code = proc.stdout.split()
    return int(peak), int(code), proc.stderr.decode()


def _gzip_stream(path: Path, head: bytes, filler: bytes, inflated: int, tail: bytes) -> Path:
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(head)
        block = filler * ((1 << 20) // len(filler))
        for _ in range(inflated // len(block)):
            f.write(block)
        f.write(tail)
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bombs")
    return {
        # 1.25 GiB of JSON whitespace: over every cap (the budget, 1 GiB for view); ~1.3 MB on disk.
        "spaces": _gzip_stream(root / "a.pt.trace.json.gz", b'{"traceEvents": [', b" ", GIB + GIB // 4, b"]}"),
        # 256 MiB of `0,`: a list of 134M ints, ~45x its size once parsed (~11 GB) if it were.
        "zeros": _gzip_stream(root / "b.pt.trace.json.gz", b'{"traceEvents": [', b"0,", GIB // 4, b"0]}"),
    }


@pytest.mark.parametrize("bomb", ["spaces", "zeros"])
def test_a_gzip_bomb_is_refused_within_the_memory_budget(bombs: dict[str, Path], bomb: str) -> None:
    path = bombs[bomb]
    assert path.stat().st_size < 8 << 20
    started = time.monotonic()
    peak, code, stderr = _peak_rss("summary", str(path))
    assert time.monotonic() - started < 90
    assert code == 1 and "Traceback" not in stderr
    budget = f"{DEFAULT_MEMORY_BUDGET >> 20} MiB memory budget"
    assert str(path) in stderr and budget in stderr and "--max-memory-mb" in stderr, stderr
    assert peak < GIB, f"peak RSS {peak / GIB:.2f} GiB"


# Shapes that take the most memory per byte once parsed (CPython 3.11: 20-45x), each sized to just
# under the default budget, so the bound on parsed size is what keeps the peak under 1 GB.
DENSE = {
    "ints": b"0",
    "short strings": b'"ab"',
    "astral strings": '"\U0001f600aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"'.encode(),
    "one-key objects": b'{"a":0}',
    "nested lists": b"[[[[[]]]]]",
    # 2 MiB strings, each made 4 bytes a character by its last one: half the 1 MiB chunks read are ASCII.
    "wide strings across chunks": b'"' + b"a" * (2 << 20) + "\U0001f600".encode() + b'"',
}


@pytest.mark.parametrize("shape", list(DENSE))
def test_a_file_just_under_the_budget_stays_under_1_gb(tmp_path: Path, shape: str) -> None:
    item = DENSE[shape]
    count = int(0.97 * DEFAULT_MEMORY_BUDGET / (parsed_size_bound(b"," + item) + len(item) + 1))
    path = tmp_path / TRACE_NAME
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents":[' + b",".join([item] * count) + b"]}")
    peak, code, stderr = _peak_rss("summary", str(path))
    # Parsed in full (not refused by the budget); whether it then makes a summary depends on the shape.
    assert "Traceback" not in stderr and "memory budget" not in stderr, stderr
    assert code == 0 or "not a trace vt-lightning can summarise" in stderr, stderr
    assert peak < GIB, f"peak RSS {peak / GIB:.2f} GiB"


def test_a_smaller_budget_refuses_sooner(bombs: dict[str, Path]) -> None:
    peak, code, stderr = _peak_rss("summary", str(bombs["spaces"]), "--max-memory-mb", "64")
    assert code == 1 and "64 MiB memory budget" in stderr, stderr
    assert peak < 256 << 20, f"peak RSS {peak >> 20} MiB"


def test_an_oversized_summary_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / SUMMARY_NAME
    path.write_bytes(b'{"schema": 2, "pad": "' + b"a" * SUMMARY_MAX_BYTES + b'"}')
    peak, code, stderr = _peak_rss("summary", str(path))
    assert code == 1 and "Traceback" not in stderr and f"{path}: refused, larger than 16 MiB" in stderr, stderr
    assert peak < 256 << 20


def test_view_refuses_a_bomb_after_streaming_it_not_holding_it(bombs: dict[str, Path]) -> None:
    started = time.monotonic()
    peak, code, stderr = _peak_rss("view", str(bombs["spaces"]), "--no-browser")
    assert time.monotonic() - started < 90
    assert code == 1 and "more than 1024 MiB of JSON" in stderr, stderr
    assert peak < 256 << 20, f"peak RSS {peak >> 20} MiB"


# --------------------------------------------------------------------------------------------------
# Control characters escaped in everything printed
# --------------------------------------------------------------------------------------------------

EVIL = "\x1b[31mEVIL\x1b[0m\x1b]0;pwned\x07\r\x9b2J\u202e"


def _hostile_run(root: Path, good_summary: dict[str, Any]) -> Path:
    """A run dir (its name too) with a summary and a summary-less trace, ANSI in every name."""
    run = root / f"run{EVIL}"
    (run / "window_000").mkdir(parents=True)
    (run / "window_001").mkdir()
    summary = _fresh(good_summary)
    summary["window"]["worker"] = f"h{EVIL}"
    summary["top_python"]["by_inclusive"][0]["function"] = f"step{EVIL}"
    summary["top_python"]["by_inclusive"][0]["origin"] = "user"
    summary["top_python"]["by_self"][0]["function"] = f"self{EVIL}"
    summary["top_ops"]["by_cpu"][0]["name"] = f"aten::{EVIL}"
    summary["gpu"]["idle_gaps"][0]["python"] = f"gap{EVIL}"
    summary["breakdown_ms"][f"part{EVIL}"] = 1.0
    summary["steps"]["ms"][f"9{EVIL}"] = 1.0
    (run / "window_000" / SUMMARY_NAME).write_bytes(orjson.dumps(summary))
    _write_trace(run / "window_001" / f"h{EVIL}.0000000009.pt.trace.json.gz", _trace(f"fn{EVIL}", f"op{EVIL}"))
    return run


def _assert_escaped(proc: subprocess.CompletedProcess[bytes]) -> None:
    output = proc.stdout + proc.stderr
    assert output.count(b"\x1b") == 0 and output.count(b"\xc2\x9b") == 0 and b"\r" not in output
    assert output.count("\u202e".encode()) == 0 and output.count(b"\x07") == 0
    assert b"Traceback" not in output


def test_ansi_names_print_escaped(tmp_path: Path, good_summary: dict[str, Any]) -> None:
    run = _hostile_run(tmp_path, good_summary)
    proc = _run("summary", str(run))
    assert proc.returncode == 0, proc.stderr
    _assert_escaped(proc)
    text = proc.stdout.decode()
    assert "step\\x1b[31mEVIL\\x1b[0m" in text and "aten::\\x1b[31mEVIL" in text  # shown, escaped
    assert "fn\\x1b[31mEVIL" in text and "\\x9b2J\\u202e" in text and "\\r" in text
    proc = _run("summary", str(run), "--json")
    assert proc.returncode == 0
    _assert_escaped(proc)
    names = [w["top_python"]["by_inclusive"][0]["function"] for w in orjson.loads(proc.stdout)]
    assert any(EVIL in name for name in names)  # --json: the same strings, JSON-escaped
    proc = _run("diff", str(run / "window_000"), str(run / "window_001"))
    assert proc.returncode == 0, proc.stderr
    _assert_escaped(proc)
    assert "op\\x1b[31mEVIL" in proc.stdout.decode() and "fn\\x1b[31mEVIL" in proc.stdout.decode()


def test_ansi_names_print_escaped_without_rich(tmp_path: Path, good_summary: dict[str, Any]) -> None:
    run = _hostile_run(tmp_path, good_summary)
    no_rich = (
        "import sys; sys.modules['rich'] = None; from vt_lightning.cli.command import console_main; console_main()"
    )
    for args in (["summary", str(run)], ["diff", str(run / "window_000"), str(run / "window_001")]):
        proc = subprocess.run(
            [sys.executable, "-c", no_rich, *args], capture_output=True, timeout=60, cwd=REPO, env=ENV
        )
        assert proc.returncode == 0, proc.stderr
        _assert_escaped(proc)
        assert "\u2500".encode() not in proc.stdout  # rich's rule: the plain-text tables ran


def test_errors_print_escaped(tmp_path: Path, good_summary: dict[str, Any]) -> None:
    summary = _fresh(good_summary)
    summary["step_ms"]["mean"] = f"w{EVIL}"
    path = tmp_path / f"x{EVIL}.summary.jsonc"
    path.write_bytes(orjson.dumps(summary))
    proc = _run("summary", str(path))
    assert proc.returncode == 1
    _assert_escaped(proc)
    stderr = proc.stderr.decode()
    assert "x\\x1b[31mEVIL" in stderr and "field step_ms.mean" in stderr and "\\x9b2J" in stderr, stderr


# --------------------------------------------------------------------------------------------------
# view: the real server, a real HTTP client
# --------------------------------------------------------------------------------------------------


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _listening_addresses(port: int) -> list[str]:
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # TCP_LISTEN
            out.append(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def test_view_serves_only_its_random_url_and_no_cross_origin_header(tmp_path: Path) -> None:
    trace_path = _write_trace(tmp_path / TRACE_NAME, _trace())
    proc = subprocess.Popen(
        [*COMMAND, "view", str(trace_path), "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=ENV,
    )
    try:
        assert proc.stdout is not None
        lines: list[bytes] = []
        deadline = time.monotonic() + 60
        url = None
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(rb"http://127\.0\.0\.1:(\d+)/([A-Za-z0-9_-]+)/", line)
            url = found.group(0).decode() if found else None
        assert url, (lines, proc.poll())
        port, token = int(found.group(1)), found.group(2).decode()
        assert port != 9001 and len(token) >= 40  # a random port and 256 random bits in the path
        if Path("/proc/net/tcp").exists():
            assert _listening_addresses(port) == ["127.0.0.1"]

        status, headers, page = _get(url, Origin="https://evil.example")
        assert status == 200 and b"Perfetto UI" in page
        assert "Access-Control-Allow-Origin" not in headers and headers["Cross-Origin-Resource-Policy"] == "same-origin"
        _, _, route = _get(url + "vt_route.js")  # the page's route, from a script of the same origin
        trace_url = re.search(rb"'(/[A-Za-z0-9_-]+/trace/[^']+)'", route)
        assert trace_url, route[:2000]
        status, headers, body = _get(f"http://127.0.0.1:{port}{trace_url.group(1).decode()}", Origin="null")
        assert status == 200 and body == trace_path.read_bytes()
        assert not any(name.lower().startswith("access-control") for name in headers)
        bundle = re.search(rb'"stable":"([^"]+)"', page)
        if bundle:  # an asset of the Perfetto UI, under the same prefix
            status, headers, _ = _get(f"{url}{bundle.group(1).decode()}/frontend_bundle.js")
            assert status == 200 and headers["Content-Type"].startswith("text/javascript")

        base = f"http://127.0.0.1:{port}"
        for wrong in (
            "/",
            "/index.html",
            "/localtrace",
            "/file_info",
            "/vizviewer_info",
            f"/{token[:-1]}/",
            f"/{token}x/",
            f"/x/{token}/",
            f"/{token}/trace/other.json.gz",
            f"/{token}/../{token}/",
            f"/{token}/%2e%2e/%2e%2e/etc/passwd",
            f"/{token}/trace_processor",
        ):
            status, headers, _ = _get(base + wrong, Origin="https://evil.example")
            assert status == 404, wrong
            assert "Access-Control-Allow-Origin" not in headers
        preflight = urllib.request.Request(url, method="OPTIONS", headers={"Origin": "https://evil.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(preflight, timeout=30)
        assert "Access-Control-Allow-Origin" not in refused.value.headers

        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 30
        assert b"stopped" in proc.stdout.read()
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
