"""A signal during the end-of-fit finish gives the exit status the script has without the callback
(issue 40: 1). Before, a Ctrl-C or a handler's ``sys.exit(143)`` that arrived while fit's end waited
for the writer was swallowed there, and the job exited 0.

Each case runs ``tests/scripts/fault/end_of_fit_signal.py`` in a subprocess held at one phase of the
finish; the test sends the signal once the script says it is there, and compares the exit status
with the same script without the callback, held at the same hook.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO, SCRIPTS

SCRIPT = SCRIPTS / "fault" / "end_of_fit_signal.py"
SIGNALS = {"lightning": signal.SIGINT, "user": signal.SIGTERM, "default": signal.SIGTERM}
PHASES = ["hand_off", "held", "writer", "teardown"]
_baselines: dict[tuple[str, str], int] = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run(root: Path, phase: str, handler: str, *extra: str) -> tuple[int, str, str]:
    """The script's exit status and output, and what it wrote at its pause."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(root), phase, handler, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (root / "paused").exists():
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the script never reached its pause"
            time.sleep(0.02)
        os.kill(proc.pid, SIGNALS[handler])
        (root / "signalled").write_text("")
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, output, (root / "paused").read_text()


def baseline(tmp_path: Path, phase: str, handler: str) -> int:
    hook = "teardown" if phase == "teardown" else "on_train_end"
    if (hook, handler) not in _baselines:
        code, _, _ = run(tmp_path / "without", phase, handler, "--no-callback")
        _baselines[hook, handler] = code
    return _baselines[hook, handler]


@pytest.mark.slow
@pytest.mark.parametrize("handler", sorted(SIGNALS))
@pytest.mark.parametrize("phase", PHASES)
def test_a_signal_during_the_end_of_fit_finish_keeps_the_exit_status_of_the_script_alone(tmp_path, phase, handler):
    expected = baseline(tmp_path, phase, handler)
    if handler != "default":  # Lightning's Ctrl-C status, and the user's own
        assert expected == {"lightning": 1, "user": 143}[handler]
    code, output, note = run(tmp_path / "with", phase, handler)
    assert code == expected, output[-4000:]
    if note:  # the writer process that had the window: gone with the training process
        deadline = time.monotonic() + 10
        while _alive(int(note)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(note))


@pytest.mark.slow
def test_a_run_with_a_writer_process_leaves_no_file_unclosed(tmp_path):
    # Every run ended with "ResourceWarning: unclosed file <_io.BufferedWriter name=6>": the pipes
    # to the writer process. Python's development mode shows every ResourceWarning.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-X", "dev", str(SCRIPT), str(tmp_path), "none", "default"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "fit returned" in output, output[-4000:]
    assert "window trace(s) in" in output, output[-4000:]  # the window went through the writer process
    assert "ResourceWarning" not in output and "unclosed" not in output, output[-4000:]
