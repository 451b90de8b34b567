"""Every name Python allows is safe where Python can see it (issue 40: 3). Before, one ESC in one
function or file name dropped the window ("unexpected control character in string": VizTracer's raw
dump holds names unescaped), and a module whose file name is not UTF-8 killed training with SIGSEGV
inside VizTracer. Each fit runs ``tests/scripts/fault/hostile_names.py`` in a subprocess: its exit
status is checked, not only its files. The names only VizTracer can make safe are in
docs/upstream.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO, SCRIPTS

from vt_lightning.recording import children

SCRIPT = SCRIPTS / "fault" / "hostile_names.py"
NAMES = ["esc\x1bname", "bel\x07name", "cr\rname", "nl\nname", "bidi\u202ename", "long_" + "x" * 3000]


def run(root: Path, case: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``case`` of the fault script; its exit status must be 0 (before the guards: -11, SIGSEGV)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), case], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-4000:])
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # 3.12.0-3.12.4 get the advice about their own profiling bug, which is no case's subject here
    report["warnings"] = [w for w in report["warnings"] if "cpython #122029" not in w]
    return proc, report


@pytest.mark.slow
def test_names_with_control_bidi_and_many_characters_reach_the_trace_and_the_window_is_written(tmp_path):
    _, report = run(tmp_path, "control")
    assert report["train_batches"] == list(range(10))
    assert report["windows"] == 2, report["warnings"]
    assert report["warnings"] == []
    assert report["names_found"] == NAMES  # each whole, its characters kept (the trace's JSON escapes them)
    assert report["module_found"]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "named"), [("surrogate", "'caf\\udcff_module'"), ("directory", "/caf\\udcff/")])
def test_a_module_file_name_that_is_not_utf8_skips_the_windows_with_one_warning_and_training_lives(
    tmp_path, case, named
):
    """``directory``: the realistic way, a plain module in a directory whose name holds a byte that
    is not UTF-8 (VizTracer meets the whole path as the code's file name)."""
    _, report = run(tmp_path, case)
    assert report["train_batches"] == list(range(10))
    assert report["windows"] == 0
    (warning,) = [w for w in report["warnings"] if "not valid UTF-8" in w]
    assert named in warning and "window 0 and every later one" in warning
    assert [w for w in report["warnings"] if w != warning] == []


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
@pytest.mark.parametrize("case", ["worker", "worker_loaded"])
def test_a_dataloader_worker_meeting_a_file_name_viztracer_cannot_take_lives_and_says_so_once(tmp_path, case):
    """``worker``: a worker imports a module whose file name is not UTF-8 in a traced fetch; before,
    the worker died of SIGSEGV inside VizTracer and took training with it ("DataLoader worker exited
    unexpectedly", exit 1). ``worker_loaded``: it imported it before any window; the first traced
    fetch found it loaded and, falling back to the untraced fetch, waited forever on the worker's
    own lock (the fit hung)."""
    proc, report = run(tmp_path, case)
    assert report["train_batches"] == list(range(10))
    assert report["window_dirs"] == ["window_000", "window_001"]  # the main process's windows
    (line,) = [line for line in proc.stderr.splitlines() if "not valid UTF-8" in line]
    assert "DataLoader worker pid" in line and "'caf\\udcff_worker'" in line
    if case == "worker":
        assert "imported during a traced fetch" in line and "tracing stopped before that code ran" in line
    else:
        assert "loaded in this worker" in line
    assert "wrote no events" not in proc.stderr  # the part is complete: nothing waits for it


@pytest.mark.slow
@pytest.mark.skipif(children.FORK_CAN_DEADLOCK, reason="3.10 dumps in process, where VizTracer's crash is its own")
def test_code_whose_name_is_not_utf8_drops_its_window_and_training_lives(tmp_path):
    """``code.replace(co_name="bad\\udcffname")`` called in window 0: VizTracer's dump crashes on the
    name, in the forked child that writes it: the window is dropped, the next one written. In a
    dump made in process (Python 3.10, a window held to the end of fit, a DataLoader worker's part)
    the crash is VizTracer's to fix (docs/upstream.md, reproducer 2)."""
    _, report = run(tmp_path, "co_name")
    assert report["train_batches"] == list(range(10))
    (warning,) = report["warnings"]
    assert warning.startswith("vt_lightning: window dropped: the VizTracer dump process died of SIGSEGV")
    assert report["window_dirs"] == ["window_001"]


@pytest.mark.slow
def test_a_thread_name_that_is_not_utf8_never_kills_training_and_the_windows_say_what_happened(tmp_path):
    """A thread named ``"bad\\udcffthread"`` runs in window 0. On 3.10 and 3.11 VizTracer's dump
    crashes on the name (the training process died, exit -11): now the window the thread ran in is
    dropped, saying why, and so is every later one (VizTracer keeps the name for the tracer's life),
    and training lives. On 3.12+ (``sys.monitoring``) VizTracer names a thread started while it
    records before ``threading`` does, its dump writes it, and both windows are written."""
    _, report = run(tmp_path, "thread_name")
    assert report["train_batches"] == list(range(10))
    if sys.version_info < (3, 12):
        assert report["window_dirs"] == []
        assert report["warnings"], "each window dropped says why"
        for warning in report["warnings"]:
            assert warning.startswith("vt_lightning: window dropped: ")
            assert "a thread named 'bad\\udcffthread'" in warning
    else:
        assert report["window_dirs"] == ["window_000", "window_001"]
        assert report["warnings"] == []


# Raw in a console line, these recolour, move or rewrite what the user sees (export/terminal.py).
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.slow
def test_every_console_line_shows_names_escaped(tmp_path):
    """The output directory, the function a verdict names and the file of a busy function hold ESC,
    CR, BEL, a newline and a right-to-left override: every line the callback prints or logs shows
    them escaped (issue 50)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "fault" / "console_names.py"), str(tmp_path)],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    output = (proc.stdout + proc.stderr).decode()
    ours = [line for line in output.splitlines() if "vt_lightning" in line or line.startswith("  ")]
    assert _RAW_CONTROL.findall(output) == [], [line for line in ours if _RAW_CONTROL.search(line)]
    escaped = "out\\x1b]0;title\\x07\\u202e"
    assert f"window trace(s) in {tmp_path}/{escaped}" in output, output[-3000:]  # the end-of-run lines
    assert f"file {tmp_path}/{escaped}/vt_lightning.trigger" in output  # the trigger's line
    (verdict,) = [line for line in ours if "window 0: python_bound" in line]
    assert "esc\\x1b[31mRED\\x1b[0m\\r\\u202eevil" in verdict or "bad\\n\\x1b[2Jname.py" in verdict, verdict
