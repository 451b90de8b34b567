"""The test tiers themselves (CONTRIBUTING.md): a test's tier is its folder, a test file outside the
tier folders or a test marked with another tier fails the collection (tests/conftest.py), and a
unit test can build no Trainer and start no subprocess."""

from __future__ import annotations

import subprocess
import sys

import lightning as L
import pytest
from conftest import tier_of, tier_problem
from support.paths import REPO, TESTS


def test_a_tests_tier_is_the_folder_it_lives_in():
    assert tier_of(TESTS / "unit" / "test_budget.py") == "unit"
    assert tier_of(TESTS / "integration" / "test_budget.py") == "integration"
    assert tier_of(TESTS / "system" / "test_ddp.py") == "system"
    assert tier_of(TESTS / "test_budget.py") is None
    assert tier_of(TESTS / "support" / "test_x.py") is None
    assert tier_of(REPO / "unit" / "test_x.py") is None  # a folder named like a tier outside tests/


def test_a_file_outside_the_tier_folders_or_a_contradicting_marker_is_refused():
    assert tier_problem(TESTS / "test_budget.py", set()) == "outside the tier folders"
    assert tier_problem(TESTS / "scripts" / "test_x.py", {"system"}) == "outside the tier folders"
    assert tier_problem(TESTS / "unit" / "test_x.py", {"integration"}) == "marked integration in tests/unit/"
    assert tier_problem(TESTS / "system" / "test_x.py", {"unit", "system"}) == "marked unit in tests/system/"
    assert tier_problem(TESTS / "unit" / "test_x.py", {"unit"}) is None
    assert tier_problem(TESTS / "unit" / "test_x.py", set()) is None


def test_this_tier_refuses_a_trainer_and_a_subprocess():
    with pytest.raises(RuntimeError, match="is in the unit tier, which never builds a Lightning Trainer"):
        L.Trainer()
    with pytest.raises(RuntimeError, match="is in the unit tier, which never starts a subprocess"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
