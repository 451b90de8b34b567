"""CI in nox: ``nox`` runs lint, types and the test suite on every Python; ``nox -s unit`` the unit
tier alone (CONTRIBUTING.md). Types are checked inside ``tests-3.11`` (the pinned packages are there
already); ``nox -s types`` runs that check alone.

The four interpreters test three version sets, so the tested range is the declared range:

* **3.10, lower bounds** (``ci/lower-bounds.txt``): the oldest torch, Lightning, VizTracer,
  TensorBoard, torch-tb-profiler, orjson and jsonargparse that pyproject.toml declares;
* **3.11 and 3.12, pinned** (``ci/constraints.txt``): what the team develops with (torch 2.13.0: on
  the project's CPU-only machines the local CPU wheel for 3.11, PyPI's CUDA build, which runs on the
  CPU, elsewhere), with Holistic Trace Analysis (the ``analysis`` extra, ~80 packages of Jupyter, so
  only here) for tests/integration/test_hta.py; the lint and types sessions and their tools (ruff, mypy, nox)
  are pinned there too (the system tier runs at the range's ends, 3.10 and 3.13: ``suite_passes``);
* **3.13, newest**: no pins at all, upgraded eagerly at every run, as a user's fresh
  ``pip install vt-lightning`` gets it. Machines that cap pip through a site-wide constraints file
  (``/etc/xdg/pip``, torch<=2.14.1) would silently test an older torch: uv reads no pip
  configuration, and under pip this session points ``PIP_CONSTRAINT`` at an empty file.

Sessions install with uv where it is installed beside nox (``.ci/run`` installs it), else with venv
and pip. On the 2-core CI machine the 3.13 session's install (a CUDA build of torch and its
libraries, bytecode compiled as pip does) took 66 s with uv against 135 s with pip.

Each session gets its own virtual environment under ``.nox/`` (git-ignored), kept between runs, so
a rerun only reinstalls what changed. ``.ci/run`` sets ``VT_NOX_DISCARD_VENVS=1`` instead: a fresh
CI machine never reruns, and three CUDA builds of torch (~5 GB each) plus an installer's cache of their
wheels once filled its disk before the 3.12 session; discarding each environment when its session
ends keeps one at a time on disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import nox
from nox.command import CommandFailed

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]  # keep in step with pyproject's classifiers
TOOLS_PYTHON = "3.11"  # lint, types and the quick unit run
VERSION_SETS = {"3.10": "lower", "3.11": "pinned", "3.12": "pinned", "3.13": "newest"}

nox.options.sessions = ["lint", "tests"]  # tests-3.11 runs the types check too (TYPES_IN_TESTS)
# uv where it is installed (``.ci/run`` installs it beside nox): it installs a session's packages
# about twice as fast as pip (see the module doc); plain venv + pip otherwise.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"

CONSTRAINTS = ("-c", "ci/constraints.txt")
LOWER_BOUNDS = ("-c", "ci/lower-bounds.txt")


@contextmanager
def discarded_afterwards(session: nox.Session) -> Iterator[None]:
    """Removes the session's virtual environment when the session ends, pass or fail, where
    ``VT_NOX_DISCARD_VENVS=1`` asks for it (see the module doc)."""
    try:
        yield
    finally:
        if os.environ.get("VT_NOX_DISCARD_VENVS") == "1":
            location = getattr(session.virtualenv, "location", None)
            if location and os.path.isdir(location):
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"discarded {location} (VT_NOX_DISCARD_VENVS=1)")


def pip_find_links() -> list[str]:
    """pip's ``find-links`` (environment or configuration), for uv, which reads no pip setting.

    This project's machines hold their CPU build of torch there (ci/constraints.txt): handed to
    uv, a pinned session takes the same wheel pip would instead of downloading a CUDA build."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    if not found:  # nox's own interpreter has pip (.ci/run makes it with venv)
        answer = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = answer.stdout.split() if answer.returncode == 0 else []
    return [option for location in found for option in ("--find-links", location)]


# The pinned set's second interpreter takes jsonargparse from the middle of the declared range: 4.41.0 is
# what `pip install litgpt` brings, and 4.38.0-4.46.0 refuse argument definitions that both ends accept
# (a positional argument with a default). The two ends run on 3.10 (4.33.2) and 3.13 (newest).
MIDDLE_OF_RANGE = {"3.12": ("jsonargparse[signatures]==4.41.0",)}


def install_version_set(session: nox.Session, version_set: str) -> None:
    """The package with its test extra, at the versions of ``version_set`` (see the module doc)."""
    uv = session.venv_backend == "uv"
    # uv leaves bytecode to the first import unless asked; pip compiles at install. Where bytecode is
    # never written (PYTHONDONTWRITEBYTECODE, as on the CI machine), every test subprocess would then
    # compile torch and Lightning again: the 3.10 session's parallel pass took 629 s instead of 286.
    uv_options = [*pip_find_links(), "--compile-bytecode"] if uv else []
    if version_set == "lower":
        session.install("-q", *uv_options, *LOWER_BOUNDS, "-e", ".[test]")
    elif version_set == "pinned":  # with HTA (the ``analysis`` extra): tests/integration/test_hta.py runs here
        session.install("-q", *uv_options, *CONSTRAINTS, "-e", ".[test,analysis]")
    elif uv:  # newest: nothing pinned (uv reads no pip configuration, so no site-wide cap either)
        session.install("-q", *uv_options, "--upgrade", "-e", ".[test]")
    else:  # newest: nothing pinned, not even by the machine's pip configuration
        session.install(
            "-q", "--upgrade", "--upgrade-strategy", "eager", "-e", ".[test]", env={"PIP_CONSTRAINT": os.devnull}
        )
    session.run("python", "-c", VERSIONS_LINE, silent=False)


# One line in the log saying what was tested.
VERSIONS_LINE = (
    "import importlib.metadata as m, sys; print('tested with Python', sys.version.split()[0], "
    "*(f'{p} {m.version(p)}' for p in ('torch', 'lightning', 'viztracer', 'tensorboard', 'torch-tb-profiler', "
    "'orjson', 'numpy', 'jsonargparse')), sep=', ')"
)


@nox.session(python=TOOLS_PYTHON)
def lint(session: nox.Session) -> None:
    """``ruff check`` and ``ruff format --check`` over the repository (settings in pyproject.toml)."""
    session.install("-q", *CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=TOOLS_PYTHON)
def types(session: nox.Session) -> None:
    """``mypy`` on the package (``[tool.mypy]`` in pyproject.toml); it needs the dependencies' types.

    Not a default session: the default run checks types inside ``tests-3.11``'s environment, which
    holds the same pinned packages, instead of installing them a second time (~2 min of CI)."""
    with discarded_afterwards(session):
        session.install("-q", *CONSTRAINTS, "-e", ".[test]", "mypy")
        session.run("mypy", *(session.posargs or ["vt_lightning"]))


TYPES_IN_TESTS = TOOLS_PYTHON  # the tests session that also runs ``mypy vt_lightning`` (see ``types``)


# The suite in two passes: every file but the serial ones (marked ``serial`` in the file itself) on all
# cores, a file's tests together on one worker (its module fixtures run once); then the serial files
# alone, since they time things across processes or race with the machine's load. On the 2-core CI
# machine the two passes take ~10 min per Python where one serial pass took ~16.
PARALLEL_PASS = ("-n", "auto", "--maxprocesses", "4", "--dist", "loadfile", "--durations", "15")
SERIAL_PASS = ("--durations", "10")

# What each interpreter runs: shorter CI (its target is about 30 minutes on the 2-core CI machine;
# a fresh clone took 51 min with the whole suite everywhere, 38 with the system tier on three of the
# four, 33 with it on two) without a version set losing a tier. Every tier runs at both ends of the declared range,
# where a version set is tested alone: 3.10 (lower bounds) and 3.13 (newest). The pinned set in
# between runs the in-process tiers (unit, integration: the Trainer, the files, the real parsers,
# HTA) on both its interpreters; the system tier (subprocesses, DDP, signals, the TensorBoard
# server: the OS and the packages' process-level behaviour) is bracketed by the two ends there, and
# ``nox -s tests-3.11 -- -m system`` runs it. The benchmarks' smoke tests (developer tools, system
# tier, ~2 min) run once, pinned: they time the team's own runs.
SYSTEM_TIER = {"3.10", "3.13"}
BENCHMARK_SMOKE = {"3.11"}


def suite_passes(python: str) -> list[tuple[str, tuple[str, ...]]]:
    """The two pytest runs of ``tests`` on ``python``: (name, arguments)."""
    left_out = []
    if python not in SYSTEM_TIER:
        left_out.append("(system and not benchmarks)")
    if python not in BENCHMARK_SMOKE:
        left_out.append("benchmarks")
    tiers = "".join(f" and not {expression}" for expression in left_out)
    return [
        ("parallel", ("-m", f"not serial{tiers}", *PARALLEL_PASS)),
        ("serial", ("-m", f"serial{tiers}", *SERIAL_PASS)),
    ]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """This Python's part of the suite (``suite_passes``) on its version set; arguments after
    ``--`` go to one plain pytest run instead (``nox -s tests-3.12 -- -m integration``)."""
    with discarded_afterwards(session):
        python = str(session.python)
        install_version_set(session, VERSION_SETS[python])
        if python in MIDDLE_OF_RANGE:
            session.install("-q", *MIDDLE_OF_RANGE[python])
            session.run("python", "-c", VERSIONS_LINE, silent=False)
        if session.posargs:
            session.run("python", "-m", "pytest", *session.posargs)
            return
        failed = []
        if python == TYPES_IN_TESTS:
            session.install("-q", *CONSTRAINTS, "mypy")
            try:
                session.run("mypy", "vt_lightning")
            except CommandFailed:
                failed.append("mypy")
        for name, pass_args in suite_passes(python):
            try:  # the serial pass runs even when the parallel one failed: one log says all
                session.run("python", "-m", "pytest", *pass_args)
            except CommandFailed:
                failed.append(f"pytest's {name} pass")
        if failed:
            session.error(f"failed: {', '.join(failed)}")


@nox.session(python=TOOLS_PYTHON)
def unit(session: nox.Session) -> None:
    """The unit tier alone, in seconds (not in the default sessions: ``tests`` runs it too)."""
    session.install("-q", *CONSTRAINTS, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "unit", *session.posargs)
