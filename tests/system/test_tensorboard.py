"""Our trace files in a live TensorBoard with the REAL PyTorch Profiler plugin (torch-tb-profiler
0.4.3): a real ``tensorboard`` serves the still-empty root, training runs in a subprocess
(tests/support/plugin_run.py), and the plugin's HTTP API must list every window (only ever
complete ones) and serve views, workers, spans and the trace itself."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from support import tbcheck
from support.paths import TESTS
from support.plugin_run import EXPECTED_WINDOWS, MAX_STEPS, REQUIRED_VIEWS, check_trace_content


# --------------------------------------------------------------------------- live server
def _complete_on_disk(path: Path) -> bool:
    try:
        json.loads(gzip.decompress(path.read_bytes()))
        return True
    except (OSError, EOFError, ValueError, zlib.error):
        return False


@pytest.mark.slow
def test_live_tensorboard(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    partial_on_disk: list[str] = []  # files visible under their final name but incomplete
    checked_files: set[tuple] = set()
    first_seen: dict[str, dict] = {}  # run -> what the API said the moment it appeared
    bad_runs: list[str] = []

    def inspect(tb: tbcheck.TensorBoardServer, runs: list[str]) -> None:
        for path in tbcheck.trace_files(root):
            stat = path.stat()
            key = (str(path), stat.st_size, stat.st_mtime_ns)
            if key not in checked_files:
                checked_files.add(key)
                if not _complete_on_disk(path):
                    partial_on_disk.append(f"{path.relative_to(root)} ({stat.st_size} bytes)")
        for run in runs:
            if run in first_seen:
                continue
            views = tb.views(run)
            workers = tb.workers(run, tbcheck.TRACE) if tbcheck.TRACE in views else []
            first_seen[run] = {"views": views, "workers": workers}
            if not set(views) >= REQUIRED_VIEWS or not workers:
                bad_runs.append(f"{run}: views={views} workers={workers}")

    with tbcheck.TensorBoardServer(root) as tb:
        try:
            assert tb.runs()["runs"] == []
            path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
            env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)
            with open(tmp_path / "train.log", "wb") as train_log:
                trainer = subprocess.Popen(
                    [sys.executable, "-m", "support.plugin_run", str(root), str(MAX_STEPS)],
                    stdout=train_log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
                try:
                    deadline = time.monotonic() + 90
                    while trainer.poll() is None and time.monotonic() < deadline:
                        inspect(tb, tb.runs()["runs"])
                        time.sleep(0.25)
                finally:
                    if trainer.poll() is None:
                        trainer.kill()
                    trainer.wait(timeout=10)
            train_text = (tmp_path / "train.log").read_text(errors="replace")
            assert trainer.returncode == 0, f"training failed:\n{train_text[-4000:]}"

            files = tbcheck.trace_files(root)
            assert len(files) == EXPECTED_WINDOWS, f"expected {EXPECTED_WINDOWS} windows, found {files}"
            expected_runs = sorted(str(f.parent.relative_to(root)) for f in files)

            # The plugin rescans every 10 s (hard-coded); loading takes ~1 s per run.
            runs = tb.wait_for_runs(len(expected_runs), timeout=40, on_poll=lambda r: inspect(tb, r))
            assert sorted(runs) == expected_runs
            assert not partial_on_disk, f"trace files visible while incomplete: {partial_on_disk}"
            assert not bad_runs, f"runs listed by the plugin without a usable profile: {bad_runs}"
            assert tb.plugin_problems() == [], "\n".join(tb.plugin_problems())

            for run in runs:
                views = tb.views(run)
                assert set(views) >= REQUIRED_VIEWS, f"{run}: {views}"
                workers = tb.workers(run, tbcheck.TRACE)
                assert len(workers) == 1, f"{run}: workers {workers}"
                worker = workers[0]
                assert worker == tbcheck.split_name(next(f for f in files if str(f.parent.relative_to(root)) == run))[0]
                for view in (tbcheck.OVERVIEW, tbcheck.OPERATOR, tbcheck.MEMORY):
                    assert tb.workers(run, view) == workers, f"{run}: {view} workers"
                spans = tb.spans(run, worker)
                assert spans == ["1"], f"{run}: spans {spans}"
                answers = tb.check_view_routes(run, worker, spans[0])  # every route of every view
                assert answers["overview"].get("steps"), f"{run}: overview without steps"
                assert answers["operation/table"]["data"], f"{run}: empty operator table"
                assert answers["memory_curve"]["rows"], f"{run}: empty memory curve"
                check_trace_content(answers["trace"], f"/trace {run}")
            assert tb.plugin_problems() == [], "\n".join(tb.plugin_problems())
        except BaseException:
            sys.stderr.write(f"--- tensorboard log ---\n{tb.log_text()[-5000:]}\n")
            raise
