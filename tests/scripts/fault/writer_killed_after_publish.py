"""A training run whose writer process SIGKILLs itself at a chosen point of the first window, after
that window's trace was published. Run by tests/system/test_writer.py in a subprocess; prints one JSON
report as its last line.

    python writer_killed_after_publish.py <root> <trace|answer>

The script is also the writer process's boot: the training side points ``writer_command`` at this
file with ``--writer``, and the environment variable ``VT_TEST_KILL_WRITER_AFTER`` (read only
here) says where the writer dies: ``trace`` right after the trace is published (before the memory
snapshot and summary), ``answer`` after everything is written, just before the result is sent.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = str(HERE.parents[2])
KILL_AFTER = "VT_TEST_KILL_WRITER_AFTER"


def writer_role() -> None:
    """The writer process: the package's own serve loop with a kill at the chosen point."""
    sys.path[:0] = [PACKAGE_ROOT]
    from vt_lightning.export import pipeline, writer_process
    from vt_lightning.export.job import WindowResult

    point = os.environ[KILL_AFTER]
    if point == "trace":
        publish = pipeline.write_new

        def publish_then_die(*args, **kwargs):
            path = publish(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
            return path

        pipeline.write_new = publish_then_die
    else:
        send = writer_process._send

        def die_before_answering(stream, obj):
            if isinstance(obj, tuple) and isinstance(obj[1], WindowResult):
                os.kill(os.getpid(), signal.SIGKILL)
            send(stream, obj)

        writer_process._send = die_before_answering
    writer_process.main()


def training_role(root: str, point: str) -> None:
    sys.path[:0] = [str(HERE.parents[1]), PACKAGE_ROOT]  # tests/: conftest's MarkerModel
    os.environ[KILL_AFTER] = point  # the writer process inherits it
    from conftest import MarkerModel, loader, make_trainer

    from vt_lightning import VizTraceCallback
    from vt_lightning.controller import handoff
    from vt_lightning.export import writer_process

    handoff.FINISH_AT_END_WITHIN_S = 0.0  # every window to the writer process, the one killed here
    writer_process.writer_command = lambda: [sys.executable, "-I", str(Path(__file__).resolve()), "--writer"]
    cb = VizTraceCallback(wait=1, warmup=0, active=1, repeat=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(Path(root), [cb], max_steps=4).fit(MarkerModel(), loader())
    print(
        json.dumps(
            {
                "warnings": [str(w.message) for w in caught if "vt_lightning" in str(w.message)],
                "results": [str(r.trace_path) for r in cb.results],
                "summaries": [str(r.summary_path) for r in cb.results],
                "notes": [list(r.notes) for r in cb.results],
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--writer"]:
        writer_role()
    else:
        training_role(sys.argv[1], sys.argv[2])
