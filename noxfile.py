"""CI in nox: ``nox`` runs lint, types and the test suite on every Python; ``nox -s unit`` the unit
tier alone (CONTRIBUTING.md).

Each session gets its own virtual environment under ``.nox/`` (git-ignored), kept between runs, so
a rerun only reinstalls what changed. Every install goes through ``ci/constraints.txt``: torch is
pinned there (on the project's CPU-only machines 2.13.0 resolves to the local CPU wheel for 3.11
and to PyPI's CUDA build, which runs on the CPU, elsewhere), and so are ruff and mypy.
"""

from __future__ import annotations

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]  # keep in step with pyproject's classifiers
TOOLS_PYTHON = "3.11"  # lint, types and the quick unit run

nox.options.sessions = ["lint", "types", "tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"

CONSTRAINTS = ("-c", "ci/constraints.txt")


@nox.session(python=TOOLS_PYTHON)
def lint(session: nox.Session) -> None:
    """``ruff check`` and ``ruff format --check`` over the repository (settings in pyproject.toml)."""
    session.install("-q", *CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=TOOLS_PYTHON)
def types(session: nox.Session) -> None:
    """``mypy`` on the package (``[tool.mypy]`` in pyproject.toml); it needs the dependencies' types."""
    session.install("-q", *CONSTRAINTS, "-e", ".[test]", "mypy")
    session.run("mypy", *(session.posargs or ["vt_lightning"]))


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite; arguments after ``--`` go to pytest (``nox -s tests-3.12 -- -m integration``)."""
    session.install("-q", *CONSTRAINTS, "-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python=TOOLS_PYTHON)
def unit(session: nox.Session) -> None:
    """The unit tier alone, in seconds (not in the default sessions: ``tests`` runs it too)."""
    session.install("-q", *CONSTRAINTS, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "unit", *session.posargs)
