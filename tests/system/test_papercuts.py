"""What a newcomer meets in the first minute, in subprocesses run as a user would run them: with no
activated virtual environment and the environment's ``bin/`` not on ``PATH``.

The printed commands work as printed, the example prints its footer once, ``summary`` over several
runs says which run each window is, ``diff`` names the user's function (not ``time.sleep``) with a
short path, HTA's directory scan finds only traces, and torch's kineto says nothing per window.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
from conftest import recorded_name
from support.paths import REPO

EXAMPLE = REPO / "examples" / "train.py"
TIMEOUT = 300  # one small training on a loaded 2-core CI machine


def bare_env() -> dict[str, str]:
    """The environment of a shell where no venv was activated: system directories only on PATH,
    no VIRTUAL_ENV, and the package found through the interpreter's own site-packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "CONDA_PREFIX")}
    env["PATH"] = "/usr/bin:/bin"
    env["COLUMNS"] = "160"  # tables wide enough that function names are not folded
    return env


def run(args: list[str], cwd: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=bare_env(), capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ the example's footer


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """examples/train.py as the README runs it (two windows), from its own directory."""
    root = tmp_path_factory.mktemp("example")
    started = time.monotonic()
    proc = run([sys.executable, str(EXAMPLE), "--max-steps", "12", "--batch-size", "8"], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - started < TIMEOUT
    return root, proc.stdout + proc.stderr


def footer_commands(output: str) -> dict[str, str]:
    """``{"summary": command, "view": ..., "or": ...}`` of the footer lines."""
    found = {}
    for line in output.splitlines():
        m = re.match(r"^\s+(summary|view|or):\s+(.*?)(\s+\(.*\))?\s*$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_the_example_prints_one_footer(example: tuple[Path, str]) -> None:
    _, output = example
    assert output.count("window trace(s) in") == 1, output[-3000:]
    assert output.count(" -m vt_lightning summary ") == 1
    assert "where the step went" in output


def test_printed_commands_run_as_printed_from_another_directory(example: tuple[Path, str], tmp_path: Path) -> None:
    root, output = example
    commands = footer_commands(output)
    assert set(commands) == {"summary", "view", "or"}, output[-2000:]
    for command in commands.values():
        executable = shlex.split(command)[0]
        assert os.path.isabs(executable) and os.access(executable, os.X_OK), command
    logdir = str(root / "lightning_logs" / "version_0")
    assert all(logdir in command for command in commands.values())  # absolute: any directory works

    summary = run(shlex.split(commands["summary"]), cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    # Two windows on a quiet machine; on a loaded one the default run budget may stop the second
    # (the example says so): the summary shows every window the example wrote.
    written = int(re.search(r"vt_lightning: (\d+) window trace\(s\) in", output)[1])  # type: ignore[index]
    assert written == 2 or (written == 1 and "run budget reached" in output), output[-3000:]
    assert summary.stdout.count("### vt_lightning window") == written

    tensorboard = run([*shlex.split(commands["or"]), "--inspect"], cwd=tmp_path, timeout=120)
    assert tensorboard.returncode == 0, tensorboard.stderr[-2000:]
    assert "Found event files in" in tensorboard.stdout and "train_loss" in tensorboard.stdout

    view = subprocess.Popen(
        [*shlex.split(commands["view"]), "--no-browser"],
        cwd=tmp_path,
        env=bare_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert view.stdout is not None
        first = view.stdout.readline()
        assert first.startswith("vt-lightning: serving "), first + (view.stderr.read() if view.stderr else "")
        assert view.stdout.readline().strip().startswith("open http://127.0.0.1:")
    finally:
        view.send_signal(signal.SIGTERM)  # it serves until stopped; stopping it is not what is tested here
        assert view.wait(timeout=60) in (0, -signal.SIGTERM)


# ------------------------------------------------------------------ two runs of a script of the user's

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from vt_lightning import VizTraceCallback

    SLOW = sys.argv[1] == "slow"


    def prepare(x):
        if SLOW:
            time.sleep(0.03)
        return x * 2


    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.layer(prepare(x)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)


    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)
    trainer = L.Trainer(
        default_root_dir=sys.argv[2], max_steps=6, accelerator="cpu", logger=True,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[VizTraceCallback(wait=0, warmup=1, active=3)],
    )
    trainer.fit(Model(), data)
    """
)


DIFF = [sys.executable, "-m", "vt_lightning", "diff", "fast/lightning_logs/version_0", "slow/lightning_logs/version_0"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fast run and a run whose ``prepare`` sleeps, of a script in the working directory."""
    project = tmp_path_factory.mktemp("project")
    (project / "fit.py").write_text(SCRIPT)
    outputs = {}
    for name in ("fast", "slow"):
        proc = run([sys.executable, "fit.py", name, name], cwd=project)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[name] = proc.stdout + proc.stderr
    return project, outputs


def test_kineto_says_nothing_per_window(two_runs: tuple[Path, dict[str, str]]) -> None:
    _, outputs = two_runs
    for output in outputs.values():
        assert "window trace(s) in" in output
        assert "USDT:" not in output and "profiler_start" not in output, output[-2000:]


def test_diff_names_the_users_function_with_a_short_path(two_runs: tuple[Path, dict[str, str]]) -> None:
    project, _ = two_runs
    proc = run(DIFF, cwd=project)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if "functions (" in line)  # a table's title
    assert "your functions (inclusive" in lines[first]  # the user's functions by inclusive time come first
    end = next(i for i, line in enumerate(lines) if "all Python functions (self" in line)
    rows = [line for line in lines[first + 1 : end] if re.search(r"[+-]\d+\.\d\d", line)]
    # Inclusive: the step and the function that slept lead, by the 30 ms of sleep per step; time.sleep
    # itself is no user function. The script's path is relative to the working directory.
    (prepare,) = [row for row in rows[:2] if "prepare (fit.py:" in row]
    assert float(re.findall(r"[+-]\d+\.\d\d", prepare)[0]) > 20.0
    assert f"{recorded_name('Model.training_step')} (fit.py:" in "".join(rows[:2])
    assert not [row for row in rows if "sleep" in row], proc.stdout
    assert str(project) not in proc.stdout
    as_json = orjson.loads(run([*proc.args, "--json"], cwd=project).stdout)
    names = [row["name"] for row in as_json["user_python"]]
    assert any(name.startswith(f"prepare ({project}/fit.py:") for name in names), names  # JSON keeps full paths


def test_summary_of_several_runs_has_a_run_column(two_runs: tuple[Path, dict[str, str]]) -> None:
    project, _ = two_runs
    both = run([sys.executable, "-m", "vt_lightning", "summary", "."], cwd=project)
    assert both.returncode == 0, both.stderr
    header = next(line for line in both.stdout.splitlines() if " win " in f" {line} ")
    assert header.split()[:2] == ["run", "win"], header
    cells = [line.split() for line in both.stdout.splitlines()]
    rows = [c[0] for c in cells if len(c) > 2 and c[0].endswith("/lightning_logs/version_0") and c[1].isdigit()]
    assert sorted(rows) == ["fast/lightning_logs/version_0", "slow/lightning_logs/version_0"]
    one = run([sys.executable, "-m", "vt_lightning", "summary", "slow"], cwd=project)
    assert one.returncode == 0, one.stderr
    assert next(line for line in one.stdout.splitlines() if " win " in f" {line} ").split()[0] == "win"


def test_hta_takes_only_traces_from_a_window_directory(two_runs: tuple[Path, dict[str, str]]) -> None:
    """HTA's ``TraceAnalysis(trace_dir=...)`` takes every ``*.json`` / ``*.gz`` of a directory
    (hta/common/trace_file.py) and looks for ``"rank": N`` in it: each such file must be a trace."""
    project, _ = two_runs
    windows = sorted(project.glob("*/lightning_logs/version_0/window_*"))
    assert len(windows) == 2
    for window in windows:
        taken = [p for p in window.iterdir() if p.name.endswith((".gz", ".json"))]
        assert [p.name.endswith(".pt.trace.json.gz") for p in taken] == [True], sorted(window.iterdir())
        assert list(window.glob("*.summary.jsonc")), "the summary is still written beside the trace"


def test_hta_reads_a_cpu_window_directory_without_a_warning(two_runs: tuple[Path, dict[str, str]]) -> None:
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    project, _ = two_runs
    (window,) = sorted((project / "slow" / "lightning_logs" / "version_0").glob("window_*"))
    code = textwrap.dedent(
        f"""
        import logging
        logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(message)s")
        from hta.trace_analysis import TraceAnalysis
        analysis = TraceAnalysis(trace_dir={str(window)!r})
        print("FILES", sorted(analysis.t.trace_files.values()))
        """
    )
    proc = run([sys.executable, "-c", code], cwd=project, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trace,) = window.glob("*.pt.trace.json.gz")
    assert f"FILES {[str(trace)]}" in proc.stdout
    said = proc.stdout + proc.stderr
    assert "does not have the rank" not in said and "has the same rank" not in said, said[-3000:]


@pytest.mark.parametrize("how", ["-", "-c"], ids=["python - < script", "python -c script"])
def test_a_script_from_stdin_or_c_names_its_busiest_function(tmp_path: Path, how: str) -> None:
    """Code run by ``python - < train.py`` lives in ``<stdin>``: the user's, whatever the brackets. By
    ``python -c``, in ``<string>``, where dataclasses put their methods too: the command's own functions
    are the user's."""
    args, stdin = (
        ([sys.executable, "-", "fast", "out"], SCRIPT)
        if how == "-"
        else ([sys.executable, "-c", SCRIPT, "fast", "out"], None)
    )
    proc = subprocess.run(
        args, cwd=tmp_path, env=bare_env(), input=stdin, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    busiest = f"busiest user function (incl.) of window 0: {recorded_name('Model.training_step')} ("
    assert busiest in output, output[-3000:]


def test_diff_piped_into_head_exits_0_and_says_nothing(two_runs: tuple[Path, dict[str, str]]) -> None:
    """``vt-lightning diff A B | head -3``: head leaves early, the next write meets a closed pipe."""
    project, _ = two_runs
    for _ in range(3):  # whether the pipe closes before the last write depends on timing
        writer = subprocess.Popen(DIFF, cwd=project, env=bare_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        head = subprocess.run(["head", "-3"], stdin=writer.stdout, capture_output=True, timeout=TIMEOUT)
        assert writer.stdout is not None
        writer.stdout.close()  # only head holds the pipe's reading end now
        _, err = writer.communicate(timeout=TIMEOUT)
        assert len(head.stdout.splitlines()) == 3
        assert (writer.returncode, err) == (0, b""), err
