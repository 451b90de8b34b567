"""The repository's folders, for the tests and the scripts they start: one place to change when a
folder moves."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"  # what the tests run as subprocesses: cli/, ddp/, exit/, fault/
