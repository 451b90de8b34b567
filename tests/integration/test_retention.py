"""``keep_windows`` (issue 28): only the newest K windows of this run stay on disk. Only windows this
run wrote and finished are deleted, only their own files; a foreign window, one being written and
another rank's file survive, and the end of the run still counts every window."""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MarkerModel, loader, make_trainer, trace_files
from fsspec import filesystem
from lightning.pytorch.loggers import TensorBoardLogger

from vt_lightning import VizTraceCallback
from vt_lightning.controller.retention import Retention
from vt_lightning.export.job import WindowResult

WINDOWS = 10
KEEP = 3


LIFTED = dict(budget_windows=None, budget_output_mb=None, budget_time_share=None)  # a window at every batch


def fit(root: Path, caplog: pytest.LogCaptureFixture, **kwargs) -> VizTraceCallback:
    cb = VizTraceCallback(
        wait=0, warmup=0, active=1, repeat=0, keep_windows=KEEP, memory_snapshot=False, **LIFTED, **kwargs
    )
    with warnings.catch_warnings(), caplog.at_level(logging.INFO):
        warnings.simplefilter("ignore")
        make_trainer(root, [cb], max_steps=WINDOWS).fit(MarkerModel(), loader(n=4 * WINDOWS))
    return cb


def test_only_this_runs_finished_windows_are_deleted_and_the_end_counts_them_all(tmp_path, caplog):
    log_dir = tmp_path / "logs"
    # A window directory of another run (same naming): never ours to delete.
    foreign = log_dir / "window_999-batches_999-999"
    foreign.mkdir(parents=True)
    (foreign / "otherhost_0.0000000999.pt.trace.json.gz").write_bytes(b"foreign")
    # One being written (a writer's hidden temporary, no result yet): never deleted.
    writing = log_dir / "window_050-batches_50-50"
    writing.mkdir()
    (writing / ".host_0.0000000050.pt.trace.json.gz.host-1.abc.tmp").write_bytes(b"half")
    # Another rank's file in the directory our window 0 goes to (DDP ranks share window directories).
    shared = log_dir / "window_000-batches_0-0"
    shared.mkdir()
    (shared / "otherhost_1.0000000000.pt.trace.json.gz").write_bytes(b"rank 1")

    cb = fit(tmp_path, caplog, dirpath=str(log_dir))

    ours = [p for p in trace_files(log_dir) if not p.name.startswith("otherhost")]
    assert sorted(p.parent.name for p in ours) == [f"window_{i:03d}-batches_{i}-{i}" for i in range(7, 10)]
    assert (foreign / "otherhost_0.0000000999.pt.trace.json.gz").read_bytes() == b"foreign"
    assert (writing / ".host_0.0000000050.pt.trace.json.gz.host-1.abc.tmp").exists()
    assert sorted(p.name for p in shared.iterdir()) == ["otherhost_1.0000000000.pt.trace.json.gz"]
    for i in range(1, 7):  # our own directories, emptied: gone
        assert not (log_dir / f"window_{i:03d}-batches_{i}-{i}").exists()
    assert [r.trace_path.parent.name for r in cb.results] == [f"window_{i:03d}-batches_{i}-{i}" for i in range(7, 10)]

    # The end of the run counts every window, the deleted ones too, and its full table lists them.
    said = f"{WINDOWS} window trace(s) in {log_dir} ({WINDOWS - KEEP} older ones deleted by keep_windows)"
    assert said in caplog.text
    table = (log_dir / "vt_lightning.windows.txt").read_text().splitlines()
    assert f"all {WINDOWS} windows" in table[0] and f"{WINDOWS - KEEP} of them deleted" in table[0]
    assert [line.split("\t")[0] for line in table[2 : 2 + WINDOWS]] == [str(i) for i in range(WINDOWS)]


def test_no_keep_windows_keeps_every_window(tmp_path, caplog):
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=0, memory_snapshot=False, **LIFTED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_trainer(tmp_path, [cb], max_steps=6).fit(MarkerModel(), loader(n=24))
    assert len(trace_files(tmp_path)) == 6


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_a_bad_keep_windows_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="`keep_windows`"):
        VizTraceCallback(keep_windows=bad)


def test_retention_asks_for_the_oldest_finished_windows_only(tmp_path):
    asked: list[object] = []
    retention = Retention(2, lambda fn, path: asked.append(path))
    results: list[WindowResult] = []
    for i in range(5):
        result = WindowResult(tmp_path / f"w{i}" / "h_0.1.pt.trace.json.gz", 1, 1, 1, 1, False)
        results.append(result)
        retention.finished(result, results)
    assert asked == [tmp_path / f"w{i}" / "h_0.1.pt.trace.json.gz" for i in range(3)]
    assert [r.trace_path.parent.name for r in results] == ["w3", "w4"]


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"memory://vt-keep-{uuid.uuid4().hex[:8]}"
    yield root
    fs = filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_a_remote_root_keeps_the_newest_windows_too(tmp_path, monkeypatch, memory_root):
    monkeypatch.chdir(tmp_path)
    cb = VizTraceCallback(
        wait=0, warmup=0, active=1, repeat=0, keep_windows=2, memory_snapshot=False, spool_dir=str(tmp_path), **LIFTED
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logger = TensorBoardLogger(save_dir=memory_root)
        make_trainer(tmp_path / "local", [cb], max_steps=5, logger=logger).fit(MarkerModel(), loader(n=20))
    fs = filesystem("memory")
    version = f"{memory_root}/lightning_logs/version_0"
    traces = sorted(p.rsplit("/", 2)[1] for p in fs.find(version) if p.endswith(".pt.trace.json.gz"))
    assert traces == ["window_003-batches_3-3", "window_004-batches_4-4"]
    assert fs.exists(f"{version}/vt_lightning.windows.txt")
