"""CLI configuration in this process: VizTraceLightningCLI's --viztrace option (flags, YAML, a
subclass, help) and a stock LightningCLI's callbacks flag, each building a real Trainer."""

from __future__ import annotations

import os
import sys

import pytest
from support.cli import CLI_SCRIPTS, constructor_args

from vt_lightning import VizTraceCallback
from vt_lightning.cli import lightning as vt_cli


@pytest.fixture
def no_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("VT_LIGHTNING"):
            monkeypatch.delenv(name)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.syspath_prepend(str(CLI_SCRIPTS))
    monkeypatch.setattr(sys, "argv", ["train.py"])  # LightningCLI warns when args= meets pytest's argv
    import _tiny

    return _tiny


def _cli_callbacks(cls, tiny, args):
    cli = cls(tiny.TinyModel, tiny.TinyData, run=False, args=args)
    return [cb for cb in cli.trainer.callbacks if isinstance(cb, VizTraceCallback)], cli


@pytest.mark.parametrize(
    "args, active",
    [
        ([], None),
        (["--viztrace=true"], 3),
        (["--viztrace", "1", "--viztrace.active=2"], 2),
        (["--viztrace.active=4"], 4),
        (["--viztrace=VizTraceCallback", "--viztrace.active=2"], 2),
        (["--viztrace.active=2", "--viztrace=false"], None),
    ],
)
def test_viztrace_cli_in_process(tiny, no_env, tmp_path, args, active):
    base = ["--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar=false"]
    callbacks, cli = _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, base + args)
    assert None not in cli.trainer.callbacks
    if active is None:
        assert callbacks == []
    else:
        assert len(callbacks) == 1 and callbacks[0].schedule.active == active


def test_viztrace_cli_yaml(tiny, no_env, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("viztrace:\n  active: 2\n  ranks: [0]\n  record_shapes: true\n")
    (cb,), _ = _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, ["-c", str(config)])
    assert cb.schedule.active == 2 and cb.options.ranks == (0,) and cb.options.torch.record_shapes


def test_viztrace_cli_subclass_keeps_option(tiny, no_env):
    """Subclasses that override add_arguments_to_parser without super() keep --viztrace."""

    class MyCLI(vt_cli.VizTraceLightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.batch_size", "model.hidden")

    (cb,), _ = _cli_callbacks(MyCLI, tiny, ["--viztrace.repeat=2"])
    assert cb.schedule.repeat == 2


def test_viztrace_cli_bad_value_names_option(tiny, no_env, capsys):
    with pytest.raises(SystemExit):
        _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, ["--viztrace.active=x"])
    err = capsys.readouterr().err
    assert "viztrace" in err and "Got value: x" in err


def test_viztrace_help_lists_every_argument(tiny, no_env, capsys):
    with pytest.raises(SystemExit):
        vt_cli.VizTraceLightningCLI(
            tiny.TinyModel, tiny.TinyData, run=False, args=["--viztrace.help", "VizTraceCallback"]
        )
    out = capsys.readouterr().out
    for name in constructor_args():
        assert f"--viztrace.{name} " in out, name


# ------------------------------------------------------------------------ stock LightningCLI
def test_stock_cli_callbacks_flag_in_process(tiny, no_env, tmp_path):
    from lightning.pytorch.cli import LightningCLI

    args = [
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.callbacks+=vt_lightning.VizTraceCallback",
        "--trainer.callbacks.active=2",
        "--trainer.callbacks.include_files+=" + str(tmp_path),
        "--trainer.callbacks.memory_snapshot=false",
    ]  # fmt: skip
    (cb,), _ = _cli_callbacks(LightningCLI, tiny, args)
    assert cb.schedule.active == 2 and not cb.options.memory_snapshot
    assert cb.options.python.include_files == (str(tmp_path),)


def test_stock_cli_help_and_print_config_list_every_argument(tiny, no_env, capsys):
    from lightning.pytorch.cli import LightningCLI

    with pytest.raises(SystemExit):
        LightningCLI(tiny.TinyModel, tiny.TinyData, run=False,
                     args=["--trainer.callbacks.help", "vt_lightning.VizTraceCallback"])  # fmt: skip
    out = capsys.readouterr().out
    for name in constructor_args():
        assert f"--trainer.callbacks.{name} " in out, name
    with pytest.raises(SystemExit):
        LightningCLI(tiny.TinyModel, tiny.TinyData, run=False,
                     args=["--trainer.callbacks+=vt_lightning.VizTraceCallback", "--print_config"])  # fmt: skip
    out = capsys.readouterr().out
    assert "class_path: vt_lightning.VizTraceCallback" in out
    for name in constructor_args():
        assert f"      {name}:" in out, name
    assert "      stages:\n      - fit\n" in out  # the default the docs give, not `stages: null`
