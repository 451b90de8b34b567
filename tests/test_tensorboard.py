"""Our trace files in the REAL TensorBoard PyTorch Profiler plugin (torch-tb-profiler 0.4.3).

* ``test_traces_parse_in_plugin``: a real Lightning run in process; every window's file goes through
  the plugin's own parser and run generator (tests/support/tbcheck.py) and offers Overview, Operator, Trace
  and Memory, with Python calls (cat FEE) and torch ops (cat cpu_op) on one thread.
* ``test_live_tensorboard`` (slow): a real ``tensorboard`` serves the still-empty root, training
  runs in a subprocess, and the plugin's HTTP API must list every window (only ever complete ones)
  and serve views, workers, spans and the trace itself.

Can also be run as a script: ``python tests/test_tensorboard.py ROOT [MAX_STEPS]`` trains the tiny
model with the test schedule under ROOT (used by the live test's subprocess).
"""

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

SCHEDULE = dict(wait=1, warmup=1, active=2, repeat=2)
MAX_STEPS = 10
# wait=1, warmup=1, active=2, repeat=2 over global batches 0..9 -> windows on batches 2-3 and 6-7.
EXPECTED_WINDOWS = 2
REQUIRED_VIEWS = {tbcheck.OVERVIEW, tbcheck.OPERATOR, tbcheck.TRACE, tbcheck.MEMORY}


# --------------------------------------------------------------------------- a tiny training run
def train_tiny(root: str | os.PathLike, max_steps: int = MAX_STEPS, **callback_kwargs):
    """Fit a tiny model on random CPU data with VizTraceCallback; return the callback."""
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from vt_lightning import VizTraceCallback

    def python_side_work(x: torch.Tensor) -> torch.Tensor:  # shows as a Python (FEE) span
        scale = sum(i * 0.001 for i in range(200))
        return x * (1.0 + scale / 1000)

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(python_side_work(x)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=16)
    callback = VizTraceCallback(**{**SCHEDULE, **callback_kwargs})
    trainer = L.Trainer(
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=True,
        log_every_n_steps=1,
    )
    trainer.fit(Tiny(), data)
    return callback


def _check_trace_content(trace: dict, where: str) -> None:
    cats = tbcheck.event_categories(trace)
    assert cats.get("FEE", 0) > 0, f"{where}: no Python (VizTracer, cat FEE) events; X categories: {cats}"
    assert cats.get("cpu_op", 0) > 0, f"{where}: no torch ops (cat cpu_op); X categories: {cats}"
    names = {e.get("name") for e in trace["traceEvents"] if e.get("cat") == "FEE"}
    assert any("python_side_work" in str(n) for n in names), f"{where}: the user's Python function is missing"
    nesting = tbcheck.nesting_report(trace, tolerance_us=1.0)
    assert nesting["shared_threads"] >= 1, f"{where}: Python calls and torch ops never share a thread: {nesting}"
    assert nesting["crossings"] == 0, f"{where}: Python calls and torch ops overlap without nesting: {nesting}"
    assert nesting["torch_in_python"] >= 0.99 * nesting["torch_ops"], (
        f"{where}: torch ops of the training thread are not inside Python calls: {nesting}"
    )


# --------------------------------------------------------------------------- in-process parsing
@pytest.fixture(scope="module")
def trained_root(tmp_path_factory) -> Path:
    """One in-process training run shared by the in-process tests of this module."""
    root = tmp_path_factory.mktemp("tb_inproc")
    train_tiny(root)
    return root


def test_traces_parse_in_plugin(trained_root):
    files = tbcheck.trace_files(trained_root)
    assert len(files) == EXPECTED_WINDOWS, f"expected {EXPECTED_WINDOWS} window traces, found {files}"
    assert len({f.parent for f in files}) == len(files), "each window must be a run directory of its own"
    leftovers = [p for p in trained_root.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left behind: {leftovers}"

    for path in files:
        where = str(path.relative_to(trained_root))
        trace = tbcheck.load_json(path)
        assert tbcheck.contract_problems(trace) == [], where

        profile = tbcheck.parse_trace(path)  # raises with the plugin's log lines if it rejects the file
        offered = set(tbcheck.views(profile))
        assert offered >= REQUIRED_VIEWS, f"{where}: plugin offers {sorted(offered)}"
        tbcheck.exercise_views(profile)  # what the HTTP routes compute, for each offered view

        run = tbcheck.load_run_dir(path.parent)  # the whole run directory, as the loader sees it
        assert run.workers == [profile.worker] and run.get_spans(profile.worker) == ["1"], where
        assert {v.display_name for v in run.views} >= REQUIRED_VIEWS, where

        _check_trace_content(trace, where)


def test_trace_files_readable_like_the_other_logs(trained_root):
    """TensorBoard often runs as another user (shared server): our files must get the same
    permission bits as the event files Lightning writes next to them (i.e. respect the umask)."""
    events = sorted(trained_root.rglob("events.out.tfevents.*"))
    assert events, "Lightning wrote no TensorBoard event file to compare with"
    reference = events[0].stat().st_mode & 0o777
    for path in tbcheck.trace_files(trained_root):
        mode = path.stat().st_mode & 0o777
        assert mode == reference, (
            f"{path.name} has mode {mode:o}, Lightning's {events[0].name} has {reference:o}: "
            "a TensorBoard server running as another user cannot read it"
        )


# --------------------------------------------------------------------------- live server
def _complete_on_disk(path: Path) -> bool:
    try:
        json.loads(gzip.decompress(path.read_bytes()))
        return True
    except (OSError, EOFError, ValueError, zlib.error):
        return False


@pytest.mark.slow
@pytest.mark.system
def test_live_tensorboard(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    script = Path(__file__).resolve()
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
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            with open(tmp_path / "train.log", "wb") as train_log:
                trainer = subprocess.Popen(
                    [sys.executable, str(script), str(root), str(MAX_STEPS)],
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
                _check_trace_content(answers["trace"], f"/trace {run}")
            assert tb.plugin_problems() == [], "\n".join(tb.plugin_problems())
        except BaseException:
            sys.stderr.write(f"--- tensorboard log ---\n{tb.log_text()[-5000:]}\n")
            raise


if __name__ == "__main__":
    train_tiny(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else MAX_STEPS)
