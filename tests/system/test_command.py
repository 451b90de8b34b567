"""The ``vt-lightning`` command on the example's real output: summary, diff, view, and its errors."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import pytest
from conftest import recorded_name
from support.paths import REPO

from vt_lightning.analysis.schema import SCHEMA_VERSION

COMMAND = [sys.executable, "-m", "vt_lightning"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("example")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "train.py"),
            "--root",
            str(root),
            "--max-steps",
            "12",
            "--batch-size",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "lightning_logs" / "version_0", proc.stdout + proc.stderr  # the commands are logged


def test_the_example_prints_its_summary_table(example_run: tuple[Path, str]) -> None:
    _, stdout = example_run
    assert "where the step went" in stdout
    assert "data" in stdout and "fwd" in stdout and "bwd" in stdout
    # Commands that work without an activated venv: this interpreter's absolute path.
    assert f"{sys.executable} -m vt_lightning summary" in stdout


def test_summary_prints_every_window(example_run: tuple[Path, str]) -> None:
    logdir, _ = example_run
    proc = _run("summary", str(logdir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("### vt_lightning window") == 2
    assert recorded_name("TinyTransformer.training_step") in proc.stdout
    proc = _run("summary", str(logdir), "--json")
    windows = orjson.loads(proc.stdout)
    assert [w["window"]["index"] for w in windows] == [0, 1]
    assert all(w["schema"] == SCHEMA_VERSION and w["steps"]["recorded"] for w in windows)


def test_summary_of_a_trace_without_summary_is_computed(example_run: tuple[Path, str], tmp_path: Path) -> None:
    logdir, _ = example_run
    trace = sorted(logdir.rglob("*.pt.trace.json.gz"))[0]
    copy = tmp_path / trace.name
    copy.write_bytes(trace.read_bytes())
    proc = _run("summary", str(copy), "--json")
    assert proc.returncode == 0, proc.stderr
    (computed,) = orjson.loads(proc.stdout)
    written = orjson.loads(trace.with_name(trace.name.replace(".pt.trace.json.gz", ".summary.jsonc")).read_bytes())
    assert computed["breakdown_ms"] == written["breakdown_ms"]


def test_diff_names_what_changed(example_run: tuple[Path, str]) -> None:
    logdir, _ = example_run
    first, second = sorted(p for p in logdir.iterdir() if p.name.startswith("window_"))
    proc = _run("diff", str(first), str(second), "--json")
    assert proc.returncode == 0, proc.stderr
    result = orjson.loads(proc.stdout)
    a = orjson.loads(next(first.glob("*.summary.jsonc")).read_bytes())
    b = orjson.loads(next(second.glob("*.summary.jsonc")).read_bytes())
    assert result["step"]["delta_ms"] == pytest.approx(b["step_ms"]["mean"] - a["step_ms"]["mean"], abs=1e-3)
    parts = {row["name"]: row for row in result["breakdown"]}
    assert parts["forward"]["delta_ms"] == pytest.approx(
        b["breakdown_ms"]["forward"] - a["breakdown_ms"]["forward"], abs=1e-3
    )
    assert result["python"] and result["ops"]
    assert all(abs(r["delta_ms"]) >= abs(s["delta_ms"]) for r, s in itertools.pairwise(result["ops"]))
    proc = _run("diff", str(first), str(logdir))  # a window against a whole run
    assert proc.returncode == 0, proc.stderr
    assert "breakdown" in proc.stdout and "Python functions" in proc.stdout and "%" in proc.stdout


def test_view_serves_perfetto_on_loopback_and_stops_on_ctrl_c(example_run: tuple[Path, str]) -> None:
    logdir, _ = example_run
    proc = subprocess.Popen(
        [*COMMAND, "view", str(logdir), "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "http://127.0.0.1:" in line:
                url = line.split()[1]
                break
        assert url, (lines, proc.stderr.read() if proc.poll() is not None else "")
        latest = sorted(logdir.rglob("*.pt.trace.json.gz"), key=lambda p: p.stat().st_mtime)[-1]
        assert str(latest.resolve()) in "".join(lines)
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            assert b"perfetto" in response.read().lower()
        port = urllib.parse.urlsplit(url).port  # the URL has a random path after the port
        if Path("/proc/net/tcp").exists():
            assert _listening_addresses(port) == ["127.0.0.1"]  # loopback only (vizviewer binds 0.0.0.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - started < 20
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _listening_addresses(port: int) -> list[str]:
    """IPv4 addresses with a socket listening on ``port``, from /proc/net/tcp (Linux)."""
    table = Path("/proc/net/tcp")
    if not table.exists():
        return []
    out = []
    for line in table.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # TCP_LISTEN
            out.append(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


@pytest.mark.parametrize("kind", ["missing", "empty", "not a trace", "bad gzip"])
def test_bad_targets_get_one_line_and_a_nonzero_exit(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "x"
    if kind == "empty":
        target.mkdir()
    elif kind == "not a trace":
        target = tmp_path / "notes.txt"
        target.write_text("hello")
    elif kind == "bad gzip":
        target = tmp_path / "h_0.0000000001.pt.trace.json.gz"
        target.write_bytes(b"not gzip")
    for command in (
        ["summary", str(target)],
        ["view", str(target), "--no-browser"],
        ["diff", str(target), str(target)],
    ):
        proc = _run(*command, timeout=60)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and str(target.name) in proc.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "vt-lightning"
    assert script.is_file()
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "summary" in proc.stdout and "diff" in proc.stdout and "view" in proc.stdout


def test_tables_fall_back_to_plain_text_without_rich(example_run: tuple[Path, str], monkeypatch, capsys) -> None:
    """rich is optional (installing it switches Lightning's progress bar): plain text then."""
    from vt_lightning.cli.command import load_windows
    from vt_lightning.export import report

    logdir, _ = example_run
    monkeypatch.setattr(report, "rich_available", lambda: False)
    report.print_windows_table(load_windows(str(logdir)))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "vt_lightning: where the step went (ms per step)"
    assert lines[1].split() == ["win", "batches", "step", "data", "fwd", "bwd", "optim", "other", "peak", "MB"]
    assert [line.split()[0] for line in lines[3:5]] == ["0", "1"]
    assert recorded_name("TinyTransformer.training_step") in out and "[bold]" not in out
