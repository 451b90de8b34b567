"""Side recorders (recording/side.py): started at a window's first active batch, stopped at its
close, their data handed to the writer; one that fails costs only itself, never the window."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from conftest import MarkerModel, load_trace, loader, make_trainer, marker_steps, trace_files

import vt_lightning.controller.windows as windows
from vt_lightning import VizTraceCallback
from vt_lightning.controller.handoff import BackgroundWriter


class Probe:
    """Notes the training batch it was started and stopped at, and hands over what it saw."""

    def __init__(self, name: str, trainer: Any, log: list[tuple[str, str, int]], fail: str | None = None) -> None:
        self.name, self.trainer, self.log, self.fail = name, trainer, log, fail

    def _note(self, what: str) -> None:
        self.log.append((self.name, what, self.trainer.fit_loop.total_batch_idx))
        if what == self.fail:
            raise RuntimeError(f"{self.name} broke at {what}")

    def start(self) -> None:
        self._note("start")

    def stop(self) -> None:
        self._note("stop")

    def collect(self) -> Any:
        self._note("collect")
        return {"seen_by": self.name}


def _fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str | None) -> tuple[list, list[dict], list[str]]:
    log: list[tuple[str, str, int]] = []
    extras: list[dict] = []
    original_hand_off = BackgroundWriter.hand_off

    def side(options: Any, run: Any, python: Any, trainer: Any, target: Any) -> list[Any]:
        return [Probe("first", trainer, log, fail), Probe("second", trainer, log)]

    def hand_off(self: BackgroundWriter, closed: Any, **how: Any) -> Any:
        extras.append(dict(closed.job.extras))
        return original_hand_off(self, closed, **how)

    monkeypatch.setattr(windows, "side_recorders", side)
    monkeypatch.setattr(BackgroundWriter, "hand_off", hand_off)
    callback = VizTraceCallback(wait=2, warmup=1, active=2, repeat=1, summary=False, memory_snapshot=False)
    with pytest.warns(RuntimeWarning, match=f"first recorder failed to {fail}") if fail else nullcontext():
        make_trainer(tmp_path, [callback], max_steps=8).fit(MarkerModel(), loader())
    traces = trace_files(tmp_path)
    return log, extras, [str(p) for p in traces]


def test_side_recorders_run_in_the_active_batches_and_hand_their_data_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, extras, traces = _fit(tmp_path, monkeypatch, fail=None)
    # Window: batches 2 (warmup), 3 and 4 (active). Started at batch 3's start, in order; stopped in
    # reverse at the close after batch 4, before their data is collected.
    assert log == [
        ("first", "start", 3),
        ("second", "start", 3),
        ("second", "stop", 4),
        ("first", "stop", 4),
        ("first", "collect", 4),
        ("second", "collect", 4),
    ]
    assert extras == [{"first": {"seen_by": "first"}, "second": {"seen_by": "second"}}]
    assert len(traces) == 1 and marker_steps(load_trace(Path(traces[0]))) == {3, 4}


@pytest.mark.parametrize("fail", ["start", "stop", "collect"])
def test_a_failing_side_recorder_costs_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    log, extras, traces = _fit(tmp_path, monkeypatch, fail=fail)
    assert len(traces) == 1 and marker_steps(load_trace(Path(traces[0]))) == {3, 4}  # the window is whole
    assert extras and extras[0].get("second") == {"seen_by": "second"}
    assert "first" not in extras[0]
    if fail == "start":  # never started: never stopped either
        assert ("first", "stop", 4) not in log
    assert ("second", "stop", 4) in log
