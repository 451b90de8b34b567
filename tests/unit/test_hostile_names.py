"""Every name Python allows is safe where Python can see it (issue 40: 3), the in-process parts: raw
control bytes in a raw dump are escaped, and a thread name that is not UTF-8 reaches the written
window readable. The fits in subprocesses: tests/system/test_hostile_names.py."""

from __future__ import annotations

import dataclasses
import gzip
import threading
from pathlib import Path

import orjson

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.export.job import WindowJob
from vt_lightning.export.pipeline import finish_window
from vt_lightning.export.raw_json import escape_raw_strings, loads
from vt_lightning.recording.window import thread_names_now


def test_raw_control_bytes_inside_strings_are_escaped_and_whitespace_between_tokens_is_kept():
    raw = b'{\n  "name": "a\x1bb\rc\nd\\q",\n  "file": "\xff.py", "ok": "\\"\\\\"}\n'
    assert loads(raw) == {"name": "a\x1bb\rc\nd\\q", "file": "\ufffd.py", "ok": '"\\'}
    assert escape_raw_strings(b'{"a": "x"}\n') == b'{"a": "x"}\n'


def test_a_thread_name_that_is_not_utf8_reaches_the_written_window_readable(tmp_path):
    """On Python 3.13 VizTracer's dump holds a thread named with a lone surrogate, and the window
    carries the name from ``threading`` too: the writer refused the whole window ("could not write
    the window ... surrogates not allowed"). Now the name is written with U+FFFD for what is not
    UTF-8, in the thread's track name as in a C dump's bytes and a ``json.dumps`` escape."""
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="bad\udcffthread")
    thread.start()
    try:
        names = thread_names_now({})
        tid = thread.native_id
    finally:
        release.set()
        thread.join()
    assert names[tid] == "bad\ufffdthread"
    torch_raw, python_raw = tmp_path / "torch.json", tmp_path / "python.json"
    torch_raw.write_bytes(orjson.dumps({"traceEvents": [], "baseTimeNanoseconds": 0}))
    # As VizTracer's C dump writes them: the name's bytes as they are (0xff, not UTF-8), and an
    # argument through ``json.dumps`` (a lone surrogate's escape, which orjson refuses).
    python_raw.write_bytes(
        b'{"traceEvents":[{"ph":"M","pid":1,"tid":%d,"name":"thread_name","args":{"name":"bad\xffthread"}},'
        b'{"ph":"X","pid":1,"tid":%d,"ts":10.0,"dur":5.0,"name":"work (/x.py:1)","cat":"FEE",'
        b'"args":{"who":"bad\\udcffthread \\ud83d\\ude00"}}],"viztracer_metadata":{"overflow":false}}' % (tid, tid)
    )
    pair = ClockPair(0.0, 0, 0.0)
    job = WindowJob(tmp_path / "window", "w.pt.trace.json.gz", torch_raw, python_raw, pair, pair, None, {})
    result = finish_window(dataclasses.replace(job, thread_names=names, summary=False))
    trace = orjson.loads(gzip.decompress(Path(result.trace_path).read_bytes()))
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name" and e["tid"] == tid}
    assert tracks == {"bad\ufffdthread"}
    (work,) = [e for e in trace["traceEvents"] if e.get("name", "").startswith("work")]
    assert work["args"]["who"] == "bad\ufffdthread \U0001f600"  # a surrogate pair stays one character


def test_a_fault_warning_and_a_console_line_show_control_characters_escaped(caplog):
    """An exception's text (a path, a URL, a user's message) reaches the user through a warning or
    a console line escaped, whatever it holds (issue 50)."""
    import logging
    import warnings

    from vt_lightning.controller import messages

    hostile = "a\x1b[2Jb\rc\u202ed\nnext line"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages.WarnOnce()(*messages.fault(OSError(hostile), "on_train_batch_end"))
    (said,) = [str(w.message) for w in caught]
    assert "a\\x1b[2Jb\\rc\\u202ed\nnext line" in said  # line breaks kept, the rest escaped
    with caplog.at_level(logging.INFO):
        messages.say(f"vt_lightning: {hostile}")
    assert caplog.messages == ["vt_lightning: a\\x1b[2Jb\\rc\\u202ed\nnext line"]
