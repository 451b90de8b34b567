"""Every name Python allows is safe (issue 40: 3). Before, one ESC in one function or file name
dropped the window ("unexpected control character in string": VizTracer's raw dump holds names
unescaped), and a module whose file name is not UTF-8 killed training with SIGSEGV inside
VizTracer. Each case runs ``fault_scripts/hostile_names.py`` in a subprocess: its exit status is
checked, not only its files."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import threading
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from pathlib import Path

import orjson
import pytest

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.export.job import WindowJob
from vt_lightning.export.pipeline import finish_window
from vt_lightning.export.raw_json import escape_raw_strings, loads
from vt_lightning.recording.unsafe_names import CodeGuard
from vt_lightning.recording.window import thread_names_now

SCRIPT = Path(__file__).resolve().parent / "fault_scripts" / "hostile_names.py"
ROOT = Path(__file__).resolve().parent.parent
NAMES = ["esc\x1bname", "bel\x07name", "cr\rname", "nl\nname", "bidi\u202ename", "long_" + "x" * 3000]


def run(root: Path, case: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``case`` of the fault script; its exit status must be 0 (before the guards: -11, SIGSEGV)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), case], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-4000:])
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_names_with_control_bidi_and_many_characters_reach_the_trace_and_the_window_is_written(tmp_path):
    _, report = run(tmp_path, "control")
    assert report["train_batches"] == list(range(10))
    assert report["windows"] == 2, report["warnings"]
    assert report["warnings"] == []
    assert report["names_found"] == NAMES  # each whole, its characters kept (the trace's JSON escapes them)
    assert report["module_found"]


@pytest.mark.slow
def test_a_module_file_name_that_is_not_utf8_skips_the_windows_with_one_warning_and_training_lives(tmp_path):
    _, report = run(tmp_path, "surrogate")
    assert report["train_batches"] == list(range(10))
    assert report["windows"] == 0
    (warning,) = [w for w in report["warnings"] if "not valid UTF-8" in w]
    assert "'caf\\udcff_module'" in warning and "window 0 and every later one" in warning


@pytest.mark.unit
def test_raw_control_bytes_inside_strings_are_escaped_and_whitespace_between_tokens_is_kept():
    raw = b'{\n  "name": "a\x1bb\rc\nd\\q",\n  "file": "\xff.py", "ok": "\\"\\\\"}\n'
    assert loads(raw) == {"name": "a\x1bb\rc\nd\\q", "file": "\ufffd.py", "ok": '"\\'}
    assert escape_raw_strings(b'{"a": "x"}\n') == b'{"a": "x"}\n'


@pytest.mark.unit
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


@pytest.mark.slow
@pytest.mark.parametrize("where", ["imported", "threaded"])
def test_a_module_file_name_that_is_not_utf8_imported_during_a_window_drops_only_that_window(tmp_path, where):
    """Before the import guard, the module's first traced call killed training with SIGSEGV (exit
    -11), from the training thread and from a thread it started alike."""
    _, report = run(tmp_path, where)
    assert report["train_batches"] == list(range(10))
    (warning,) = [w for w in report["warnings"] if "not valid UTF-8" in w]
    assert "'caf\\udcff_module'" in warning and "imported during window 0" in warning
    assert "window 0 is dropped" in warning
    assert [w for w in report["warnings"] if w != warning] == []
    assert report["window_dirs"] == ["window_001"]  # the next window is written
    assert "ImportGuard" not in report["meta_path"]  # no finder left behind
    assert report["profile_hook"] is None  # stopped from another thread: the training thread's hook is off too


@pytest.mark.slow
@pytest.mark.parametrize("case", ["compiled", "by_hand", "by_hand_pyc"])
def test_code_compiled_or_run_by_hand_under_a_non_utf8_file_name_during_a_window_drops_only_that_window(tmp_path, case):
    """``compile(src, "caf\\udcff.py", "exec")`` + ``exec``, and ``spec_from_file_location`` +
    ``exec_module`` (from source, or from its cached bytecode), during window 0: before
    ``CodeGuard``, training died of SIGSEGV inside VizTracer (exit -11)."""
    _, report = run(tmp_path, case)
    assert report["train_batches"] == list(range(10))
    (warning,) = [w for w in report["warnings"] if "not valid UTF-8" in w]
    assert "during window 0" in warning and "window 0 is dropped" in warning
    if case == "compiled":
        assert warning.startswith("vt_lightning: code compiled during window 0") and "caf\\udcff_compiled.py" in warning
    else:
        assert "the module 'by_hand' run by its loader" in warning and "caf\\udcff_by_hand.py" in warning
    assert [w for w in report["warnings"] if w != warning] == []
    assert report["window_dirs"] == ["window_001"]  # that code is gone: the next window is written
    assert report["profile_hook"] is None


@pytest.mark.slow
@pytest.mark.parametrize("case", ["worker", "worker_co_name", "worker_loaded"])
def test_a_dataloader_worker_meeting_a_name_viztracer_cannot_take_lives_and_says_so_once(tmp_path, case):
    """``worker``: a worker imports a module whose file name is not UTF-8 in a traced fetch;
    ``worker_co_name``: it calls code whose name is not UTF-8, which the worker's own dump of its
    part cannot write. Before, the worker died of SIGSEGV inside VizTracer and took training with
    it ("DataLoader worker exited unexpectedly", exit 1). ``worker_loaded``: it imported that module
    before any window; the first traced fetch found it loaded and, falling back to the untraced
    fetch, waited forever on the worker's own lock (the fit hung)."""
    proc, report = run(tmp_path, case)
    assert report["train_batches"] == list(range(10))
    assert report["window_dirs"] == ["window_000", "window_001"]  # the main process's windows
    (line,) = [line for line in proc.stderr.splitlines() if "not valid UTF-8" in line]
    assert "DataLoader worker pid" in line
    if case == "worker":
        assert "'caf\\udcff_worker'" in line and "imported during a traced fetch" in line
        assert "tracing stopped before that code ran" in line
    elif case == "worker_loaded":
        assert "'caf\\udcff_worker'" in line and "loaded in this worker" in line
    else:
        assert "code named 'bad\\udcffname'" in line and "they were discarded, not written" in line
    assert "wrote no events" not in proc.stderr  # the part is complete: nothing waits for it


@pytest.mark.slow
def test_code_whose_name_is_not_utf8_drops_its_window_and_training_lives(tmp_path):
    """``code.replace(co_name="bad\\udcffname")`` called in window 0: VizTracer's dump crashes on the
    name. Forked (3.11+), the dump child dies and the window is dropped; in the training process
    (3.10: ``FORK_CAN_DEADLOCK``, or a window held to the end of fit) it killed training (exit -11)
    before ``viztracer_layout.dump_in_process``."""
    _, report = run(tmp_path, "co_name")
    assert report["train_batches"] == list(range(10))
    (warning,) = report["warnings"]
    assert warning.startswith("vt_lightning: window dropped: ")
    assert "died of SIGSEGV" in warning or "code named 'bad\\udcffname'" in warning
    assert report["window_dirs"] == ["window_001"]


@pytest.mark.slow
def test_a_thread_name_that_is_not_utf8_never_kills_training_and_the_windows_say_what_happened(tmp_path):
    """A thread named ``"bad\\udcffthread"`` runs in window 0. On 3.10 and 3.11 VizTracer's dump
    crashes on the name (the training process died, exit -11): now the window the thread ran in is
    dropped, saying why, and so is every later one (VizTracer keeps the name for the tracer's life),
    and training lives. On 3.12+ (``sys.monitoring``) the dump holds the name, and the writer
    refused the whole window ("surrogates not allowed"): now both windows are written, the name
    readable (seen on 3.12.1 and 3.13.0; the unit test above checks the name in the trace)."""
    _, report = run(tmp_path, "thread_name")
    assert report["train_batches"] == list(range(10))
    if sys.version_info < (3, 12):
        assert report["window_dirs"] == []
        assert report["warnings"], "each window dropped says why"
        for warning in report["warnings"]:
            assert warning.startswith("vt_lightning: window dropped: ")
            assert "a thread named 'bad\\udcffthread'" in warning or "died of SIGSEGV" in warning
    else:
        assert report["window_dirs"] == ["window_000", "window_001"]
        # 3.12.0-3.12.4 get the advice about their own profiling bug, which is not this test's
        assert [w for w in report["warnings"] if "cpython #122029" not in w] == []


def _compiled_by(compile_function, *args, **kwargs):
    """What ``compile_function(*args, **kwargs)`` gives, called from code with no ``__future__``
    flags of its own (this module has ``annotations``): (the code's flags, or the error)."""
    namespace = {"c": compile_function, "args": args, "kwargs": kwargs}
    caller = builtins.compile("result = c(*args, **kwargs)", "caller.py", "exec", dont_inherit=True)
    try:
        exec(caller, namespace)
    except Exception as err:
        return type(err).__name__, str(err)
    result = namespace["result"]
    return result.co_flags if hasattr(result, "co_flags") else ast.dump(result)


@pytest.mark.unit
def test_the_code_guard_compiles_exactly_as_compile_and_is_gone_once_removed():
    """``compile`` takes ``__future__`` flags from the calling frame: a wrapper must neither lose the
    caller's (this module's ``annotations``) nor add its own (``unsafe_names`` has ``annotations``
    too, which code compiled by a caller without it must not get)."""
    original = builtins.compile
    loaders = {cls: dict(cls.__dict__).get("get_code") for cls in (SourceFileLoader, SourcelessFileLoader)}
    cases = [
        (("def f(x: y): pass", "a.py", "exec"), {}),
        (("def f(x: y): pass", "a.py", "exec"), {"dont_inherit": True}),
        (("1 + 1", "a.py", "eval"), {"flags": ast.PyCF_ONLY_AST}),
        ((ast.parse("1 + 1", mode="eval"), "a.py", "eval"), {"optimize": 2}),
        ((), {"source": "x = 1", "filename": b"a.py", "mode": "exec", "_feature_version": (3, 8)}),
        (("1 +", "a.py", "eval"), {}),  # a SyntaxError, the same
        (("1", "a.py", "eval"), {"flags": 1.5}),  # a TypeError, the same
    ]
    expected = [_compiled_by(original, *args, **kwargs) for args, kwargs in cases]
    met = []
    guard = CodeGuard(lambda subject, file: met.append((subject, file)))
    guard.install()
    try:
        assert builtins.compile is not original
        assert [_compiled_by(builtins.compile, *args, **kwargs) for args, kwargs in cases] == expected
        # here, this module's ``annotations`` is inherited: the annotation stays a string
        namespace: dict = {}
        exec(compile("def f(x: undefined_name): pass", "a.py", "exec"), namespace)
        assert namespace["f"].__annotations__ == {"x": "undefined_name"}
        assert met == []
        compile("pass", b"caf\xff.py", "exec")  # bytes: decoded with surrogates, as co_filename is
        assert met == [("code compiled", "caf\udcff.py")]
    finally:
        guard.remove()
    assert builtins.compile is original
    assert {cls: dict(cls.__dict__).get("get_code") for cls in loaders} == loaders
