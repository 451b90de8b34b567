"""The ``vt_lightning`` TensorBoard tab's routes, through TensorBoard's own WSGI routing, in process,
over the files of one real Trainer run (a seeded slow ``Dataset.__getitem__``): what they answer,
that new windows appear without a restart, the same numbers as ``vt-lightning diff``, and hostile
paths and files (traversal, symlinks out of the log dir, a FIFO, a mistyped summary) refused with a
400 or 404, never a file and never a hang. The browser tests are in tests/system/test_tb_tab.py."""

from __future__ import annotations

import concurrent.futures
import gzip
import importlib.metadata
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import recorded_name
from support import tab_run
from support.tab_run import input_bound_run
from tensorboard.backend.application import TensorBoardWSGI
from tensorboard.backend.security_validator import SecurityValidatorMiddleware
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from vt_lightning.cli.command import main
from vt_lightning.constants import SUMMARY_JSON_SUFFIX
from vt_lightning.tensorboard import scan
from vt_lightning.tensorboard.plugin import PLUGIN_NAME, VtLightningPlugin

API = f"/data/plugin/{PLUGIN_NAME}"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two windows of one real run, under ``lightning_logs/version_0``."""
    root = tmp_path_factory.mktemp("tb_plugin")
    input_bound_run(root)
    return root


def _client(logdir: Path) -> tuple[Client, VtLightningPlugin]:
    plugin = VtLightningPlugin(base_plugin.TBContext(logdir=str(logdir)))
    return Client(TensorBoardWSGI([plugin])), plugin


def _get(client: Client, route: str, **params: Any) -> tuple[int, Any]:
    response = client.get(f"{API}/{route}", query_string=params)
    body = response.get_data()
    ctype = response.headers.get("Content-Type", "")
    return response.status_code, orjson.loads(body) if ctype.startswith("application/json") else body


def _run(logdir: Path) -> str:
    (run,) = {p.parent.parent.relative_to(logdir).as_posix() for p in logdir.rglob(f"*{SUMMARY_JSON_SUFFIX}")}
    return run


def test_registered_for_tensorboard_with_its_frontend_in_the_package() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="tensorboard_plugins") if e.name == PLUGIN_NAME]
    assert entry.load() is VtLightningPlugin
    plugin = VtLightningPlugin(base_plugin.TBContext(logdir=None))
    assert plugin.frontend_metadata().es_module_path == "/index.js"
    client = Client(TensorBoardWSGI([plugin]))
    script = client.get(f"{API}/index.js")
    assert script.status_code == 200 and "export async function render" in script.get_data(as_text=True)
    urls = set(re.findall(r"https?://[^'\"` ]+", script.get_data(as_text=True)))
    assert urls == {"http://www.w3.org/2000/svg"}, "no CDN: the SVG namespace is a name, never fetched"
    assert client.get(f"{API}/runs").status_code == 404  # no --logdir: said, not a traceback


def test_an_empty_log_dir_lists_no_runs_and_keeps_the_tab_inactive(tmp_path: Path) -> None:
    client, plugin = _client(tmp_path)
    assert _get(client, "runs")[1]["runs"] == []
    assert not plugin.is_active()
    (tmp_path / "version_0" / "window_000-batches_2-4").mkdir(parents=True)
    assert _get(client, "runs")[1]["runs"] == [{"run": "version_0", "windows": 1}]  # no restart
    assert plugin.is_active()
    assert _get(client, "windows", run="version_0")[1]["windows"][0]["state"] == "empty"


def test_windows_of_the_run_with_the_verdict_and_the_users_line(logdir: Path) -> None:
    client, plugin = _client(logdir)
    status, runs = _get(client, "runs")
    assert status == 200 and runs["runs"] == [{"run": _run(logdir), "windows": 2}]
    assert plugin.is_active()
    status, page = _get(client, "windows", run=_run(logdir))
    assert status == 200 and page["total"] == 2
    assert [w["name"] for w in page["windows"]] == ["window_000-batches_2-4", "window_001-batches_7-9"]
    for row in page["windows"]:
        summary = orjson.loads(next((logdir / row["run"] / row["name"]).glob(f"*{SUMMARY_JSON_SUFFIX}")).read_bytes())
        step = summary["step_ms"]
        assert (row["step_mean_ms"], row["step_p50_ms"], row["step_max_ms"]) == (step["mean"], step["p50"], step["max"])
        assert row["step_min_ms"] == step.get("min")  # absent before the writer records it
        assert (row["stage"], row["trigger"], row["state"]) == ("fit", "schedule", "complete")
        assert row["verdicts"][0]["kind"] == "input_bound"

    status, window = _get(client, "window", run=_run(logdir), name="window_000-batches_2-4")
    (rank,) = window["ranks"]
    verdict = rank["summary"]["verdicts"][0]
    where = verdict["where"][0]
    assert (verdict["kind"], where["function"], where["file"]) == (
        "input_bound",
        recorded_name("SlowRows.__getitem__"),
        tab_run.SOURCE,
    )
    assert rank["trace"]["bytes"] == (logdir / rank["trace"]["path"]).stat().st_size
    inflated = len(gzip.decompress((logdir / rank["trace"]["path"]).read_bytes()))
    assert rank["trace"]["json_bytes"] == inflated  # the size shown before opening
    assert rank["memory"]["path"].endswith(".memory_snapshot.pickle")

    trace = client.get(f"{API}/file/{rank['trace']['path']}")
    assert trace.status_code == 200 and trace.get_data() == (logdir / rank["trace"]["path"]).read_bytes()
    ui = client.get(f"{API}/perfetto/index.html")
    assert ui.status_code == 200 and b"Perfetto" in ui.get_data()
    assert "default-src 'self'" in ui.headers["Content-Security-Policy"]


def test_diff_has_the_numbers_of_the_command(logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client, _ = _client(logdir)
    run = _run(logdir)
    a, b = f"{run}/window_000-batches_2-4", f"{run}/window_001-batches_7-9"
    status, answer = _get(client, "diff", a=a, b=b)
    assert status == 200
    capsys.readouterr()
    assert main(["diff", str(logdir / a), str(logdir / b), "--json"]) == 0
    command = json.loads(capsys.readouterr().out)
    for key in ("step", "breakdown", "user_python", "python", "ops", "verdicts", "a_windows", "b_windows"):
        assert answer[key] == command[key], key
    status, whole = _get(client, "diff", a=run, b=run)
    assert status == 200 and whole["a_windows"] == 2 and whole["step"]["delta_ms"] == 0


def test_new_windows_appear_without_a_restart_and_writing_ones_say_so(logdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    client, _ = _client(root)
    run = _run(root)
    assert _get(client, "runs")[1]["runs"][0]["windows"] == 2
    shutil.copytree(root / run / "window_001-batches_7-9", root / run / "window_002-slow_step-batches_12-14")
    writing = root / run / "window_003-batches_17-19"
    writing.mkdir()
    (writing / ".vm_0.0000000017.pt.trace.json.gz.vm-1.abc.tmp").write_bytes(b"partial")
    assert _get(client, "runs")[1]["runs"][0]["windows"] == 4
    rows = {w["name"]: w for w in _get(client, "windows", run=run)[1]["windows"]}
    assert rows["window_002-slow_step-batches_12-14"]["trigger"] == "slow_step"
    assert rows["window_002-slow_step-batches_12-14"]["state"] == "complete"
    assert rows["window_003-batches_17-19"]["state"] == "writing"
    (writing / ".vm_0.0000000017.pt.trace.json.gz.vm-1.abc.tmp").rename(writing / "vm_0.0000000017.pt.trace.json.gz")
    assert _get(client, "window", run=run, name=writing.name)[1]["state"] == "writing"  # trace, summary to come
    _, page = _get(client, "windows", run=run, offset=1, limit=2)
    assert [w["name"] for w in page["windows"]] == ["window_001-batches_7-9", "window_002-slow_step-batches_12-14"]


def test_hostile_paths_and_files_get_an_error_never_a_file(logdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    run = _run(root)
    secret = tmp_path / "secret.pt.trace.json.gz"
    secret.write_bytes(gzip.compress(b'{"secret": 1}'))
    window = root / run / "window_000-batches_2-4"
    (window / "evil_0.0000000002.pt.trace.json.gz").symlink_to(secret)  # a symlink out of the log dir
    (root / run / "window_007-batches_1-2").symlink_to(tmp_path, target_is_directory=True)
    fifo_window = root / run / "window_008-batches_1-2"
    fifo_window.mkdir()
    os.mkfifo(fifo_window / "vm_0.0000000001.pt.trace.json.gz")
    os.mkfifo(fifo_window / "vm_0.0000000001.summary.jsonc")
    mistyped_window = root / run / "window_009-batches_1-2"
    shutil.copytree(root / run / "window_001-batches_7-9", mistyped_window)
    (summary_path,) = mistyped_window.glob(f"*{SUMMARY_JSON_SUFFIX}")
    data = orjson.loads(summary_path.read_bytes())
    data["step_ms"]["mean"] = "fast"
    summary_path.write_bytes(orjson.dumps(data))
    client, _ = _client(root)

    def status_of(path: str, **params: Any) -> int:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a FIFO opened blocking would hang here
            return pool.submit(lambda: client.get(f"{API}/{path}", query_string=params).status_code).result(timeout=20)

    for path in (
        "file/../../../../etc/passwd",
        "file/%2e%2e/%2e%2e/etc/passwd",
        f"file/{run}/window_000-batches_2-4/../../../../etc/passwd",
        "file//etc/passwd",
        f"file/{run}/window_000-batches_2-4/evil_0.0000000002.pt.trace.json.gz",  # symlink out
        f"file/{run}/window_007-batches_1-2/secret.pt.trace.json.gz",  # through a symlinked directory
        f"file/{run}/window_008-batches_1-2/vm_0.0000000001.pt.trace.json.gz",  # a FIFO
        f"file/{run}/window_000-batches_2-4/vm_0.0000000002.summary.md",  # not a file the tab serves
        f"file/{run}/window_000-batches_2-4/.hidden.pt.trace.json.gz",
        "perfetto/../../../../etc/passwd",
        "perfetto/%2e%2e/index.html",
    ):
        assert status_of(path) in (400, 404), path
    assert status_of("windows", run="../..") == 400
    assert status_of("windows", run="/etc") == 404
    assert status_of("window", run=run, name="window_007-batches_1-2") == 404  # not followed
    assert status_of("window", run=run, name="../window_000-batches_2-4") == 404
    assert status_of("windows", run=run, limit="lots") == 400
    assert status_of("source", run=run, name="window_000-batches_2-4", worker="vm_0", file="/etc/passwd", line=1) == 404
    assert status_of("diff", a="..", b=run) == 400

    rows = {w["name"]: w for w in _get(client, "windows", run=run)[1]["windows"]}
    assert "window_007-batches_1-2" not in rows  # a symlinked directory is not listed
    assert "step_ms.mean: expected a number" in rows["window_009-batches_1-2"]["error"]
    assert "step_mean_ms" not in rows["window_009-batches_1-2"]
    assert rows["window_008-batches_1-2"]["workers"] == 0  # FIFOs are no one's files
    _, detail = _get(client, "window", run=run, name="window_009-batches_1-2")
    assert "step_ms.mean: expected a number" in detail["ranks"][0]["error"]
    ranks = _get(client, "window", run=run, name="window_000-batches_2-4")[1]["ranks"]
    assert [r["worker"] for r in ranks] == ["vm_0"]  # a symlinked file is no one's trace
    status, answer = _get(client, "diff", a=run, b=run)
    assert status == 200 and answer["a_windows"] == 2  # the mistyped summary skipped, and said
    assert any("step_ms.mean" in s for s in answer["skipped"])


def test_memory_stays_bounded_by_its_caches(logdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "logs"
    run_dir = root / "run"
    source = logdir / _run(logdir) / "window_000-batches_2-4"
    for i in range(30):
        shutil.copytree(source, run_dir / f"window_{i:03d}-batches_{i}-{i}", ignore=shutil.ignore_patterns("*.gz"))
    monkeypatch.setattr(scan, "MAX_ROWS", 8)
    monkeypatch.setattr(scan, "MAX_SUMMARIES", 4)
    client, plugin = _client(root)
    assert plugin.index is not None
    _, page = _get(client, "windows", run="run")
    assert page["total"] == 30 and len(page["windows"]) == 30
    for i in range(10):
        assert _get(client, "window", run="run", name=f"window_{i:03d}-batches_{i}-{i}")[0] == 200
    assert len(plugin.index.rows) == 8 and len(plugin.index.summaries) == 4
    assert all(w["state"] == "no trace" for w in page["windows"])  # summaries kept, traces left out


def test_the_job_file_and_the_stragglers_line_are_served(logdir: Path, tmp_path: Path) -> None:
    """A DDP window's rank-0 summary names its job file and the straggler's line (the job file's
    format: docs/distributed.md); the tab offers the job file to Perfetto and shows that line."""
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    run = _run(root)
    window = root / run / "window_000-batches_2-4"
    (summary_path,) = window.glob(f"*{SUMMARY_JSON_SUFFIX}")
    summary = orjson.loads(summary_path.read_bytes())
    straggler_line = summary["verdicts"][0]["where"][0]["line"] + 1
    summary["job"] = {
        "file": "job/job.0000000002.json.gz",
        "world_size": 2,
        "ranks": [
            {"rank": 0, "host": "vm", "offset_us": 0.0, "uncertainty_us": 0.0, "same_host": True},
            {"rank": 1, "host": "vm", "offset_us": 12.5, "uncertainty_us": 40.0, "same_host": True},
        ],
        "max_exit_residual_us": 55.0,
        "straggler": {
            "rank": 1,
            "others_wait_ms": 20.0,
            "step_ms": 50.0,
            "share_of_step": 0.4,
            "function": "SlowRows.__getitem__",
            "file": tab_run.SOURCE,
            "line": straggler_line,
            "excess_ms": 19.0,
        },
        "reduced_ranks": [],
    }
    summary_path.write_bytes(orjson.dumps(summary))
    (window / "job").mkdir()
    job_bytes = gzip.compress(b'{"traceEvents": []}' + b" " * 4000)
    (window / "job" / "job.0000000002.json.gz").write_bytes(job_bytes)
    client, _ = _client(root)
    _, detail = _get(client, "window", run=run, name=window.name)
    (rank,) = detail["ranks"]
    assert rank["job"] == {
        "path": f"{run}/{window.name}/job/job.0000000002.json.gz",
        "bytes": len(job_bytes),
        "json_bytes": 4019,
    }
    assert client.get(f"{API}/file/{rank['job']['path']}").get_data() == job_bytes
    assert client.get(f"{API}/file/{run}/{window.name}/job/job.0000000002.ranks.json").status_code == 404


def test_a_fault_in_a_route_is_one_error_answer_and_the_tab_goes_on(
    logdir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = _client(logdir)
    run = _run(logdir)

    def broken(self: Any, *args: Any) -> Any:
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(scan.LogIndex, "page", broken)
    status, body = _get(client, "windows", run=run)
    assert status == 500
    assert body == {"error": "vt_lightning failed to answer (ZeroDivisionError: injected); please report it"}
    assert any("windows route failed" in r.getMessage() and r.exc_info for r in caplog.records)  # for a report
    monkeypatch.undo()
    status, body = _get(client, "windows", run=run)
    assert status == 200 and body["windows"]  # the next request is answered


def test_every_page_and_answer_passes_tensorboards_security_validator(
    logdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TensorBoard 3.0 turns its validator's warnings into errors: the Perfetto pages' policy allows
    scripts from 'self' and the loader's hash only, and every answer is typed and ``nosniff``."""
    plugin = VtLightningPlugin(base_plugin.TBContext(logdir=str(logdir)))
    client = Client(SecurityValidatorMiddleware(TensorBoardWSGI([plugin])))
    run = _run(logdir)
    window = _get(client, "window", run=run, name="window_000-batches_2-4")[1]
    with caplog.at_level(logging.WARNING, logger="tensorboard"):
        for path in (
            "perfetto/index.html",
            "perfetto/no-such-asset.js",
            "index.js",
            "style.css",
            "runs",
            f"windows?run={run}",
            f"file/{window['ranks'][0]['trace']['path']}",
            "no-such-route",
        ):
            response = client.get(f"{API}/{path}")
            assert response.status_code in (200, 404), path
            response.close()
    assert [r.getMessage() for r in caplog.records if "will become an error" in r.getMessage()] == []
    policy = client.get(f"{API}/perfetto/index.html").headers["Content-Security-Policy"]
    scripts = re.search(r"script-src ([^;]+)", policy)
    assert scripts and scripts[1].startswith("'self' 'unsafe-eval' 'sha256-")
    assert "blob:" not in policy.split("img-src")[0] and "'unsafe-inline'" not in scripts[1]


def test_source_lines_come_from_the_summary_and_no_route_reads_a_file(logdir: Path, tmp_path: Path) -> None:
    """The plugin reads no source file: a summary naming any file gets, for it, only whether it
    changed since (a stat) and the lines the summary itself holds."""
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    run = _run(root)
    window = root / run / "window_000-batches_2-4"
    (summary_path,) = window.glob(f"*{SUMMARY_JSON_SUFFIX}")
    user = tmp_path / "train.py"
    user.write_text("def train():\n    pass\n")
    info = user.stat()
    summary = orjson.loads(summary_path.read_bytes())
    summary["verdicts"][0]["where"] = [{"function": "x", "file": "/etc/passwd", "line": 1}]
    summary["sources"] = {
        "files": {
            str(user): {"mtime_ns": info.st_mtime_ns, "size": info.st_size, "lines": {"1": "def train():"}},
            str(tmp_path / "gone.py"): {"mtime_ns": 1, "size": 1, "lines": {"1": "x = 1"}},
            "/etc/passwd": {"mtime_ns": 1, "size": 1, "lines": {}},
        },
        "truncated": False,
    }
    summary_path.write_bytes(orjson.dumps(summary))
    client, plugin = _client(root)
    assert "/source" not in plugin.get_plugin_apps()
    status, detail = _get(client, "window", run=run, name=window.name)
    assert status == 200
    assert detail["ranks"][0]["sources"] == {
        str(user): "same",
        str(tmp_path / "gone.py"): "not here",
        "/etc/passwd": "changed",
    }
    first = Path("/etc/passwd").read_text().splitlines()[0]
    assert first.encode() not in client.get(f"{API}/window", query_string={"run": run, "name": window.name}).get_data()
    user.write_text("# a line added\ndef train():\n    pass\n")
    assert _get(client, "window", run=run, name=window.name)[1]["ranks"][0]["sources"][str(user)] == "changed"


def test_a_memory_view_is_served_within_its_bounds(logdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    run = _run(root)
    window = root / run / "window_000-batches_2-4"
    (summary_path,) = window.glob(f"*{SUMMARY_JSON_SUFFIX}")
    view_path = window / summary_path.name.replace(".summary.jsonc", ".memory_view.jsonc")
    client, _ = _client(root)
    view = {"schema": 1, "steps": {"2": [1.0, 2.0]}, "devices": {"cpu": {"peak_bytes": 8, "points": [[1.0, 8]]}}}
    for written, answer in (
        (orjson.dumps(view), view),
        (orjson.dumps({"schema": 2, "devices": {}}), "not a memory view this version reads"),
        (b"{" * (scan.MEMORY_VIEW_MAX_BYTES + 1), "not a memory view this version reads"),
        (b"not json", "not readable"),
    ):
        view_path.write_bytes(written)
        got = _get(client, "window", run=run, name=window.name)[1]["ranks"][0]["memory_view"]
        assert got == answer if isinstance(answer, dict) else answer in got["error"], got
