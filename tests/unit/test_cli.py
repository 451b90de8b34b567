"""CLI configuration without a Trainer: the VT_LIGHTNING env switch and its options, the --viztrace
argument rewrite, and the ``vt-lightning`` command's arguments."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest
from support.cli import constructor_args

from vt_lightning import VizTraceCallback
from vt_lightning.cli import lightning as vt_cli


# --------------------------------------------------------------------------- the env switch
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
    assert list(hints) == constructor_args()
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


# --------------------------------------------------------------- --viztrace, the argument rewrite
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


def test_job_says_when_a_log_dir_holds_no_window_waiting_for_its_job(tmp_path, capsys):
    """``vt-lightning job`` is given rank 0's log dir first: one without a kept clock exchange (a
    node's other than rank 0's, or a run whose job files were written) is one line and status 1."""
    from vt_lightning.cli.command import EXIT_NOT_FOUND, main

    (tmp_path / "node1" / "window_000-batches_2-3").mkdir(parents=True)
    assert main(["job", str(tmp_path / "node1"), str(tmp_path)]) == EXIT_NOT_FOUND
    err = capsys.readouterr().err
    assert err == (
        f"vt-lightning job: {tmp_path / 'node1'}: no window waiting for its job file under it "
        "(give rank 0's log dir first)\n"
    )


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
