"""The user's own code and environment never crash, hang or lose a run (issue 15): the checks and
parts that need no training (spool and writer options, the background writer, the no-replace write).
Runs in a subprocess: tests/system/test_faults.py."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from vt_lightning import VizTraceCallback
from vt_lightning.recording.spool import default_spool_base


def test_the_default_spool_base_avoids_ram_filesystems(monkeypatch, tmp_path):
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    ram_tmp = "overlay / overlay rw 0 0\ntmpfs /tmp tmpfs rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
    disk_tmp = "overlay / overlay rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
    if os.access("/var/tmp", os.W_OK):
        assert default_spool_base(ram_tmp) == "/var/tmp"
    assert default_spool_base(disk_tmp) == tempfile.gettempdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the user's choice wins
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert default_spool_base(ram_tmp) == str(tmp_path)


@pytest.mark.parametrize("bad", [5, "", ["a"], "FILE", "READONLY"])
def test_a_bad_spool_dir_is_refused_at_construction(tmp_path, bad):
    if bad == "FILE":
        bad = tmp_path / "file"
        bad.write_text("x")
        bad = str(bad / "below")
    elif bad == "READONLY":
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        bad = tmp_path / "ro"
        bad.mkdir(mode=0o500)
        bad = str(bad)
    with pytest.raises(ValueError, match="`spool_dir`"):
        VizTraceCallback(spool_dir=bad)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "10", True])
def test_a_bad_writer_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="`writer_timeout`"):
        VizTraceCallback(writer_timeout=bad)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [5, {"a": 1}, "src", {"src"}, [5], [""]])
def test_include_and_exclude_files_must_be_lists_of_paths(bad):
    for name in ("include_files", "exclude_files"):
        with pytest.raises(ValueError, match=f"`{name}`"):
            VizTraceCallback(**{name: bad})


# ---------------------------------------------------------------- the pieces, without a Trainer


def test_the_background_writer_abandons_a_stuck_job_and_goes_on():
    from concurrent.futures import CancelledError

    from vt_lightning.controller.handoff import BackgroundWriter, WriterAbandoned

    release = threading.Event()
    writer = BackgroundWriter(max_in_flight=1, use_process=False, timeout=0.2)
    try:
        stuck = writer.submit(release.wait)
        queued = writer.submit(lambda: "never run")
        _, room = writer.wait_for_room()
        assert not room and writer.abandoned == 1
        with pytest.raises(WriterAbandoned):
            stuck.result(timeout=0)
        with pytest.raises((WriterAbandoned, CancelledError)):
            queued.result(timeout=0)
        assert writer.submit(lambda: 42).result(timeout=10) == 42  # a fresh thread took over
        assert writer.drain() is True
        release.set()  # the stuck thread finishes; its late result is ignored
        assert writer.in_flight() == 0
    finally:
        release.set()
        writer.close()


def test_a_new_file_never_replaces_an_existing_one_or_a_symlink(tmp_path):
    from vt_lightning.export.atomic import atomic_write

    (tmp_path / "taken").write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "taken", b"ours", overwrite=False)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "link", b"ours", overwrite=False)
    assert (tmp_path / "taken").read_bytes() == b"theirs" and not (tmp_path / "elsewhere").exists()
    atomic_write(tmp_path / "free", b"ours", overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["free", "link", "taken"]  # no temporaries left
