"""PythonTracer in a fresh interpreter: importing it needs no torch, and VizTracer's thread key is
deleted before the interpreter finalizes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import REPO


def test_import_needs_no_torch():
    code = (
        "import sys, vt_lightning, vt_lightning.recording.pytracer; "
        "bad = [m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules]; "
        "assert not bad, bad"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---------------------------------------------------------------- VizTracer's thread key at exit (thread_keys)


EXIT_SCRIPT = """
import atexit, ctypes, sys
libc = ctypes.CDLL(None)
libc.pthread_getspecific.restype = ctypes.c_void_p
libc.pthread_getspecific.argtypes = [ctypes.c_uint]
found = {}
atexit.register(lambda: print("after exit:", libc.pthread_getspecific(found["key"]), flush=True))  # runs last
from vt_lightning.recording import thread_keys
from vt_lightning.recording.pytracer import PythonTracer, PythonTracerConfig
tracer = PythonTracer(PythonTracerConfig(tracer_entries=10_000))
tracer.start()
sum(range(10))
tracer.stop()
(found["key"],) = thread_keys.noted_keys()
print("during the run:", libc.pthread_getspecific(found["key"]) is not None, flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the key is found through glibc's pthread keys")
def test_viztracers_thread_key_is_deleted_before_the_interpreter_finalizes():
    """Its destructor takes the GIL: a thread that exits after finalization (torch's autograd device
    thread after a compiled backward ran Python in a window) crashed the process (thread_keys.py)."""
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["during the run: True", "after exit: None"], proc.stdout
