"""Output roots that are URLs (issue 22, item 6): windows reach the remote root through fsspec with
the same names and layout, results name URLs, and a filesystem that cannot be used is an error at
fit start that says to set ``dirpath``. Never a local directory named ``memory:`` or ``s3:``.

``memory://`` lives in one process. The writer process writes a window into local staging and the
training process copies it to the remote root, so these tests see the files in their own process:
that is the design (controller/remote.py), not a test convenience.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from conftest import MarkerModel, loader, make_trainer, trace_files
from fsspec import filesystem, register_implementation
from fsspec.implementations.memory import MemoryFileSystem
from lightning.pytorch.loggers import TensorBoardLogger

from vt_lightning import VizTraceCallback
from vt_lightning.controller.remote import OutputRootError
from vt_lightning.export.job import URL


class RefusingFileSystem(MemoryFileSystem):
    """A store that refuses us at once (no credentials, no permission)."""

    protocol = "vtrefusing"

    def makedirs(self, path, exist_ok=False):
        raise PermissionError("access denied by the test store")


class FailingUploads(MemoryFileSystem):
    """A store that answers at setup, then fails every upload (a network outage mid-run)."""

    protocol = "vtfailing"

    def put_file(self, lpath, rpath, *args, **kwargs):
        raise ConnectionError("the test store went away")


class SecondUploadFails(MemoryFileSystem):
    """A store that loses the second window's upload only (a blip mid-run)."""

    protocol = "vtblip"

    def open(self, path, mode="rb", *args, **kwargs):
        if "w" in mode and path.endswith(".pt.trace.json.gz") and "/window_001-" in path:
            raise ConnectionError("the test store dropped this upload")
        return super().open(path, mode, *args, **kwargs)

    def put_file(self, lpath, rpath, *args, **kwargs):
        if rpath.endswith(".tmp") and "/window_001-" in rpath and ".pt.trace.json.gz" in rpath:
            raise ConnectionError("the test store dropped this upload")
        return super().put_file(lpath, rpath, *args, **kwargs)


register_implementation("vtrefusing", RefusingFileSystem, clobber=True)
register_implementation("vtblip", SecondUploadFails, clobber=True)
register_implementation("vtfailing", FailingUploads, clobber=True)


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh ``memory://`` root, removed afterwards (the memory filesystem is process-wide)."""
    root = f"memory://vt-{uuid.uuid4().hex[:8]}"
    yield root
    fs = filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def url_named_entries(*roots: Path) -> list[Path]:
    """Local files or directories whose name holds a ':' (``memory:``, ``s3:``, ``file:``)."""
    return [p for root in roots for p in root.rglob("*") if ":" in p.name]


def caught_vt_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Our warnings, less the once-per-run notice about Python 3.12.0-3.12.4 (about the interpreter)."""
    messages = [str(w.message) for w in caught if "vt_lightning" in str(w.message)]
    return [m for m in messages if "cpython #122029" not in m]


def test_a_logger_on_a_url_gets_the_windows_there_with_the_same_layout(tmp_path, monkeypatch, memory_root):
    monkeypatch.chdir(tmp_path)
    spool = tmp_path / "spool"
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2, spool_dir=str(spool))
    logger = TensorBoardLogger(save_dir=memory_root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "local", [cb], max_steps=3, logger=logger).fit(MarkerModel(), loader())
    assert caught_vt_warnings(caught) == []
    fs = filesystem("memory")
    version = f"{memory_root}/lightning_logs/version_0"
    assert cb.output_dir == version
    windows = sorted(p.rsplit("/", 1)[1] for p in fs.ls(version, detail=False) if "/window_" in p)
    assert windows == ["window_000-batches_0-0", "window_001-batches_1-1"]
    for result, window in zip(cb.results, windows):
        assert isinstance(result.trace_path, URL) and result.trace_path.startswith(f"{version}/{window}/")
        assert result.summary_path == result.trace_path.parent / result.summary_path.name
        names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{version}/{window}", detail=False))
        worker = result.trace_path.name.split(".")[0]
        span = result.trace_path.name.split(".")[1]
        stem = f"{worker}.{span}"
        assert names == sorted(
            f"{stem}{suffix}"
            for suffix in (
                *(".memory_snapshot.pickle", ".pt.trace.json.gz", ".summary.jsonc", ".summary.md"),
                ".memory_view.jsonc",
            )
        )
        with fs.open(result.trace_path, "rb") as f:
            trace = orjson.loads(gzip.decompress(f.read()))
        assert trace["vt_lightning"]["steps"] == [int(span)]
        with fs.open(result.summary_path, "rb") as f:
            assert json.loads(f.read())["window"]["trace"] == result.trace_path.name
    # Nothing local but the spool base: no "memory:" directory, no staged copy left behind.
    assert url_named_entries(tmp_path) == []
    assert not trace_files(tmp_path)
    assert [p for p in spool.rglob("*") if p.is_file()] == []


def test_a_root_with_no_exclusive_move_says_once_at_setup_that_no_overwrite_is_only_checked(
    tmp_path, monkeypatch, caplog, memory_root
):
    """``memory://`` (like sftp or HDFS) has no atomic create-if-absent: said once, before any step."""
    monkeypatch.chdir(tmp_path)
    model = MarkerModel()
    batches_when_said: list[list[int]] = []

    class Batches(logging.Handler):
        def emit(self, record):
            if "no overwrite is checked" in record.getMessage():
                batches_when_said.append(list(model.train_batches))

    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=3, dirpath=memory_root)
    watch = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    watch.addHandler(handler := Batches())
    try:
        with caplog.at_level("INFO"):
            make_trainer(tmp_path / "local", [cb], max_steps=3).fit(model, loader())
    finally:
        watch.removeHandler(handler)
    notes = [r.getMessage() for r in caplog.records if "no overwrite is checked, not guaranteed" in r.getMessage()]
    assert len(notes) == 1 and len(cb.results) == 3
    assert notes[0].startswith(f"vt_lightning: no overwrite is checked, not guaranteed, under {memory_root}:")
    assert "\n" not in notes[0]
    assert batches_when_said == [[]]  # at setup, before the first step


@pytest.mark.parametrize("spelling", ["file://{}", "file:{}", "local://{}"])
def test_a_file_url_is_a_local_directory_and_the_command_reads_it_so(tmp_path, monkeypatch, capsys, spelling):
    """``file:/x`` as the callback's root and as the command's argument is the same local ``/x``."""
    monkeypatch.chdir(tmp_path)
    root = spelling.format(tmp_path / "traces")
    cb = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=root)
    make_trainer(tmp_path / "local", [cb], max_steps=1).fit(MarkerModel(), loader())
    (trace,) = trace_files(tmp_path / "traces")
    assert trace.parent.name == "window_000-batches_0-0"
    assert cb.results[0].trace_path == trace and cb.output_dir == tmp_path / "traces"
    assert url_named_entries(tmp_path) == []
    capsys.readouterr()
    status, out, err = run_cli(capsys, "summary", root, "--json")
    assert (status, err) == (0, "")
    assert [s["window"]["trace"] for s in json.loads(out)] == [trace.name]


ROOT_SPELLINGS = [
    # (argument, what both read it as: a local path relative to the working directory, a URL, or an error)
    ("{tmp}/abs", ("local", "abs")),
    ("rel/dir", ("local", "rel/dir")),
    ("file://{tmp}/x", ("local", "x")),
    ("file:{tmp}/x", ("local", "x")),
    ("local://{tmp}/x", ("local", "x")),
    ("file:~/x", ("local", "home/x")),
    ("~/x", ("local", "home/x")),
    ("C:\\x", ("local", "C:\\x")),  # a Windows drive: a name with a colon here, never a protocol
    ("C://x", ("local", "C:/x")),
    ("memory://vt-spelling/x", ("url", "memory://vt-spelling/x")),
    ("memory://vt-spelling/x/", ("url", "memory://vt-spelling/x")),
    ("s3://vt-bucket/k", ("url", "s3://vt-bucket/k")),
    ("nosuchfs://bucket/run", ("error", "Protocol not known: nosuchfs")),
    ("FILE:///x", ("error", "Protocol not known: FILE")),
]


@pytest.mark.parametrize(("argument", "expected"), ROOT_SPELLINGS)
def test_the_callback_and_the_command_read_a_root_the_same_way(tmp_path, monkeypatch, request, argument, expected):
    """One rule (``export.job.locate``) for the callback's output root and the command's argument:
    the same local directory, the same URL, or an error from both that names the argument."""
    from vt_lightning.controller.remote import output_root
    from vt_lightning.export.reading import SummaryNotFound, locate_target

    if argument.startswith("s3://"):
        request.getfixturevalue("s3_server")  # a real store answers the callback's setup check
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argument = argument.format(tmp=tmp_path)
    kind, value = expected

    def callback() -> tuple[Path, URL | None]:
        return output_root(argument, None, str(tmp_path / "default"), spool_dir=str(tmp_path / "spool"))

    if kind == "error":
        with pytest.raises(OutputRootError) as stopped:
            callback()
        with pytest.raises(SummaryNotFound) as refused:
            locate_target(argument)
        for message in (str(stopped.value), str(refused.value)):
            assert argument in message and value in message
        assert "`dirpath`" in str(stopped.value)
        return
    local, remote = callback()
    place = locate_target(argument)
    if kind == "local":
        assert remote is None and local == tmp_path / value
        assert isinstance(place, Path) and place.absolute() == local
    else:
        assert remote == value and local.is_relative_to(tmp_path / "spool")
        assert isinstance(place, URL) and place == value
        if value.startswith("memory://"):
            filesystem("memory").rm(value, recursive=True)  # the setup check made it; the store is process-wide
    assert url_named_entries(tmp_path) == []


def test_an_occupied_remote_run_directory_is_never_overwritten(tmp_path, memory_root):
    fs = filesystem("memory")
    cb = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=memory_root)
    make_trainer(tmp_path, [cb], max_steps=1).fit(MarkerModel(), loader())
    (first,) = cb.results
    before = fs.cat_file(first.trace_path)
    again = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=memory_root)  # a second run, same dirpath
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [again], max_steps=1).fit(MarkerModel(), loader())
    (second,) = again.results
    assert second.trace_path.parent == f"{memory_root}/window_000-batches_0-0.2"
    assert len([w for w in caught_vt_warnings(caught) if "run directory already taken" in w]) == 1
    assert fs.cat_file(first.trace_path) == before
    assert fs.cat_file(second.trace_path) != before


def test_an_unusable_url_stops_fit_at_setup_and_says_to_set_dirpath(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url, why in [
        ("vtrefusing://bucket/traces", "PermissionError: access denied"),
        ("nosuchfs://bucket/traces", "Protocol not known"),
        *([] if importlib.util.find_spec("s3fs") else [("s3://bucket/traces", "s3fs")]),
    ]:
        model = MarkerModel()
        cb = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=url)
        with pytest.raises(OutputRootError, match="set `dirpath` to a local directory") as raised:
            make_trainer(tmp_path / "local", [cb], max_steps=2).fit(model, loader())
        assert url in str(raised.value) and why in str(raised.value) and "`dirpath`" in str(raised.value)
        assert model.train_batches == []  # stopped at setup, before any step
    assert url_named_entries(tmp_path) == []


def test_a_failed_upload_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spool = tmp_path / "spool"
    model = MarkerModel()
    cb = VizTraceCallback(
        wait=0, warmup=0, active=1, repeat=2, dirpath="vtfailing://bucket/traces", spool_dir=str(spool)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "local", [cb], max_steps=4).fit(model, loader())
    assert model.train_batches == [0, 1, 2, 3]
    failures = [w for w in caught_vt_warnings(caught) if "could not copy the window to vtfailing://" in w]
    assert len(failures) == 1 and "ConnectionError" in failures[0]
    assert cb.results == []
    kept = trace_files(spool)  # the windows are kept locally, where the warning says
    assert len(kept) == 2 and str(kept[0].parent.parent) in failures[0]
    assert url_named_entries(tmp_path) == []


def test_a_url_as_spool_dir_is_refused_at_construction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="`spool_dir` must be a local directory"):
        VizTraceCallback(spool_dir="memory://scratch")
    assert url_named_entries(tmp_path) == []


# --------------------------------------------------------------------------------------------------
# Reading a remote root back: vt-lightning summary | diff | view take the URL the callback wrote to
# --------------------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The command in this process: ``memory://`` lives in one process (a subprocess would see an
    empty store). The S3 test below runs the real executable."""
    from vt_lightning.cli.command import main

    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_summary_and_diff_read_a_memory_root_the_callback_wrote(tmp_path, monkeypatch, memory_root, capsys):
    monkeypatch.chdir(tmp_path)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2, dirpath=memory_root)
    make_trainer(tmp_path / "local", [cb], max_steps=3).fit(MarkerModel(), loader())
    capsys.readouterr()
    status, out, err = run_cli(capsys, "summary", memory_root, "--json")
    assert (status, err) == (0, "")
    summaries = json.loads(out)
    assert [s["steps"]["recorded"] for s in summaries] == [[0], [1]]
    assert [s["window"]["trace"] for s in summaries] == [r.trace_path.name for r in cb.results]
    status, out, err = run_cli(capsys, "summary", str(cb.results[1].summary_path))  # one file, as a URL
    assert (status, err) == (0, "") and f"({cb.results[1].summary_path})" in out
    first, second = (str(r.trace_path.parent) for r in cb.results)
    status, out, err = run_cli(capsys, "diff", first, second, "--json")
    assert (status, err) == (0, "") and json.loads(out)["a_windows"] == json.loads(out)["b_windows"] == 1
    assert url_named_entries(tmp_path) == []


def test_a_remote_file_past_the_memory_budget_is_refused_as_a_local_one(tmp_path, memory_root, capsys):
    fs = filesystem("memory")
    big = f"{memory_root}/window_000-batches_0-0/h_0.0000000000.pt.trace.json.gz"
    event = b'{"ph":"X","name":"f","ts":%d,"dur":1,"pid":1,"tid":1,"cat":"python"}'
    events = b",".join(event % i for i in range(60000))
    fs.pipe_file(big, gzip.compress(b'{"traceEvents":[' + events + b"]}"))
    status, _, err = run_cli(capsys, "summary", memory_root, "--max-memory-mb", "8")
    assert status == 1
    assert f"{big}: refused after reading" in err and "8 MiB memory budget" in err and "--max-memory-mb" in err
    status, _, err = run_cli(capsys, "summary", f"{memory_root}/nothing-here")
    assert status == 1 and f"{memory_root}/nothing-here: no such file or directory" in err


def test_a_url_whose_filesystem_is_missing_is_one_line(capsys):
    status, _, err = run_cli(capsys, "summary", "nosuchfs://bucket/run")
    assert status == 1 and err.count("\n") == 1
    assert "nosuchfs://bucket/run: cannot read this URL here" in err and "Traceback" not in err


# --------------------------------------------------------------------------------------------------
# A real S3-compatible server (moto's standalone server, a separate process: support/s3.py) and s3fs
# --------------------------------------------------------------------------------------------------


def test_a_trainer_writes_to_s3_and_the_command_reads_it_back(tmp_path, monkeypatch, s3_server):
    monkeypatch.chdir(tmp_path)
    root = "s3://vt-bucket/run"
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2, dirpath=root, spool_dir=str(tmp_path / "spool"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "local", [cb], max_steps=3).fit(MarkerModel(), loader())
    assert caught_vt_warnings(caught) == []
    assert [str(r.trace_path.parent) for r in cb.results] == [
        f"{root}/window_000-batches_0-0",
        f"{root}/window_001-batches_1-1",
    ]
    command = [sys.executable, "-m", "vt_lightning"]
    done = subprocess.run([*command, "summary", root, "--json"], env=s3_server, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    summaries = json.loads(done.stdout)
    assert [s["steps"]["recorded"] for s in summaries] == [[0], [1]]
    first, second = (str(r.trace_path.parent) for r in cb.results)
    done = subprocess.run([*command, "diff", first, second, "--json"], env=s3_server, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["a_windows"] == 1
    # view: the newest window's trace, copied within its cap and served as a local one is.
    viewer = subprocess.Popen(
        [*command, "view", root, "--no-browser"], env=s3_server, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert viewer.stdout is not None
        serving = viewer.stdout.readline().decode()
        assert serving.strip() == f"vt-lightning: serving {cb.results[1].trace_path}", viewer.stderr
        url = viewer.stdout.readline().decode().split()[1]
        with urllib.request.urlopen(url, timeout=30) as page:
            assert b'<script src="vt_route.js">' in page.read()  # the route, from a script of the same origin
        with urllib.request.urlopen(url + "vt_route.js", timeout=30) as script:
            route = re.search(rb"location\.origin\+'(/[^']+)'", script.read())
        assert route is not None
        with urllib.request.urlopen(url.split("/", 3)[0] + "//" + url.split("/", 3)[2] + route[1].decode()) as got:
            served = got.read()
        assert gzip.decompress(served) == gzip.decompress(filesystem("s3").cat_file(cb.results[1].trace_path))
    finally:
        viewer.send_signal(signal.SIGTERM)
        assert viewer.wait(timeout=60) == 0
    assert url_named_entries(tmp_path) == []


def test_two_runs_racing_for_one_s3_name_never_overwrite_each_other(tmp_path, monkeypatch, s3_server):
    """The name check and the upload are one step on S3 (If-None-Match): a store whose listing lags
    (here: it always says "absent") still refuses the second run's files, which go to ``.2``."""
    import s3fs

    monkeypatch.chdir(tmp_path)
    root = "s3://vt-bucket/race"
    first = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=root)
    make_trainer(tmp_path / "a", [first], max_steps=1).fit(MarkerModel(), loader())
    fs = filesystem("s3")
    window = f"{root}/window_000-batches_0-0"
    before = {path: fs.cat_file(path) for path in fs.find(window)}
    assert len(before) == 5  # trace, snapshot, memory view, summary and its markdown
    monkeypatch.setattr(s3fs.S3FileSystem, "exists", lambda self, path, **kwargs: False)
    second = VizTraceCallback(wait=0, warmup=0, active=1, dirpath=root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "b", [second], max_steps=1).fit(MarkerModel(), loader())
    monkeypatch.undo()
    (result,) = second.results
    assert result.trace_path.parent == f"{window}.2"
    assert {path: fs.cat_file(path) for path in fs.find(window)} == before  # untouched, byte for byte
    assert sorted(p.rsplit("/", 1)[1] for p in fs.find(f"{window}.2")) == sorted(p.rsplit("/", 1)[1] for p in before)
    said = caught_vt_warnings(caught)
    assert len([w for w in said if "run directory already taken" in w]) == 1
    assert not [w for w in said if "not guaranteed" in w]


def test_a_trigger_file_on_a_url_root_is_looked_for_there(tmp_path, monkeypatch, memory_root):
    """Not in local staging, where no user could drop it: in the remote root the run writes to."""
    monkeypatch.chdir(tmp_path)
    fs = filesystem("memory")
    trigger = f"{memory_root}/vt_lightning.trigger"

    class Model(MarkerModel):
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.total_batch_idx == 12:
                fs.pipe_file(trigger, b"")
            return super().training_step(batch, batch_idx)

    cb = VizTraceCallback(
        warmup=0, active=1, trigger_file=True, trigger_interval=0.0, skip_first=10**6, dirpath=memory_root,
        spool_dir=str(tmp_path / "spool"),
    )  # fmt: skip
    make_trainer(tmp_path / "local", [cb], max_steps=20).fit(Model(), loader(n=80))
    (result,) = cb.results
    assert result.trace_path.parent == f"{memory_root}/window_000-trigger_file-batches_13-13"
    meta = orjson.loads(gzip.decompress(fs.cat_file(result.trace_path)))["vt_lightning"]
    assert meta["trigger"]["reason"] == "trigger_file" and meta["trigger"]["detail"] == trigger
    assert not fs.exists(trigger)  # consumed
    assert url_named_entries(tmp_path) == []


def test_the_end_of_the_run_counts_the_windows_it_did_not_write(tmp_path, monkeypatch, caplog):
    """Issue 40: every scheduled window is written or reported: a dropped one is warned about (once
    per kind) as it happens, and counted in the end-of-run line."""
    import logging

    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=3, dirpath="vtblip://bucket/traces")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "local", [cb], max_steps=3).fit(MarkerModel(), loader())
    assert [r.trace_path.parent.name for r in cb.results] == ["window_000-batches_0-0", "window_002-batches_2-2"]
    assert len([w for w in caught_vt_warnings(caught) if "could not copy the window" in w]) == 1
    said = "2 window trace(s) in vtblip://bucket/traces; 1 window(s) not written: 1 dropped by the writer"
    assert said in caplog.text
