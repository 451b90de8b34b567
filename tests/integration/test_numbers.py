"""Numbers that add up (issue 22, item 14), each on a real Lightning Trainer on CPU.

* The user's own ``optimizer_step`` override (which sleeps a known 20 ms and never calls
  Lightning's) is the optimizer part, and their ``on_train_batch_end`` the ``hooks`` part, with a
  Trainer profiler set and with ``lightning_view=False``: not "other".
* Validation that runs inside a window is its own part, as long as the window's validation range.
* The step breakdown and the function table cover the same steps (``covers.steps``).
* ``diff`` of two windows where an op falls off the top list says so: never "new" nor -100 %.
* Every field docs/files.md, docs/summary.md and docs/triggers.md list is in the real files.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import orjson
import pytest
import torch
from conftest import MS, VirtualClock, load_trace, loader, make_trainer, recorded_name, trace_files
from support.paths import REPO
from torch import nn

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.compare import diff, diff_table
from vt_lightning.cli.command import main

OPTIMIZER_S = 0.020
HOOK_S = 0.004
VALIDATION_S = 0.005
SLACK_MS = 0.5  # rounding, and torch's and VizTracer's clocks meeting in one timeline


class OwnHooks(L.LightningModule):
    """Overrides ``optimizer_step`` (stepping the optimizer itself, never through Lightning's) and
    ``on_train_batch_end``, each sleeping a known time, and validates."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        time.sleep(OPTIMIZER_S)
        optimizer.step(closure=optimizer_closure)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        time.sleep(HOOK_S)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(VALIDATION_S)
        (x,) = batch
        self.log("val", self.layer(x).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _summaries(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(p.read_bytes()) for p in sorted(Path(root).rglob("*.summary.jsonc"))]


def _one_window(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    (trace,) = trace_files(root)
    (summary,) = _summaries(root)
    return load_trace(trace), summary


# Windows of batches 1-3 (warmup 0); validation after batch 1 runs inside the window (in step 2).
RUNS = {
    "profiler_simple": ({}, {"profiler": "simple"}),
    "lightning_view_off": ({"lightning_view": False}, {}),
    "defaults": ({}, {}),
}


@pytest.fixture(scope="module", params=list(RUNS))
def own_hooks_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    options, trainer_options = RUNS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    callback = VizTraceCallback(wait=0, warmup=1, active=3, repeat=1, **options)
    trainer = make_trainer(root, [callback], max_steps=5, val_check_interval=2, limit_val_batches=2, **trainer_options)
    trainer.fit(OwnHooks(), loader(), loader(n=8))
    trace, summary = _one_window(root)
    return {"name": request.param, "trace": trace, "summary": summary}


def _user_calls(trace: dict[str, Any], qualname: str, steps: list[int]) -> list[float]:
    """Durations (ms) of the calls of ``qualname`` inside the ProfilerStep ranges of ``steps``."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] in {f"ProfilerStep#{n}" for n in steps}]
    name = recorded_name(qualname)
    return [
        e["dur"] / 1000
        for e in events
        if e.get("cat") == "FEE"
        and e["name"].split(" (")[0] == name
        and Path(__file__).name in e["name"]  # on 3.10 names are bare: Lightning's optimizer_step too
        and any(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for lo, hi in spans)
    ]


def test_the_users_optimizer_step_and_hooks_are_their_parts_whatever_the_profiler(
    own_hooks_run: dict[str, Any],
) -> None:
    summary, trace = own_hooks_run["summary"], own_hooks_run["trace"]
    parts, counted = summary["breakdown_ms"], summary["steps"]["counted"]
    if own_hooks_run["name"] == "profiler_simple":
        assert summary["steps"]["breakdown_source"] == "lightning methods (python calls)"  # no stage ranges
    assert summary["steps"]["user_hooks"]["optimizer_step"] == "optimizer"
    assert summary["steps"]["user_hooks"]["on_train_batch_end"] == "hooks"
    # The override's own calls in the counted steps, read from the trace: its sleep is in it.
    override_ms = _user_calls(trace, "OwnHooks.optimizer_step", counted)
    assert len(override_ms) == len(counted) and min(override_ms) >= OPTIMIZER_S * 1000, override_ms
    # Its sleep is the optimizer part (the closure it runs is forward and backward), not "other".
    assert parts["optimizer"] >= OPTIMIZER_S * 1000 - SLACK_MS, parts
    assert parts["optimizer"] <= sum(override_ms) / len(counted) + SLACK_MS, (parts, override_ms)
    assert parts["other"] < OPTIMIZER_S * 1000 / 2, parts
    assert parts["hooks"] >= HOOK_S * 1000 - SLACK_MS, parts
    assert sum(parts.values()) == pytest.approx(summary["step_ms"]["mean"], abs=0.05)


def test_validation_inside_a_window_is_its_own_part(own_hooks_run: dict[str, Any]) -> None:
    summary, trace = own_hooks_run["summary"], own_hooks_run["trace"]
    (validation,) = trace["vt_lightning"]["validation"]  # after batch 1: inside step 2
    assert validation["in_step"] in summary["steps"]["counted"]
    assert validation["duration_ms"] >= 2 * VALIDATION_S * 1000
    # The whole validation range, and nothing else, is the validation part (per counted step).
    per_step = validation["duration_ms"] / len(summary["steps"]["counted"])
    assert summary["breakdown_ms"]["validation"] == pytest.approx(per_step, abs=SLACK_MS)
    assert summary["steps"]["user_hooks"]["validation_step"] == "validation"
    # The end-of-fit table gives it a column, so the parts shown add up to the step.
    import io

    from vt_lightning.export.report import print_windows_table

    out = io.StringIO()
    print_windows_table([summary], file=out)
    header = next(line for line in out.getvalue().splitlines() if "step" in line and "fwd" in line)
    assert "val" in header.split() and "hooks" in header.split(), out.getvalue()


def test_the_breakdown_and_the_function_table_cover_the_same_steps(own_hooks_run: dict[str, Any]) -> None:
    summary, trace = own_hooks_run["summary"], own_hooks_run["trace"]
    assert summary["steps"]["recorded"] == [1, 2, 3]
    assert summary["covers"]["steps"] == summary["steps"]["counted"] == [2, 3]
    assert {"breakdown_ms", "top_python", "top_ops"} <= set(summary["covers"]["keys"])
    # optimizer_step runs once per step: the table shows the covered steps' calls, per covered step.
    (row,) = [
        e for e in summary["top_python"]["by_inclusive"] if e["function"] == recorded_name("OwnHooks.optimizer_step")
    ]
    override_ms = _user_calls(trace, "OwnHooks.optimizer_step", [2, 3])
    assert row["calls"] == 2
    assert row["inclusive_ms"] == pytest.approx(sum(override_ms) / 2, abs=0.01)


# --------------------------------------------------------------------------------------------------
# diff: an op that falls off the top list
# --------------------------------------------------------------------------------------------------

# Twelve distinct ops on a big tensor fill every window's top-10 list.
HEAVY = (
    torch.sin,
    torch.cos,
    torch.exp,
    torch.tanh,
    torch.sigmoid,
    torch.erf,
    torch.atan,
    torch.floor,
    torch.ceil,
    torch.round,
    torch.neg,
    torch.reciprocal,
)


class ShiftingOps(L.LightningModule):
    """Batches 0-3 (window A) run a heavy ``cumsum``, later ones (window B) a tiny one and a sort."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.register_buffer("big", torch.rand(1024, 1024) + 0.5)
        self.register_buffer("long", torch.rand(4096, 1024))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        for op in HEAVY:
            op(self.big)
        window_a = self.trainer.fit_loop.total_batch_idx < 4
        torch.cumsum(self.long if window_a else self.long[:2, :2], dim=0)
        if not window_a:
            torch.argsort(self.big[:64, :64], dim=0)  # an op only window B runs
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture(scope="module")
def two_windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    root = tmp_path_factory.mktemp("shifting")
    # A: batches 1-3, B: 5-7. Two counted steps a window: the tiny cumsum is timed on the wall
    # clock, and one preemption inside it on a loaded machine must not lift it into B's top 10.
    callback = VizTraceCallback(wait=0, warmup=1, active=3, repeat=2)
    make_trainer(root, [callback], max_steps=8).fit(ShiftingOps(), loader())
    a, b = _summaries(root)
    a["_path"], b["_path"] = map(str, sorted(Path(root).rglob("*.summary.jsonc")))  # as the command's loader
    assert a["steps"]["recorded"] == [1, 2, 3] and b["steps"]["recorded"] == [5, 6, 7]
    return a, b


def _top_ops(summary: dict[str, Any]) -> dict[str, float]:
    return {op["name"]: op["self_cpu_ms"] for op in summary["top_ops"]["by_cpu"]}


def _op_row(result: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [r for r in result["ops"] if r["name"] == name]
    return row


def test_diff_of_an_op_that_fell_off_the_top_list_is_measured_not_new_nor_gone(
    two_windows: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    a, b = two_windows
    # The situation: cumsum tops A's list and is not in B's top 10 (12 heavier ops are).
    assert "aten::cumsum" in _top_ops(a), _top_ops(a)
    assert "aten::cumsum" not in _top_ops(b), _top_ops(b)
    assert len(b["top_ops"]["by_cpu"]) == 10
    for forward, (first, second) in (("A->B", (a, b)), ("B->A", (b, a))):
        result = diff([first], [second], limit=0)
        row = _op_row(result, "aten::cumsum")
        smaller = "b" if forward == "A->B" else "a"
        # B ran it: measured from B's totals, or under the one threshold there; never "only in".
        assert row["state"] in ("both", f"under threshold in {smaller.upper()}"), row
        assert row[f"{smaller}_ms"] is not None or row[f"{smaller}_text"].startswith("< "), row
        cells, _ = diff_table([row])
        assert "only in" not in cells[0][-1] and "?" not in "".join(cells[0]), cells
        sin = _op_row(result, "aten::sin")  # ops both windows ran the same way compare as numbers
        assert sin["state"] == "both" and sin["delta_percent"] is not None


def test_diff_says_only_in_b_for_an_op_window_a_never_ran(
    two_windows: tuple[dict[str, Any], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_windows
    result = diff([a], [b], limit=0)
    row = _op_row(result, "aten::sort")
    assert row["state"] == "only in B" and row["a_ms"] is None and row["b_ms"] > 0, row
    assert result["noise"]["a"]["steps"] == 2 and result["threshold_ms"] > 0
    # The command prints the same words: the rule once, the steps' spread, "only in B".
    paths = [Path(p["_path"]).parent for p in (a, b)]
    assert main(["diff", str(paths[0]), str(paths[1]), "--top", "200"]) == 0
    out = capsys.readouterr().out
    assert result["rule"] in out and "steps: A " in out and out.count("ms/step on both sides") == 1
    sort_line = next(line for line in out.splitlines() if "aten::sort" in line)
    assert "only in B" in sort_line and "?" not in out


def test_diff_of_summaries_without_totals_never_says_only_in(
    two_windows: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Summaries written before totals existed: a name missing from a top list is under its last value."""
    old = []
    for summary in two_windows:
        copy = orjson.loads(orjson.dumps(summary))
        del copy["top_python"]["totals"], copy["top_ops"]["totals"]
        old.append(copy)
    for first, second, side in ((old[:1], old[1:], "B"), (old[1:], old[:1], "A")):
        row = _op_row(diff(first, second, limit=0), "aten::cumsum")
        assert row["state"] == f"under threshold in {side}" and row["delta_percent"] is None, row


# --------------------------------------------------------------------------------------------------
# The docs' fields exist in the real files
# --------------------------------------------------------------------------------------------------


def doc_table(path: Path, heading: str) -> Iterator[tuple[list[str], set[str]]]:
    """The rows of the first table after the line containing ``heading``: (keys, when). Keys are
    the backticked names of the first column, ``.x`` continuing the previous key's parent; when is
    the second column's conditions if the table has a "when" column, else ``{"always"}``."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if heading in line)
    rows = []
    for line in lines[start + 1 :]:
        text = line.strip()
        if not text.startswith("|"):
            if rows:
                break
            continue
        rows.append([cell.strip() for cell in text.strip("|").split("|")])
    header, _, *body = rows
    has_when = header[1] == "when"
    for cells in body:
        keys: list[str] = []
        for token in re.findall(r"`([^`]+)`", cells[0]):
            if token.startswith(".") and keys:
                token = keys[-1].rsplit(".", 1)[0] + token
            keys.append(token)
        yield keys, {c.strip() for c in cells[1].split(",")} if has_when else {"always"}


def missing(value: Any, path: str) -> list[str]:
    """Why ``path`` (``a.b[].c``) is not in ``value``; [] when it is. A list must be non-empty."""
    head, _, rest = path.partition(".")
    key = head.removesuffix("[]")
    if not isinstance(value, dict) or key not in value:
        return [path]
    inner = value[key]
    if head.endswith("[]"):
        if not isinstance(inner, list) or not inner:
            return [f"{path}: {key} is not a non-empty list"]
        return [f"{key}[{i}].{p}" for i, element in enumerate(inner) for p in missing(element, rest)] if rest else []
    if rest:
        return [f"{key}.{p}" for p in missing(inner, rest)]
    return []


class SlowBatchModel(OwnHooks):
    """One slow batch (on a virtual step clock, so the trigger cannot flake on a loaded machine)."""

    SLOW_BATCH = 16

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        slow = self.trainer.fit_loop.total_batch_idx == self.SLOW_BATCH
        self.clock.ns += (400 if slow else 10) * MS
        return super().training_step(batch, batch_idx)


@pytest.fixture(scope="module")
def documented_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A scheduled window with validation inside (batches 1-3) and a slow-step window cut short by
    max_steps (warmup 17, batches 18-19 of 18-20); a CSV logger; and a window that overflows."""
    from lightning.pytorch.loggers import CSVLogger

    root = tmp_path_factory.mktemp("documented")
    clock = VirtualClock()
    callback = VizTraceCallback(
        wait=0, warmup=1, active=3, repeat=1, slow_step_factor=3.0, slow_step_baseline=5, trigger_interval=0
    )
    callback._controller.step_clock = clock
    trainer = make_trainer(
        root,
        [callback],
        max_steps=20,
        val_check_interval=3,
        limit_val_batches=2,
        logger=CSVLogger(root),
        log_every_n_steps=1,
    )
    trainer.fit(SlowBatchModel(clock), loader(n=4 * 40), loader(n=8))
    traces = [load_trace(p) for p in trace_files(root)]
    (metrics,) = list(root.rglob("metrics.csv"))
    overflow_root = tmp_path_factory.mktemp("overflow")
    small = VizTraceCallback(wait=0, warmup=1, active=1, repeat=1, tracer_entries=200)
    make_trainer(overflow_root, [small], max_steps=3).fit(OwnHooks(), loader())
    return {
        "metadata": [t["vt_lightning"] for t in traces] + [load_trace(trace_files(overflow_root)[0])["vt_lightning"]],
        "summaries": _summaries(root),
        "scalars": set(metrics.read_text().splitlines()[0].split(",")),
    }


def _conditions(meta: dict[str, Any]) -> set[str]:
    """What a window is, in the docs' "when" words."""
    held = {"always"}
    held |= {"partial"} if meta.get("partial") else set()
    held |= {"overflow"} if meta.get("overflow") else set()
    held |= {"triggered"} if meta.get("trigger") else set()
    held |= {"lightning_view"} if meta.get("lightning_view") else set()
    held |= {"validation"} if meta.get("validation") else set()
    return held


def test_every_field_the_docs_list_is_in_the_files(documented_run: dict[str, Any]) -> None:
    docs = REPO / "docs"
    problems: list[str] = []
    checked: set[str] = set()
    metadata = documented_run["metadata"]
    assert {"partial", "overflow", "triggered", "lightning_view", "validation"} <= set().union(
        *map(_conditions, metadata)
    )
    for meta in metadata:
        held = _conditions(meta)
        for keys, when in doc_table(docs / "files.md", "### `vt_lightning` metadata"):
            if when <= held:
                problems += [f"files.md metadata, window {meta['window']}: {p}" for k in keys for p in missing(meta, k)]
                checked |= {f"metadata.{k}" for k in keys}
        if "triggered" in held:
            for keys, _ in doc_table(docs / "triggers.md", "`vt_lightning.trigger` metadata"):
                problems += [f"triggers.md: {p}" for k in keys for p in missing(meta["trigger"], k)]
                checked |= {f"trigger.{k}" for k in keys}
            assert meta["trigger"]["reason"] == "slow_step"
            assert meta["trigger"]["detail"] == "over 3x the median of the last 5 steps"
    by_window = {meta["window"]: meta for meta in metadata[:-1]}  # the last is the overflow run's
    assert len(documented_run["summaries"]) == len(by_window) == 2
    for summary in documented_run["summaries"]:
        meta = by_window[summary["window"]["index"]]
        held = _conditions(meta) | {"hooks"}  # OwnHooks.on_train_batch_end runs in every counted step
        for keys, when in doc_table(docs / "files.md", "## Summary file"):
            if when <= held:
                problems += [
                    f"files.md summary, window {meta['window']}: {p}" for k in keys for p in missing(summary, k)
                ]
                checked |= {f"summary.{k}" for k in keys}
    held = {"always", "hooks", "validation"}
    for keys, when in doc_table(docs / "summary.md", "## In the logger"):
        if when <= held:
            problems += [f"summary.md scalars: {k}" for k in keys if k not in documented_run["scalars"]]
            checked |= set(keys)
    assert not problems, problems
    assert len(checked) > 100  # the tables were found and read


def test_slow_step_metadata_has_its_detail(documented_run: dict[str, Any]) -> None:
    (trigger,) = [m["trigger"] for m in documented_run["metadata"] if m.get("trigger")]
    assert trigger["reason"] == "slow_step" and trigger["batch"] == SlowBatchModel.SLOW_BATCH
    assert set(trigger) == {"reason", "batch", "value", "baseline", "unit", "rank", "detail"}
    assert trigger["detail"] == "over 3x the median of the last 5 steps"
