"""Every name Python allows is safe (issue 40: 3). Before, one ESC in one function or file name
dropped the window ("unexpected control character in string": VizTracer's raw dump holds names
unescaped), and a module whose file name is not UTF-8 killed training with SIGSEGV inside
VizTracer. Each case runs ``fault_scripts/hostile_names.py`` in a subprocess: its exit status is
checked, not only its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vt_lightning.export.raw_json import escape_raw_strings, loads

SCRIPT = Path(__file__).resolve().parent / "fault_scripts" / "hostile_names.py"
ROOT = Path(__file__).resolve().parent.parent
NAMES = ["esc\x1bname", "bel\x07name", "cr\rname", "nl\nname", "bidi\u202ename", "long_" + "x" * 3000]


def run(root: Path, case: str) -> tuple[subprocess.CompletedProcess, dict]:
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
