"""CLI configuration: stock LightningCLI flags/YAML, the --viztrace option, the VT_LIGHTNING env switch."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from support.paths import SCRIPTS

from vt_lightning import VizTraceCallback
from vt_lightning.cli import lightning as vt_cli

CLI_SCRIPTS = SCRIPTS / "cli"
TRACES = "lightning_logs/version_0/window_*/*.pt.trace.json.gz"
# Short runs: 6 batches, one window of 2 active batches (wait=1, warmup=1, active=2, repeat=1).
FIT = [
    "fit",
    "--trainer.max_steps=6",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
]


# ------------------------------------------------------------------------------------- helpers
def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VT_LIGHTNING")}
    env.update(extra)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env if env is not None else _clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _traces(root: Path) -> list[Path]:
    return sorted(root.glob(TRACES))


def _assert_one_trace(root: Path, proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    traces = _traces(root)
    assert len(traces) == 1, (list(root.rglob("*")), proc.stderr[-3000:])
    with gzip.open(traces[0], "rt") as f:
        trace = json.load(f)
    assert trace["traceEvents"]


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


# ------------------------------------------------------------------ 3. env switch (unit level)
@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", "off"])
def test_env_switch_off_returns_nothing(value):
    env = {} if value is None else {"VT_LIGHTNING": value, "VT_LIGHTNING_ACTIVE": "not even checked"}
    assert vt_cli.callbacks_from_env(env) == []


def test_env_switch_bad_value_names_variable():
    with pytest.raises(ValueError, match=r"VT_LIGHTNING must be .*got 'maybe'"):
        vt_cli.callbacks_from_env({"VT_LIGHTNING": "maybe"})


def test_env_switch_on_defaults():
    (cb,) = vt_cli.callbacks_from_env({"VT_LIGHTNING": "1"})
    assert isinstance(cb, VizTraceCallback)
    assert cb.schedule.active == VizTraceCallback().schedule.active


def test_env_options_parsed_by_type_hints(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    env = {
        "VT_LIGHTNING": "true",
        "VT_LIGHTNING_ACTIVE": "3",
        "VT_LIGHTNING_WAIT": " 2 ",
        "VT_LIGHTNING_MIN_DURATION": "1.5",
        "VT_LIGHTNING_DIRPATH": str(tmp_path),
        "VT_LIGHTNING_INCLUDE_FILES": f"{a},{b}{os.pathsep}",
        "VT_LIGHTNING_RECORD_SHAPES": "yes",
        "VT_LIGHTNING_PROFILE_MEMORY": "0",
        "VT_LIGHTNING_RANKS": "0",
        "VT_LIGHTNING_COMPRESSION_LEVEL": "9",
    }
    options = vt_cli.options_from_env(env)
    assert options == {
        "active": 3,
        "wait": 2,
        "min_duration": 1.5,
        "dirpath": str(tmp_path),
        "include_files": [str(a), str(b)],
        "record_shapes": True,
        "profile_memory": False,
        "ranks": [0],
        "compression_level": 9,
    }
    (cb,) = vt_cli.callbacks_from_env(env)
    assert cb.schedule.active == 3 and cb.schedule.wait == 2
    assert cb.options.dirpath == str(tmp_path)
    assert cb.options.python.include_files == (str(a), str(b))
    assert cb.options.torch.record_shapes and not cb.options.torch.profile_memory
    assert cb.options.ranks == (0,) and cb.options.compression_level == 9


def test_env_multi_value_list_and_none():
    options = vt_cli.options_from_env(
        {"VT_LIGHTNING_RANKS": "0,1, 2", "VT_LIGHTNING_DIRPATH": "none", "VT_LIGHTNING_EXCLUDE_FILES": "null"}
    )
    assert options == {"ranks": [0, 1, 2], "dirpath": None, "exclude_files": None}


def test_every_constructor_argument_readable_from_env():
    """A new constructor parameter with a type the env parser cannot read fails here, not for users."""
    hints = vt_cli._constructor_hints()
    assert list(hints) == _constructor_args()
    for name, hint in hints.items():
        for sample in ("1", "true", "x", "1,2"):
            try:
                vt_cli._parse(sample, hint)
                break
            except ValueError as err:
                assert "cannot read" not in str(err), (name, hint)
        else:
            pytest.fail(f"no sample value parses for {name}: {hint!r}")


@pytest.mark.parametrize(
    "var, value, message",
    [
        ("VT_LIGHTNING_ACTIVE", "x", "VT_LIGHTNING_ACTIVE must be an integer, got 'x'"),
        ("VT_LIGHTNING_ACTIVE", "2.5", "VT_LIGHTNING_ACTIVE must be an integer, got '2.5'"),
        ("VT_LIGHTNING_MIN_DURATION", "fast", "VT_LIGHTNING_MIN_DURATION must be a number, got 'fast'"),
        ("VT_LIGHTNING_RECORD_SHAPES", "maybe", "VT_LIGHTNING_RECORD_SHAPES must be true or false"),
        ("VT_LIGHTNING_RANKS", "0,a", "VT_LIGHTNING_RANKS must be a list whose items each must be an integer"),
        ("VT_LIGHTNING_ACTIV", "2", "VT_LIGHTNING_ACTIV is not a vt_lightning option"),
    ],
)
def test_env_bad_values_name_the_variable(var, value, message):
    with pytest.raises(ValueError) as info:
        vt_cli.callbacks_from_env({"VT_LIGHTNING": "1", var: value})
    assert message in str(info.value)


def test_env_all_errors_reported_at_once():
    with pytest.raises(ValueError) as info:
        vt_cli.options_from_env({"VT_LIGHTNING_ACTIVE": "x", "VT_LIGHTNING_BOGUS": "1"})
    assert "VT_LIGHTNING_ACTIVE" in str(info.value) and "VT_LIGHTNING_BOGUS" in str(info.value)


def test_env_constructor_error_names_the_variable():
    with pytest.raises(ValueError, match=r"VT_LIGHTNING_ACTIVE='0'.*`active`"):
        vt_cli.callbacks_from_env({"VT_LIGHTNING": "1", "VT_LIGHTNING_ACTIVE": "0"})


def test_entry_point_registered():
    eps = [ep for ep in entry_points(group="lightning.pytorch.callbacks_factory") if ep.name == "vt_lightning"]
    assert eps, "reinstall: pip install -e . --no-deps (the entry point is declared in pyproject.toml)"
    assert eps[0].load() is vt_cli.callbacks_from_env


# ------------------------------------------------------------------ 2. --viztrace (unit level)
def test_rewrite_switch():
    cp = "vt_lightning.VizTraceCallback"
    rw = vt_cli._rewrite_switch
    assert rw(["fit", "--viztrace=true"], "viztrace", cp) == ["fit", f"--viztrace={cp}"]
    assert rw(["--viztrace", "on", "--viztrace.active=2"], "viztrace", cp) == [
        f"--viztrace={cp}",
        "--viztrace.active=2",
    ]
    assert rw(["--viztrace=False"], "viztrace", cp) == ["--viztrace=null"]
    assert rw(["--viztrace=VizTraceCallback", "--viztraced=1"], "viztrace", cp) == [
        "--viztrace=VizTraceCallback",
        "--viztraced=1",
    ]
    assert rw(["--", "--viztrace=true"], "viztrace", cp) == ["--", "--viztrace=true"]


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
@pytest.mark.integration
def test_viztrace_cli_in_process(tiny, no_env, tmp_path, args, active):
    base = ["--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar=false"]
    callbacks, cli = _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, base + args)
    assert None not in cli.trainer.callbacks
    if active is None:
        assert callbacks == []
    else:
        assert len(callbacks) == 1 and callbacks[0].schedule.active == active


@pytest.mark.integration
def test_viztrace_cli_yaml(tiny, no_env, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("viztrace:\n  active: 2\n  ranks: [0]\n  record_shapes: true\n")
    (cb,), _ = _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, ["-c", str(config)])
    assert cb.schedule.active == 2 and cb.options.ranks == (0,) and cb.options.torch.record_shapes


@pytest.mark.integration
def test_viztrace_cli_subclass_keeps_option(tiny, no_env):
    """Subclasses that override add_arguments_to_parser without super() keep --viztrace."""

    class MyCLI(vt_cli.VizTraceLightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.batch_size", "model.hidden")

    (cb,), _ = _cli_callbacks(MyCLI, tiny, ["--viztrace.repeat=2"])
    assert cb.schedule.repeat == 2


@pytest.mark.integration
def test_viztrace_cli_bad_value_names_option(tiny, no_env, capsys):
    with pytest.raises(SystemExit):
        _cli_callbacks(vt_cli.VizTraceLightningCLI, tiny, ["--viztrace.active=x"])
    err = capsys.readouterr().err
    assert "viztrace" in err and "Got value: x" in err


def _constructor_args() -> list[str]:
    import inspect

    return [p for p in inspect.signature(VizTraceCallback.__init__).parameters if p != "self"]


@pytest.mark.integration
def test_viztrace_help_lists_every_argument(tiny, no_env, capsys):
    with pytest.raises(SystemExit):
        vt_cli.VizTraceLightningCLI(
            tiny.TinyModel, tiny.TinyData, run=False, args=["--viztrace.help", "VizTraceCallback"]
        )
    out = capsys.readouterr().out
    for name in _constructor_args():
        assert f"--viztrace.{name} " in out, name


# ---------------------------------------------------------- 1. stock LightningCLI (unit level)
@pytest.mark.integration
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


@pytest.mark.integration
def test_stock_cli_help_and_print_config_list_every_argument(tiny, no_env, capsys):
    from lightning.pytorch.cli import LightningCLI

    with pytest.raises(SystemExit):
        LightningCLI(tiny.TinyModel, tiny.TinyData, run=False,
                     args=["--trainer.callbacks.help", "vt_lightning.VizTraceCallback"])  # fmt: skip
    out = capsys.readouterr().out
    for name in _constructor_args():
        assert f"--trainer.callbacks.{name} " in out, name
    with pytest.raises(SystemExit):
        LightningCLI(tiny.TinyModel, tiny.TinyData, run=False,
                     args=["--trainer.callbacks+=vt_lightning.VizTraceCallback", "--print_config"])  # fmt: skip
    out = capsys.readouterr().out
    assert "class_path: vt_lightning.VizTraceCallback" in out
    for name in _constructor_args():
        assert f"      {name}:" in out, name


# --------------------------------------------------------------------- subprocess: real runs
@pytest.mark.slow
@pytest.mark.system
def test_stock_cli_flags_write_traces(tmp_path):
    args = [
        str(CLI_SCRIPTS / "stock_cli.py"), *FIT,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=vt_lightning.VizTraceCallback",
        "--trainer.callbacks.wait=1",
        "--trainer.callbacks.warmup=1",
        "--trainer.callbacks.active=2",
        "--trainer.callbacks.repeat=1",
    ]  # fmt: skip
    _assert_one_trace(tmp_path, _run(args, tmp_path))


@pytest.mark.slow
@pytest.mark.system
def test_stock_cli_yaml_writes_traces(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            trainer:
              default_root_dir: {tmp_path}
              callbacks:
                - class_path: vt_lightning.VizTraceCallback
                  init_args:
                    wait: 1
                    warmup: 1
                    active: 2
                    repeat: 1
                    ranks: [0]
                    memory_snapshot: false
            """
        )
    )
    _assert_one_trace(tmp_path, _run([str(CLI_SCRIPTS / "stock_cli.py"), *FIT, "-c", str(config)], tmp_path))


@pytest.mark.slow
@pytest.mark.system
def test_stock_cli_bad_value_names_option(tmp_path):
    args = [
        str(CLI_SCRIPTS / "stock_cli.py"), *FIT,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=vt_lightning.VizTraceCallback",
        "--trainer.callbacks.active=0",
    ]  # fmt: skip
    proc = _run(args, tmp_path)
    assert proc.returncode != 0
    assert "`active` must be an integer >= 1, got 0" in proc.stderr
    assert not _traces(tmp_path)


@pytest.mark.slow
@pytest.mark.system
def test_viztrace_cli_off_by_default_on_with_flag(tmp_path):
    off, on = tmp_path / "off", tmp_path / "on"
    off.mkdir()
    on.mkdir()
    script = str(CLI_SCRIPTS / "own_cli.py")
    proc = _run([script, *FIT, f"--trainer.default_root_dir={off}"], off)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(off.rglob("window_*")), list(off.rglob("*"))
    assert "viztrace: null" in (off / "lightning_logs/version_0/config.yaml").read_text()

    proc = _run([script, *FIT, f"--trainer.default_root_dir={on}", "--viztrace=true", "--viztrace.active=2"], on)
    _assert_one_trace(on, proc)


@pytest.mark.slow
@pytest.mark.system
def test_env_switch_plain_trainer(tmp_path):
    script = str(CLI_SCRIPTS / "plain_trainer.py")
    off, on, bad = tmp_path / "off", tmp_path / "on", tmp_path / "bad"
    for d in (off, on, bad):
        d.mkdir()

    proc = _run([script, str(off)], off)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CALLBACKS []" in proc.stdout
    assert not list(off.rglob("window_*"))

    env = _clean_env(VT_LIGHTNING="1", VT_LIGHTNING_ACTIVE="2", VT_LIGHTNING_WAIT="1", VT_LIGHTNING_WARMUP="1")
    proc = _run([script, str(on)], on, env=env)
    assert "CALLBACKS ['VizTraceCallback']" in proc.stdout
    _assert_one_trace(on, proc)

    proc = _run([script, str(bad)], bad, env=_clean_env(VT_LIGHTNING="1", VT_LIGHTNING_ACTIVE="x"))
    assert proc.returncode != 0
    assert "VT_LIGHTNING_ACTIVE must be an integer, got 'x'" in proc.stderr


@pytest.mark.slow
@pytest.mark.system
def test_env_switch_off_imports_nothing(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        import lightning.pytorch
        before = set(sys.modules)
        from importlib.metadata import entry_points
        (ep,) = [e for e in entry_points(group="lightning.pytorch.callbacks_factory") if e.name == "vt_lightning"]
        factory = ep.load()
        loaded = set(sys.modules)
        assert factory() == []
        assert set(sys.modules) == loaded, sorted(set(sys.modules) - loaded)
        new = sorted(set(loaded) - before)
        assert "jsonargparse" not in new and "lightning.pytorch.cli" not in new, new
        print("NEW", new)
        """
    )
    proc = _run(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# The `vt-lightning` command's arguments, on whichever jsonargparse this session installed (nox
# installs 4.33.2 on 3.10, 4.41.0 on 3.12 — what `pip install litgpt` brings —, the newest on 3.13).
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["summary"], ["view", "--no-browser"]])
def test_command_without_a_target_reads_the_current_directory(argv, tmp_path, monkeypatch, capsys):
    """jsonargparse 4.38.0-4.46.0 refuse a positional argument with a default: the command must
    still build its parser there, and an omitted target still means the current directory."""
    from vt_lightning.cli.command import EXIT_NOT_FOUND, main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == EXIT_NOT_FOUND
    err = capsys.readouterr().err
    assert err.startswith(f"vt-lightning {argv[0]}: .: "), err
    assert "Traceback" not in err


def test_command_target_given_is_read(tmp_path, capsys):
    from vt_lightning.cli.command import EXIT_NOT_FOUND, main

    missing = tmp_path / "no_such_run"
    assert main(["summary", str(missing), "--json"]) == EXIT_NOT_FOUND
    assert f"vt-lightning summary: {missing}: no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["summary", "diff", "view"])
def test_a_fault_in_the_command_is_one_line_and_exit_status_1(command, tmp_path, monkeypatch, capsys):
    from vt_lightning.cli import command as cli_command

    def broken(*args, **kwargs):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(cli_command, f"run_{command}", broken)
    argv = {"summary": ["summary", str(tmp_path)], "diff": ["diff", str(tmp_path), str(tmp_path)]}
    assert cli_command.main(argv.get(command, ["view", str(tmp_path), "--no-browser"])) == cli_command.EXIT_NOT_FOUND
    err = capsys.readouterr().err
    assert err == f"vt-lightning {command}: failed (ZeroDivisionError: injected); please report it\n", err
