"""The test suite on every Python CI covers: ``nox`` runs them all, ``nox -p 3.12`` one of them.

Each interpreter gets its own virtual environment under ``.nox/`` (git-ignored), kept between
runs, so a rerun only reinstalls what changed. torch is pinned by ``ci/constraints.txt``: on the
project's CPU-only machines 2.13.0 resolves to the local CPU wheel for 3.11 and to PyPI's CUDA
build (which runs on the CPU) elsewhere.
"""

from __future__ import annotations

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]  # keep in step with pyproject's classifiers

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite; arguments after ``--`` go to pytest (``nox -p 3.12 -- -k nesting``)."""
    session.install("-q", "-c", "ci/constraints.txt", "-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)
