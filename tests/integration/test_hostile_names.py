"""A raw dump that a thread name VizTracer cannot take would crash is forked or refused, never run in
the training process (issue 40: 3; the fits: tests/system/test_hostile_names.py)."""

from __future__ import annotations

import sys
import threading

import orjson
import pytest

from vt_lightning.recording import children, viztracer_dump
from vt_lightning.recording.children import DumpChildFailed, wait_for_dump
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig


def _recorded_a_thread_named(name: str, tracer: PythonTracer) -> None:
    """``tracer`` records while a thread called ``name`` starts, runs and ends."""
    tracer.start()
    try:
        thread = threading.Thread(target=sum, args=(range(10),), name=name)
        thread.start()
        thread.join()
    finally:
        tracer.stop()


def test_a_dump_that_a_thread_name_would_crash_is_forked_or_refused_never_run_in_this_process(tmp_path, monkeypatch):
    """A thread whose name is not UTF-8 ran while VizTracer recorded; its dump crashes on the name
    on 3.10 and 3.11 (docs/upstream.md, reproducer 4). A dump asked for in this process (``fork=False``:
    a held window, a worker's part) goes to a forked child instead, which dies of it, saying why, or
    (3.12+, where VizTracer named the thread before ``threading`` did) writes it; where forking is
    not safe (3.10) it is refused and the calls discarded. This process lives either way."""
    monkeypatch.setattr(viztracer_dump, "_unsafe_threads", {})
    # A configuration of its own: VizTracer keeps the name for its life, and tracers are shared by it.
    tracer = PythonTracer(PythonTracerConfig(tracer_entries=4_321))
    _recorded_a_thread_named("bad\udcffthread", tracer)
    viz, path = tracer.ensure_tracer(), tmp_path / "python.json"
    if not children.FORK_CAN_DEADLOCK:
        pid = viztracer_dump.write_dump(viz, 4_321, str(path), fork=False)
        assert pid is not None  # forked, though asked for in process
        if sys.version_info < (3, 12):
            with pytest.raises(DumpChildFailed, match=r"died of SIGSEGV \(a thread named 'bad\\udcffthread'"):
                wait_for_dump(pid)
        else:
            wait_for_dump(pid)
            assert orjson.loads(path.read_bytes())["traceEvents"]
        monkeypatch.setattr(children, "FORK_CAN_DEADLOCK", True)
    with pytest.raises(viztracer_dump.UnsafeDumpName, match=r"a thread named 'bad\\udcffthread' ran while"):
        viztracer_dump.write_dump(viz, 4_321, str(tmp_path / "refused.json"), fork=True)
    assert not (tmp_path / "refused.json").exists()
