"""Compiled windows nest strictly, as Perfetto requires (issue 39): ``examples/vision.py``'s CNN
under ``torch.compile`` with ``aot_eager`` and with inductor, two DataLoader workers, on a real
Trainer. Window 0 holds the first compile (forward and backward), window 1 runs warm.

torch writes its compile ranges (``Pregraph bytecode``, ``AOTDispatcher Runtime Wrapper
Prologue``, ``## Call CompiledFxGraph … ##``, ``Torch-Compiled Region``…) as ``cpu_op``, opened in
one Python call and closed in another: held to nesting as ops, they crossed the calls around them
(7-8 crossings per window, measured before the fix). One inductor run per module: a cold inductor
compile takes ~20 s on a 2-core CPU, in a cache directory of the test's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import overlaps_without_nesting
from support.vision_fit import fit_vision

from vt_lightning.analysis.nesting import RANGE_TRACK_TID_BASE

COMPILE_SPAN_PREFIX = "torch.compile: "


def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _fit_compiled(root: Path, backend: str) -> list[dict[str, Any]]:
    """Two windows of two batches each: 0-1 (the first compile) and 2-3 (warm)."""
    _fresh_dynamo()
    try:
        return fit_vision(
            root,
            max_steps=4,
            batch_size=16,
            length=128,
            backend=backend,
            logger=True,
            wait=0,
            warmup=0,
            active=2,
            repeat=2,
        )
    finally:
        _fresh_dynamo()


def _check_nests_and_shows_the_compile(traces: list[dict[str, Any]], backend: str) -> None:
    assert [t["vt_lightning"]["steps"] for t in traces] == [[0, 1], [2, 3]]
    for trace in traces:
        assert overlaps_without_nesting(trace) == [], (backend, trace["vt_lightning"]["nesting"])
        nesting = trace["vt_lightning"]["nesting"]
        assert nesting["crossings"] == nesting["moved_to_range_tracks"] + nesting["clamped_to_parent"], nesting
        names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        # The compiled code's ranges are still in the trace (on their thread or on a range track).
        assert any(name.startswith("Torch-Compiled Region") for name in names), (backend, sorted(names)[:50])
    first = traces[0]
    spans = [e for e in first["traceEvents"] if str(e.get("name", "")).startswith(COMPILE_SPAN_PREFIX)]
    assert spans and any(e["dur"] > 1000 for e in spans), spans  # the compile shows where it happened
    steps = [e for e in first["traceEvents"] if e.get("name") == "ProfilerStep#0"]
    assert steps and all(steps[0]["ts"] <= s["ts"] <= steps[0]["ts"] + steps[0]["dur"] for s in spans)
    # A moved range keeps its time and names the thread it came from, beside which it is drawn.
    for trace in traces:
        threads = {e["tid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        for event in trace["traceEvents"]:
            if event.get("ph") == "X" and isinstance(event["tid"], int) and event["tid"] >= RANGE_TRACK_TID_BASE:
                assert event["args"]["vt_lightning.thread"] in threads, event


def test_aot_eager_windows_nest_strictly_from_the_first_compile_on(tmp_path):
    _check_nests_and_shows_the_compile(_fit_compiled(tmp_path, "aot_eager"), "aot_eager")


@pytest.mark.skipif(
    tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5),
    reason="torch 2.4's cold inductor compile fills VizTracer's ring buffer (an estimated 37 M calls in the "
    "window) and its window took over 300 s to write on the loaded 2-core CI machine; aot_eager covers nesting there",
)
def test_inductor_windows_nest_strictly_from_the_first_compile_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    _check_nests_and_shows_the_compile(_fit_compiled(tmp_path / "run", "inductor"), "inductor")
