"""torch.compile made visible per window, on real Trainer runs (CPU, ``aot_eager``): recompiles with
their reason, a ``print()`` graph break at its exact line, one compile span in place of the
compiler's own calls, and nothing of ours left in torch's logging or dynamo's callbacks after."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import orjson
import pytest
import torch
import torch._dynamo
from conftest import load_trace, make_trainer, overlaps_without_nesting, recorded_name, trace_files
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.compile import (
    COMPILE_SPAN_PREFIX,
    compile_record,
    compile_span_events,
    compile_summary,
)
from vt_lightning.analysis.usercode import code_origin, parse_function
from vt_lightning.analysis.verdicts.compile import RULES as COMPILE_RULES
from vt_lightning.constants import SUMMARY_JSON_SUFFIX
from vt_lightning.recording.compile_watch import GRAPH_BREAK_LOGGER

THIS_FILE = str(Path(__file__).resolve())
# Files that only run while dynamo compiles: none of their calls may reach the trace.
COMPILER_FILES = re.compile(
    r"torch/_dynamo/(convert_frame|symbolic_convert|output_graph|bytecode_transformation)\.py"
    r"|torch/_inductor/|torch/fx/experimental/proxy_tensor\.py|torch/_functorch/_aot_autograd/(graph_compile|jit_compile_runtime_wrappers)\.py"
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GrowingBatches(Dataset):
    """Batch ``i`` has ``i + 2`` rows (``batch_size=None``): a new shape every step."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(index + 2, 8)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).tanh()


class Recompiling(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.compile(Net(), backend="aot_eager", dynamic=False)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Printing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        print("inside the compiled forward")  # the seeded graph break
        return y.relu()


PRINT_LINE = next(
    number
    for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1)
    if "# the seeded graph break" in text and "print(" in text
)


class LateCompiled(L.LightningModule):
    """Eager for the first two batches, compiled from batch 2: the compile falls in the window."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Printing()
        self.compiled = torch.compile(self.body, backend="aot_eager")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        y = self.compiled(x) if batch_idx >= 2 else self.body(x)
        return y.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _windows(root: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(summary, trace) of each window, in order."""
    out = []
    for trace_path in trace_files(root):
        (summary_path,) = trace_path.parent.glob(f"*{SUMMARY_JSON_SUFFIX}")
        out.append((orjson.loads(summary_path.read_bytes()), load_trace(trace_path)))
    return out


def _python_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "FEE" and e.get("ph") == "X"]


def _compile_kinds(info: dict[str, Any] | None, step_ms: dict[str, float] | None = None) -> list[str]:
    """The compile family's verdicts of a summary's ``compile`` key alone (no trace: no compile span)."""
    window = SimpleNamespace(summary={"compile": info, "step_ms": step_ms}, compile_spans=[])
    return [rule.kind for rule in COMPILE_RULES for _ in rule.find(window)]


def _our_hooks() -> dict[str, Any]:
    """What a window could leave behind: the graph-break logger's state, dynamo's callbacks."""
    logger = logging.getLogger(GRAPH_BREAK_LOGGER)
    handler = torch._dynamo.callback.callback_handler
    return {
        "level": logger.level,
        "propagate": logger.propagate,
        "filters": list(logger.filters),
        "handlers": list(logger.handlers),
        "start_callbacks": list(handler.start_callbacks),
        "end_callbacks": list(handler.end_callbacks),
        "torch_level": logging.getLogger("torch").level,
        "dynamo_level": logging.getLogger("torch._dynamo").level,
    }


def test_new_shape_each_step_is_a_recompile_with_its_reason_and_one_span_per_compile(tmp_path):
    callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1, memory_snapshot=False)
    make_trainer(tmp_path, [callback], max_steps=5).fit(Recompiling(), DataLoader(GrowingBatches(), batch_size=None))

    ((summary, trace),) = _windows(tmp_path)
    compiled = summary["compile"]
    assert compiled is not None and compiled["compiles"] >= 2, compiled
    # Batches 2 and 3 bring 4 and 5 rows: each recompiles Net.forward, for a changed size.
    assert len(compiled["recompiles"]) >= 2, compiled["recompiles"]
    # torch 2.4 keeps no recompile reasons: then each recompile has none, and one note says why.
    reasons = not any("no recompile reasons" in note for note in compiled["notes"])
    for recompile in compiled["recompiles"]:
        assert (recompile["function"], recompile["file"]) == ("forward", THIS_FILE), recompile
        if reasons:
            assert re.search(r"size mismatch at index 0\. expected \d+, actual \d+", recompile["reason"]), recompile
        else:
            assert recompile["reason"] is None, recompile
    assert compiled["phases_ms"]["dynamo"] > 0 and compiled["phases_ms"]["aot_autograd"] > 0, compiled
    assert compiled["in_steps_ms"] > 0 and summary["breakdown_ms"].get("compile", 0) > 0, summary["breakdown_ms"]
    if not reasons:
        assert tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5), compiled["notes"]  # only where it is missing
        return

    (recompile,) = [v for v in summary["verdicts"] if v["kind"] == "recompile"]
    assert "size mismatch" in recompile["evidence"]["reason"] and recompile["where"][0]["function"] == "forward"

    # One span per compile on the training thread, in place of the compiler's own calls.
    events = _python_events(trace)
    spans = [e for e in events if e["name"].startswith(COMPILE_SPAN_PREFIX)]
    assert len(spans) >= 2 and all(re.search(r"\(dynamo \d+ms, aot \d+ms, inductor \d+ms\)$", s["name"]) for s in spans)
    assert not [e["name"] for e in events if COMPILER_FILES.search(e["name"])][:5]
    assert len(events) < 60_000, len(events)  # one compile alone made ~618,000 events unpaused
    # The spans nest with every call and op around them (torch's own compile ranges may not).
    assert [pair for pair in overlaps_without_nesting(trace) if COMPILE_SPAN_PREFIX in " ".join(pair)] == []


def test_print_in_a_compiled_forward_is_a_graph_break_at_that_line_and_nothing_of_ours_stays(tmp_path, capfd):
    before = _our_hooks()
    callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, memory_snapshot=False)
    data = DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    make_trainer(tmp_path, [callback], max_steps=8).fit(LateCompiled(), data)

    assert _our_hooks() == before  # levels, filters, handlers, callbacks: as the user had them
    assert "Graph break" not in capfd.readouterr().err  # the user's console got no new logging

    (first, first_trace), (second, _) = _windows(tmp_path)
    # The window that compiled: the break logged by dynamo, at the print's line, with its reason.
    breaks = first["compile"]["graph_breaks"]
    (seeded,) = [b for b in breaks if b["file"] == THIS_FILE]
    assert (seeded["line"], seeded["function"], seeded["source"]) == (PRINT_LINE, "forward", "compile"), seeded
    assert "print" in seeded["reason"], seeded
    assert seeded["calls"] >= 1  # and taken at run time (dynamo's resume function after the print)
    verdicts = first["verdicts"]
    where = [v["where"][0] for v in verdicts if v["kind"] == "graph_break"]
    assert {"file": THIS_FILE, "line": PRINT_LINE, "function": "forward"} in where, verdicts
    assert "compile_time" in [v["kind"] for v in verdicts]  # the first compile is most of that window
    assert any(e["name"].startswith(COMPILE_SPAN_PREFIX + "forward") for e in _python_events(first_trace))

    # A later window compiles nothing: the break is still found, from its resume function's calls.
    later = second["compile"]
    assert later is not None and later["compiles"] == 0, later
    (seen,) = [b for b in later["graph_breaks"] if b["file"] == THIS_FILE]
    assert (seen["line"], seen["source"]) == (PRINT_LINE, "run") and seen["calls"] >= 2, seen
    assert "compile_time" not in [v["kind"] for v in second["verdicts"]]


def test_a_user_who_logs_graph_breaks_keeps_seeing_them(tmp_path, capfd):
    """The user enabled the artifact themselves (as TORCH_LOGS=graph_breaks does): it still prints."""
    logger = logging.getLogger(GRAPH_BREAK_LOGGER)
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1, memory_snapshot=False)
        data = DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=4)
        make_trainer(tmp_path, [callback], max_steps=4).fit(LateCompiled(), data)
        assert logger.level == logging.DEBUG and logger.handlers == [handler] and logger.filters == []
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    err = capfd.readouterr().err  # torch 2.4 words the record differently
    assert (
        f"in user code at {THIS_FILE}:{PRINT_LINE}" in err
        or f'File "{THIS_FILE}", line {PRINT_LINE}, in forward' in err
    )
    ((summary, _),) = _windows(tmp_path)
    assert [b["line"] for b in summary["compile"]["graph_breaks"] if b["file"] == THIS_FILE] == [PRINT_LINE]


# --------------------------------------------------------------------------------------------------
# The pure parts, on the records older torch writes (CI runs torch 2.4 on Python 3.10)
# --------------------------------------------------------------------------------------------------


class CompiledContainer(L.LightningModule):
    """A torch.nn container compiled: dynamo compiles torch's wrapper frame around it
    (``torch/_dynamo/external_utils.py``, ``inner``), not a function of the user's."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
        self.fwd = torch.compile(self.net, backend="aot_eager", dynamic=False)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.fwd(batch).pow(2).sum()  # the user's call of the compiled callable

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_compile_verdicts_of_a_compiled_torch_module_point_at_the_users_call(tmp_path):
    """A new batch length at every step recompiles a compiled ``nn.Sequential``; the compiled frame
    is torch's own, so ``recompile`` and ``compile_time`` name the user's function that called it."""
    callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1, memory_snapshot=False)
    data = DataLoader(GrowingBatches(), batch_size=None)
    make_trainer(tmp_path, [callback], max_steps=5).fit(CompiledContainer(), data)
    ((summary, _),) = _windows(tmp_path)
    compiled = summary["compile"]
    assert compiled["recompiles"], compiled
    assert not any(r["file"] == THIS_FILE for r in compiled["recompiles"]), compiled["recompiles"]  # torch's frame
    by_kind = {v["kind"]: v for v in summary["verdicts"]}
    # torch 2.4 keeps no recompile reasons (one note says so): no recompile verdict to point anywhere
    reasons = not any("no recompile reasons" in note for note in compiled["notes"])
    kinds = ("recompile", "compile_time") if reasons else ("compile_time",)
    if not reasons:
        assert tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5), compiled["notes"]
    assert set(kinds) <= set(by_kind), [v["kind"] for v in summary["verdicts"]]
    for kind in kinds:
        assert [(w["function"], w["file"]) for w in by_kind[kind]["where"]] == [
            (recorded_name("CompiledContainer.training_step"), THIS_FILE)
        ], by_kind[kind]


def test_torch_2_4_records_give_places_phases_and_recompiles():
    """torch 2.4: callbacks without a compile id, phases in seconds, 'Reason:' graph-break lines."""
    info = {
        "spans": [{"pid": 1, "tid": 7, "start_us": 1000.0, "end_us": 401_000.0, "wall_start": 50.0, "wall_end": 50.4}],
        "compiles": [
            {
                "co_name": "forward",
                "co_filename": "/src/model.py",
                "co_firstlineno": 10,
                "start_time": 50.001,
                "entire_frame_compile_time_s": 0.4,
                "backend_compile_time_s": 0.3,
                "inductor_compile_time_s": 0.2,
            }
        ],
        "graph_breaks": [
            {
                "message": "Graph break in user code at /src/model.py:14\nReason: Unsupported: builtin: print\n"
                'User code traceback:\n  File "/src/model.py", line 14, in forward\n    print(x)\n',
                "compile_id": None,
            }
        ],
    }
    events = compile_span_events(info, [])
    assert [e["name"] for e in events] == [f"{COMPILE_SPAN_PREFIX}forward (dynamo 100ms, aot 100ms, inductor 200ms)"]
    record = compile_record(info)
    assert record["graph_breaks"][0] | {"compiles": 1} == {
        "file": "/src/model.py",
        "line": 14,
        "function": "forward",
        "reason": "Unsupported: builtin: print",
        "compiles": 1,
        "source": "compile",
    }
    steps = {3: (0.0, 500_000.0)}
    summary = compile_summary(record, [{**events[0], "ph": "X"}], steps)
    assert summary is not None and summary["share"] == 0.8 and summary["phases_ms"]["inductor"] == 200.0
    assert _compile_kinds(summary, {"mean": 500.0}) == ["compile_time", "graph_break"]


def test_spans_end_where_the_calls_around_dynamos_callbacks_begin_and_a_healthy_window_gets_nothing():
    info = {"spans": [{"pid": 1, "tid": 7, "start_us": 100.0, "end_us": 900.0, "compile_id": "0/1"}]}
    calls = [
        {"ph": "X", "pid": 1, "tid": 7, "ts": 90.0, "dur": 15.0},  # led to the start callback
        {"ph": "X", "pid": 1, "tid": 7, "ts": 890.0, "dur": 20.0},  # leads to the end callback
        {"ph": "X", "pid": 1, "tid": 7, "ts": 50.0, "dur": 1000.0},  # around the whole compile
        {"ph": "X", "pid": 1, "tid": 8, "ts": 95.0, "dur": 10.0},  # another thread
    ]
    (span,) = compile_span_events(info, calls)
    assert (span["ts"], span["ts"] + span["dur"]) == (105.0, 890.0)
    assert compile_summary(None, [{"name": "step (/src/train.py:3)", "ts": 0.0, "dur": 5.0}], {1: (0.0, 5.0)}) is None
    assert _compile_kinds(None) == []
    # A recompile for another reason than a shape is listed, with no verdict.
    quiet = {"recompiles": [{"function": "f", "file": "/a.py", "line": 1, "reason": "0/0: ___check_global_state()"}]}
    assert _compile_kinds(quiet) == []


@pytest.mark.slow
@pytest.mark.skipif(
    tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13),
    reason="torch 2.4's inductor compiles CPU kernels with -ffast-math, which turns on flush-to-zero for the "
    "whole process (later tests' subnormal floats fail), and compiles the backward graph outside dynamo's "
    "compile callbacks (its calls are recorded in full); verified on torch 2.13 and 2.15, 2.5-2.12 not tried",
)
def test_inductor_compile_has_its_own_phase_and_its_generated_code_is_nobodys(tmp_path, monkeypatch, capsys):
    """The one inductor compile of this file, in its own cache (a cold compile: tens of seconds).
    The modules inductor generates there (``Runner.call``) are never named as the user's code: not
    in the summary's tables, not in a verdict, not on the console."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))

    class Inductor(LateCompiled):
        def __init__(self) -> None:
            super().__init__()
            self.body = Net()
            self.compiled = torch.compile(self.body)

    callback = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1, memory_snapshot=False)
    data = DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=4)
    make_trainer(tmp_path, [callback], max_steps=4).fit(Inductor(), data)

    ((summary, trace),) = _windows(tmp_path)
    phases = summary["compile"]["phases_ms"]
    assert phases["inductor"] > 0 and phases["dynamo"] > 0, phases
    assert abs(sum(phases.values()) - summary["compile"]["total_ms"]) < 0.2 * summary["compile"]["total_ms"]
    spans = [e["name"] for e in _python_events(trace) if e["name"].startswith(COMPILE_SPAN_PREFIX)]
    assert any(re.search(r"^torch\.compile: forward \(.*inductor [1-9]\d*ms\)$", s) for s in spans), spans
    # The run's first compile falls in the window: only the calls that led to it are recorded.
    compiler = [e["name"] for e in _python_events(trace) if COMPILER_FILES.search(e["name"])]
    assert len(compiler) < 1000, sorted(set(compiler))[:20]  # unpaused: ~618,000 for one compile
    # Generated code ran in the window's steps...
    generated = [e["name"] for e in _python_events(trace) if str(cache.resolve()) in e["name"]]
    assert generated, "no call of inductor's generated code in the trace"
    # ...and is nobody's: every user entry and every verdict place is this file's code.
    top = summary["top_python"]
    user_files = {e["file"] for e in top["by_self"] + top["by_inclusive"] if e["origin"] == "user"}
    assert user_files <= {THIS_FILE}, user_files
    assert {code_origin(parse_function(name)[1])[0] for name in generated} == {"generated"}, generated[:3]
    in_cache = [e for e in top["by_self"] + top["by_inclusive"] if str(cache) in str(e["file"])]
    assert all(e["origin"] == "generated" for e in in_cache), in_cache
    for verdict in summary["verdicts"]:
        assert all(w["file"] == THIS_FILE for w in verdict["where"]), verdict
    console = capsys.readouterr()
    assert "Runner.call" not in console.out + console.err


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).relu()


@torch.compile(dynamic=False)
def head_loss(y: torch.Tensor) -> torch.Tensor:
    y = y.sum(dim=1)
    print("head")  # a graph break, met again at each recompile
    return y.pow(2).mean()


class CompiledFromStepZero(L.LightningModule):
    """Inductor compiles ``Block.forward`` (a user module) and ``head_loss`` at step 0."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.compile(Block(), dynamic=False)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return head_loss(self.block(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ResizedAt(Dataset):
    """Batches of 4 rows (``batch_size=None``), 6 from batch ``at``: a recompile there."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(6 if index >= self.at else 4, 8)


@pytest.mark.slow
@pytest.mark.skipif(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13), reason="see the inductor test above")
def test_first_window_of_a_model_compiled_at_step_zero_says_so_and_names_its_graphs(tmp_path, monkeypatch, caplog):
    """The default schedule: compiling happens in step 0, the window is batches 2-4, and batch 3's new
    shape recompiles both functions in the window. The window says what was compiled before it and
    during it, and each graph's run in the ops table is named by the user's function."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    caplog.set_level(logging.INFO)
    counters = torch._dynamo.utils.counters  # the process's: earlier tests compiled too
    at_start = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    callback = VizTraceCallback(memory_snapshot=False)
    make_trainer(tmp_path, [callback], max_steps=5).fit(
        CompiledFromStepZero(), DataLoader(ResizedAt(3), batch_size=None)
    )

    ((summary, _),) = _windows(tmp_path)
    assert summary["steps"]["recorded"] == [2, 3, 4]
    compiled = summary["compile"]
    before, during = compiled["before"], compiled["during"]
    # Before: Block.forward, head_loss and its resume function, each a forward and a backward graph.
    assert before["graphs"] - at_start[0] >= 3 and before["compile_s"] > 0, before
    assert before["graph_breaks"] - at_start[1] >= 1, before
    # During: batch 3's shape recompiles each frame, and head_loss meets its graph break again.
    assert during["graphs"] >= 3 and during["recompiles"] >= 3 and during["graph_breaks"] >= 1, during
    assert during["compile_s"] > 0, during

    named = {(g["function"], g["file"], g["backward"]) for g in compiled["graphs"]}
    assert {("forward", THIS_FILE, False), ("forward", THIS_FILE, True)} <= named, compiled["graphs"]
    assert {("head_loss", THIS_FILE, False)} <= named, compiled["graphs"]
    assert all(g["hash"] and g["calls"] >= 1 for g in compiled["graphs"]), compiled["graphs"]
    attempts = {g["compile_id"].rsplit("/", 1)[1] for g in compiled["graphs"] if g["function"] == "forward"}
    assert {"0", "1"} <= attempts, compiled["graphs"]  # the first compile's graph ran, then the recompile's
    ops = [row["name"] for row in summary["top_ops"]["by_cpu"]] + list(summary["top_ops"]["totals"]["ms"])
    assert not [name for name in ops if name.startswith("## Call CompiledFxGraph")], ops
    label = r"compiled graph: (backward of )?{} \(test_compile_watch\.py:\d+\) \[\w+\]"
    for function in ("forward", "head_loss"):
        assert any(re.fullmatch(label.format(function), name) for name in ops), ops

    (md,) = tmp_path.rglob("*.summary.md")
    report = md.read_text()
    assert re.search(r"compiled model: \d+ graph\(s\), [\d.]+ s compiling before this window", report), report
    assert "| `compiled graph: forward (test_compile_watch.py:" in report, report
    assert re.search(
        r"window 0: compiled model: \d+ graph\(s\), [\d.]+ s compiling before this window \(\d+ graph\(s\), [\d.]+ s "
        r"during\), [1-9]\d* recompile\(s\), [1-9]\d* graph break\(s\) · traced [\d.]+ ms/step vs [\d.]+ ms untraced "
        r"\([\d.]+x, 2 step\(s\)\)",
        caplog.text,
    ), caplog.text
