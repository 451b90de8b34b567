"""CLI configuration end to end, each a training in a subprocess (tests/scripts/cli/): a stock
LightningCLI's flags and YAML, VizTraceLightningCLI's --viztrace, and the VT_LIGHTNING env switch on
a plain Trainer script."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import CLI_SCRIPTS

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


# --------------------------------------------------------------------- subprocess: real runs
@pytest.mark.slow
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
