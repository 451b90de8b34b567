"""The Lightning view: the rewrite read by the real plugin, the window's hooks, and a real Trainer ->
the real plugin (the pure rewrite: tests/unit/test_lightning_view.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler
from support.lightning_view import X, synthetic_trace, view
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning.analysis.lightning_view import module_record_name
from vt_lightning.constants import FRAMEWORK_KEY, FRAMEWORK_LIGHTNING
from vt_lightning.recording.lightning_hooks import LightningViewHooks

# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def plugin_profile(trace: dict[str, Any], tmp_path: Path, name: str = "host_0.1.pt.trace.json"):
    """Write ``trace`` and load it exactly as torch-tb-profiler's RunLoader does (in process)."""
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    path = tmp_path / name
    path.write_text(json.dumps(trace))
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    data = RunProfileData.parse("host_0", "1", str(path), str(cache))
    return RunGenerator("host_0", "1", data).generate_run_profile()


def view_names(profile) -> list[str]:
    return [v.display_name for v in profile.views]


def stats_names(stats) -> set[str]:
    out: set[str] = set()

    def walk(items, depth=0):
        for s in items:
            out.add(s.name)
            walk(s.children)

    walk(stats or [])
    return out


# ------------------------------------------------------------------------------------------------
# the pure rewrite
# ------------------------------------------------------------------------------------------------


def test_overlapping_module_range_is_demoted_and_plugin_still_loads(tmp_path):
    trace = synthetic_trace()
    # a module range that partially overlaps an op: the plugin would drop its node and then raise
    # KeyError in module_op._process_module_statistics, losing the whole worker
    trace["traceEvents"].append(X("[pl][module]x.Bad: bad", 70, 10, "user_annotation"))
    trace["traceEvents"].append(X("aten::mul", 65, 10))
    summary = view(trace)
    assert summary["demoted"] == 1 and summary["modules"] == 3
    bad = next(e for e in trace["traceEvents"] if e["name"] == "[pl][module]x.Bad: bad")
    assert bad["cat"] == "user_annotation"
    profile = plugin_profile(trace, tmp_path)
    assert "Lightning" in view_names(profile)
    assert stats_names(profile.pl_module_stats) == {"net", "net.0", "net.1"}


def test_unguarded_overlap_really_breaks_the_plugin(tmp_path):
    """Why the demotion exists: the same trace, naively rewritten, fails to load."""
    trace = synthetic_trace()
    trace["traceEvents"].append(X("[pl][module]x.Bad: bad", 70, 10))
    trace["traceEvents"].append(X("aten::mul", 65, 10))
    for e in trace["traceEvents"]:
        if e["name"].startswith("[pl]") and e["cat"] == "user_annotation":
            e["cat"] = "cpu_op"
    trace[FRAMEWORK_KEY] = FRAMEWORK_LIGHTNING
    logging.getLogger("pytorch_profiler").disabled = True
    try:
        with pytest.raises(KeyError):
            plugin_profile(trace, tmp_path)
    finally:
        logging.getLogger("pytorch_profiler").disabled = False


def test_stage_ranges_synthesized_from_steps_when_missing(tmp_path):
    trace = synthetic_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if "[pl][profile]" not in e["name"]]
    summary = view(trace)
    assert summary["synthesized_stages"] == 1
    assert any(e["name"] == "[pl][profile]ProfilerStep#1" and e["cat"] == "cpu_op" for e in trace["traceEvents"])
    profile = plugin_profile(trace, tmp_path)
    assert "Lightning" in view_names(profile)
    tree = profile.get_operator_tree()  # /tree: raises StopIteration without any [pl][profile] range
    assert tree["children"][0]["name"] == "ProfilerStep#1"


# ------------------------------------------------------------------------------------------------
# the hooks
# ------------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(x))


class TinyModel(L.LightningModule):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Sequential(Block(dim), Block(dim))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._forward_hooks_always_called) for m in model.modules()
    )


def bare_trainer(**kwargs: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_install_remove_leaves_nothing_behind():
    model, trainer = TinyModel(), bare_trainer()
    original = trainer.profiler
    assert isinstance(original, PassThroughProfiler)
    hooks = LightningViewHooks(trainer, model)
    hooks.remove()  # before install: harmless
    hooks.install()
    hooks.install()  # idempotent
    assert hooks.hooked_modules == len(list(model.named_modules())) - 1  # every submodule, not the root
    assert trainer.profiler is not original
    model(torch.randn(2, 8))
    hooks.remove()
    assert hook_count(model) == 0
    assert trainer.profiler is original
    hooks.remove()  # twice: safe
    assert hook_count(model) == 0 and trainer.profiler is original
    hooks.install()  # a second window
    assert hook_count(model) > 0
    hooks.remove()
    assert hook_count(model) == 0 and trainer.profiler is original


def test_records_module_and_stage_ranges():
    model, trainer = TinyModel(), bare_trainer()
    hooks = LightningViewHooks(trainer, model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        hooks.install()
        with trainer.profiler.profile("run_training_batch"):
            model(torch.randn(2, 8))
        trainer.profiler.start("train_dataloader_next")  # still open at window end
        hooks.remove()
    names = {e.name for e in prof.events()}
    assert module_record_name(model.encoder[0].proj, "encoder.0.proj") in names
    assert "[pl][module]torch.nn.modules.container.Sequential: encoder" in names
    assert "[pl][profile]run_training_batch" in names
    assert "[pl][profile]train_dataloader_next" in names  # closed by remove()


def test_exception_in_forward_closes_ranges():
    model, trainer = TinyModel(), bare_trainer()
    hooks = LightningViewHooks(trainer, model)

    def boom(module, args):
        raise RuntimeError("boom")

    handle = model.encoder[1].act.register_forward_pre_hook(boom)
    hooks.install()
    try:
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 8))
        assert not any(hooks._open.values())  # always_call post hooks closed every range
    finally:
        handle.remove()
        hooks.remove()
    assert hook_count(model) == 0


def test_user_profiler_left_alone():
    model = TinyModel()
    user_profiler = SimpleProfiler()
    trainer = bare_trainer(profiler=user_profiler)
    hooks = LightningViewHooks(trainer, model)
    hooks.install()
    assert trainer.profiler is user_profiler
    assert hooks.hooked_modules > 0
    hooks.remove()
    assert trainer.profiler is user_profiler and hook_count(model) == 0


def test_compiled_regions_are_not_hooked():
    model = TinyModel()
    model.encoder = torch.compile(model.encoder)  # OptimizedModule (compiled lazily: no compile cost here)
    model.head.compile()  # compiled in place
    hooks = LightningViewHooks(bare_trainer(), model)
    hooks.install()
    hooked = {id(m) for m in model.modules() if m._forward_pre_hooks}
    assert id(model.encoder) in hooked  # the wrapper: its hooks run eagerly, outside the graph
    assert all(id(m) not in hooked for m in model.encoder._orig_mod.modules())
    assert id(model.head) not in hooked
    hooks.remove()
    assert hook_count(model) == 0

    model2 = TinyModel()
    model2._compiler_ctx = {"compiler": "dynamo"}  # what trainer.fit(torch.compile(model)) sets
    hooks2 = LightningViewHooks(bare_trainer(), model2)
    hooks2.install()
    assert hooks2.hooked_modules == 0
    hooks2.remove()


# ------------------------------------------------------------------------------------------------
# end to end: a real Trainer, torch.profiler, our hooks -> the real plugin
# ------------------------------------------------------------------------------------------------


class DriveWindow(L.Callback):
    """A minimal stand-in for the window: profile batches 1..2 with the Lightning view hooks."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.prof = None
        self.hooks: LightningViewHooks | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.start()  # opens ProfilerStep#0
            self.hooks = LightningViewHooks(trainer, pl_module)
            self.hooks.install()
        elif batch_idx == 2:
            self.prof.step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 2:
            self.hooks.remove()
            self.prof.stop()
            self.prof.export_chrome_trace(str(self.out))


def test_trainer_end_to_end_lightning_view(tmp_path):
    raw = tmp_path / "raw.json"
    driver = DriveWindow(raw)
    model = TinyModel()
    trainer = bare_trainer(
        max_steps=4, callbacks=[driver], default_root_dir=str(tmp_path), num_sanity_val_steps=0, limit_val_batches=0
    )
    data = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4)
    trainer.fit(model, data)

    assert isinstance(trainer.profiler, PassThroughProfiler)
    assert hook_count(model) == 0

    trace = json.loads(raw.read_text())
    raw_cats = {e.get("cat") for e in trace["traceEvents"] if str(e.get("name", "")).startswith("[pl]")}
    assert raw_cats == {"cpu_op"}  # torch's _RecordFunctionFast writes its ranges as cpu_op
    summary = view(trace)
    assert summary["framework"] == 1 and summary["demoted"] == 0 and summary["stages"] > 0
    assert list(trace)[-1] == "traceEvents"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    profile = plugin_profile(trace, run_dir)

    assert "Lightning" in view_names(profile)
    names = stats_names(profile.pl_module_stats)
    assert {"encoder", "encoder.0", "encoder.0.proj", "encoder.1.act", "head"} <= names
    roots = {s.name for s in profile.pl_module_stats}
    assert roots == {"encoder", "head"}  # hierarchy from the module paths
    encoder = next(s for s in profile.pl_module_stats if s.name == "encoder")
    assert encoder.occurences == 2 and {c.name for c in encoder.children} == {"encoder.0", "encoder.1"}

    module_view = profile.get_module_view()  # what /module returns
    assert module_view and module_view["data"]
    tree = profile.get_operator_tree()  # what /tree returns: the [pl][profile] ranges
    stage_names = set()

    def walk(node):
        stage_names.add(node["name"])
        for child in node["children"]:
            walk(child)

    walk(tree)
    assert "run_training_batch" in stage_names
    assert any(n.endswith(".training_step") for n in stage_names)
    assert any(n.endswith(".backward") for n in stage_names)
    assert any("optimizer_step" in n for n in stage_names)
