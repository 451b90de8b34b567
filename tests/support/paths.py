"""The repository's folders, for the tests and the scripts they start: one place to change when a
folder moves."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"  # what the tests run as subprocesses: cli/, ddp/, exit/, fault/
# The package as this interpreter imports it (found, not imported: conftest reads this module, and
# tests/unit/test_architecture.py checks a package that does not import): the folder its calls'
# file names start with.
PACKAGE = os.path.dirname(os.path.abspath(str(find_spec("vt_lightning").origin)))
