"""Window summaries from a real Trainer whose step time is known (a Dataset that sleeps 40 ms per
batch, a training_step that spends its time in one function), and how they reach the loggers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import orjson
import pytest
import torch
from conftest import load_trace, make_trainer, recorded_name, trace_files
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.summary import (
    BREAKDOWN_PARTS,
    SCHEMA_VERSION,
)

DATA_WAIT_S = 0.040
WORK_S = 0.012


class SleepyBatches(Dataset):
    """Each batch takes a known 40 ms to fetch (``batch_size=None``: one ``__getitem__`` per batch)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(DATA_WAIT_S)
        return torch.randn(4, 8)


def crunch_features(x: torch.Tensor) -> torch.Tensor:
    """The one user function the step spends most of its time in."""
    time.sleep(WORK_S)
    return x * 2


class SlowDataModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(crunch_features(batch)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _summaries(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(p.read_bytes()) for p in sorted(Path(root).rglob("*.summary.jsonc"))]


TRACE_SLACK_MS = 0.01  # summaries round to the microsecond; torch and VizTracer time with two clocks


def _calls_per_counted_step(trace: dict[str, Any], counted: list[int]) -> tuple[list[list[float]], list[list[float]]]:
    """Per counted step, the durations (ms) of the ``SleepyBatches.__getitem__`` and the
    ``crunch_features`` calls that ran inside it, read from the merged trace."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = {
        int(e["name"][len("ProfilerStep#") :]): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["name"].startswith("ProfilerStep#")
    }
    fetch, work = recorded_name("SleepyBatches.__getitem__"), recorded_name("crunch_features")
    out: tuple[list[list[float]], list[list[float]]] = ([], [])
    for step in counted:
        lo, hi = steps[step]
        inside = [e for e in events if e.get("cat") == "FEE" and lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
        for name, calls in zip((fetch, work), out, strict=True):
            calls.append([e["dur"] / 1000 for e in inside if e["name"].split(" (")[0] == name])
    return out


def _mean_ms(per_step: list[list[float]]) -> float:
    return sum(sum(calls) for calls in per_step) / len(per_step)


@pytest.fixture(scope="module")
def slow_data_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow_data")
    callback = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1)
    trainer = make_trainer(root, [callback], max_steps=7)
    trainer.fit(SlowDataModel(), DataLoader(SleepyBatches(), batch_size=None))
    return root


def test_summary_names_the_data_wait_and_the_busy_function(slow_data_run: Path) -> None:
    (trace,) = trace_files(slow_data_run)
    (summary,) = _summaries(slow_data_run)
    stem = trace.name[: -len(".pt.trace.json.gz")]
    assert (trace.parent / f"{stem}.summary.jsonc").is_file()
    assert (trace.parent / f"{stem}.summary.md").is_file()
    assert summary["schema"] == SCHEMA_VERSION
    assert summary["steps"]["recorded"] == [2, 3, 4]
    assert summary["steps"]["counted"] == [3, 4]  # the first step's batch was fetched before recording
    assert summary["steps"]["breakdown_source"] == "lightning stage ranges"
    parts = summary["breakdown_ms"]
    assert set(parts) == set(BREAKDOWN_PARTS)
    # Each counted step fetched its batch inside the step (one __getitem__ that sleeps DATA_WAIT_S)
    # and ran crunch_features in training_step: the whole fetch is data wait and the whole work is
    # forward. Measured against the trace's own calls, so the machine's speed does not matter.
    fetch_ms, work_ms = _calls_per_counted_step(load_trace(trace), summary["steps"]["counted"])
    assert all(len(calls) == 1 and calls[0] >= DATA_WAIT_S * 1000 for calls in fetch_ms), fetch_ms
    assert all(len(calls) == 1 and calls[0] >= WORK_S * 1000 for calls in work_ms), work_ms
    assert parts["data_wait"] >= _mean_ms(fetch_ms) - TRACE_SLACK_MS, (parts, fetch_ms)
    assert parts["forward"] >= _mean_ms(work_ms) - TRACE_SLACK_MS, (parts, work_ms)
    # The parts tile the step: their sum is the mean step time.
    assert sum(parts.values()) == pytest.approx(summary["step_ms"]["mean"], abs=0.05)
    assert summary["step_ms"]["max"] >= summary["step_ms"]["p50"] >= DATA_WAIT_S * 1000
    user = [e for e in summary["top_python"]["by_inclusive"] if e["origin"] == "user"]
    crunch = [e for e in user if e["function"] == "crunch_features"]
    assert crunch and crunch[0]["inclusive_ms"] >= WORK_S * 1000 * 0.9, user
    assert crunch[0]["file"] == __file__
    # User code comes first in both rankings.
    for ranking in (summary["top_python"]["by_self"], summary["top_python"]["by_inclusive"]):
        origins = [e["origin"] for e in ranking]
        assert origins[: len([o for o in origins if o == "user"])] == ["user"] * origins.count("user")
    assert summary["top_ops"]["by_cpu"] and summary["gpu"] is None
    assert summary["memory"]["peak_allocated_bytes"] > 0
    markdown = (trace.parent / f"{stem}.summary.md").read_text()
    assert "crunch_features" in markdown and "| data wait |" in markdown


def test_tensorboard_gets_the_scalars_and_the_table(slow_data_run: Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    (summary,) = _summaries(slow_data_run)
    (events,) = list(Path(slow_data_run).rglob("events.out.tfevents.*"))
    acc = event_accumulator.EventAccumulator(str(events.parent), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for name in (
        "step_ms",
        "data_wait_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "other_ms",
        "peak_allocated_mb",
    ):
        assert f"vt_lightning/{name}" in scalars, scalars
    (point,) = acc.Scalars("vt_lightning/data_wait_ms")
    assert point.value == pytest.approx(summary["breakdown_ms"]["data_wait"], rel=1e-5)
    assert point.step == 4 == summary["window"]["log_step"]  # the window's last batch, as Lightning logs it
    texts = [t for t in acc.Tags()["tensors"] if t.startswith("vt_lightning/window_0")]
    assert texts, acc.Tags()["tensors"]
    (text,) = acc.Tensors(texts[0])
    assert b"crunch_features" in text.tensor_proto.string_val[0]


def test_csv_logger_gets_the_scalars(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    trainer = make_trainer(
        tmp_path,
        [VizTraceCallback(wait=0, warmup=1, active=2)],
        max_steps=5,
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
    )
    from conftest import MarkerModel, loader

    trainer.fit(MarkerModel(), loader())
    (metrics,) = list(tmp_path.rglob("metrics.csv"))
    header, *rows = metrics.read_text().splitlines()
    assert "vt_lightning/step_ms" in header and "vt_lightning/forward_ms" in header
    column = header.split(",").index("vt_lightning/step_ms")
    assert [r for r in rows if r.split(",")[column]]


def test_summary_off_writes_no_summary(tmp_path: Path) -> None:
    from conftest import MarkerModel, loader

    trainer = make_trainer(tmp_path, [VizTraceCallback(wait=0, warmup=1, active=1, summary=False)], max_steps=3)
    trainer.fit(MarkerModel(), loader())
    assert trace_files(tmp_path) and not list(tmp_path.rglob("*.summary.*"))


class _RecordingLogger:
    """A Lightning logger that records each ``log_metrics`` call with its thread and batch."""

    @staticmethod
    def make() -> Any:
        import threading

        from lightning.pytorch.loggers import Logger

        class RecordingLogger(Logger):
            def __init__(self) -> None:
                super().__init__()
                self.calls: list[tuple[int | None, dict[str, float], str, int]] = []
                self.batch = -1

            @property
            def name(self) -> str:
                return "recording"

            @property
            def version(self) -> int:
                return 0

            def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
                self.calls.append((step, dict(metrics), threading.current_thread().name, self.batch))

            def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
                pass

        return RecordingLogger()


def _hold_until_written(logger: Any, tracer: VizTraceCallback, at_batch: int, windows: int) -> Any:
    """A callback (placed before the tracer) that holds batch ``at_batch`` until ``windows`` windows
    are written, so which batch logs them does not depend on timing. Written means answered: the
    answers wait in the inbox until the tracer's own batch start reads them into ``results``."""
    from lightning.pytorch.callbacks import Callback

    class Hold(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            logger.batch = trainer.fit_loop.total_batch_idx
            if logger.batch == at_batch:
                deadline = time.monotonic() + 120
                while len(tracer.results) + tracer._controller.inbox.arrived() < windows:
                    assert time.monotonic() < deadline, "the writer did not answer within 120 s"
                    time.sleep(0.01)

    return Hold()


def _ours(logger: Any) -> list[tuple[int | None, dict[str, float], str, int]]:
    return [c for c in logger.calls if any(k.startswith("vt_lightning/") for k in c[1])]


def test_summary_is_logged_on_the_training_thread_at_the_next_batch(
    tmp_path: Path, writer_process_per_window: None
) -> None:
    """Not only at the end of fit: at the first batch start after the writer returned the window
    (its process: a window held to the run's end, ``handoff.finishes_at_end``, is logged there)."""
    import threading

    from conftest import MarkerModel, loader

    tracer = VizTraceCallback(wait=0, warmup=1, active=2, repeat=1)
    logger = _RecordingLogger.make()
    trainer = make_trainer(tmp_path, [_hold_until_written(logger, tracer, 4, 1), tracer], max_steps=8, logger=logger)
    trainer.fit(MarkerModel(), loader())
    (call,) = _ours(logger)
    step, metrics, thread, batch = call
    assert thread == threading.main_thread().name
    assert batch == 4  # logged at the batch start right after the result came back, not at the end
    assert step == 2  # the window's last batch
    assert metrics["vt_lightning/step_ms"] == tracer.results[0].summary["step_ms"]["mean"]


def test_a_summary_arriving_during_a_window_is_logged_after_it(tmp_path: Path, writer_process_per_window: None) -> None:
    """Logging inside a window would put the logger's own calls into that window's trace."""
    from conftest import MarkerModel, load_trace, loader

    tracer = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2)  # active 2-3 and 6-7
    logger = _RecordingLogger.make()
    hold = _hold_until_written(logger, tracer, 6, 1)  # window 0 is written while window 1 records
    trainer = make_trainer(tmp_path, [hold, tracer], max_steps=10, logger=logger)
    trainer.fit(MarkerModel(), loader())
    batches = [c[3] for c in _ours(logger)]
    assert batches[0] == 8  # the first batch start after window 1 closed
    second = load_trace(tracer.results[1].trace_path)
    assert not [e for e in second["traceEvents"] if "RecordingLogger.log_metrics" in str(e.get("name"))]
