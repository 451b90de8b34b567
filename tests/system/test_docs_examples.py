"""The documentation shows what the code prints: docs/quickstart.md's console output and
docs/summary.md's window summary against a fresh run of examples/train.py (ci/docs_examples.py
generates both blocks and says how they compare)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO


def docs_examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_examples", REPO / "ci" / "docs_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 names functions without their class")
def test_quickstart_shows_what_the_example_prints(tmp_path: Path) -> None:
    docs = docs_examples()
    started = time.monotonic()
    proc = docs.run_example(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert time.monotonic() - started < 300
    if "run budget reached" in proc.stdout:  # a machine so loaded that the windows outgrew their budget
        pytest.skip("the run budget stopped the example's second window on this loaded machine")
    if "did not finish the last window(s) within writer_timeout" in proc.stdout:  # the writer runs niced
        pytest.skip("the writer, starved by this loaded machine, dropped the example's last window")
    printed = docs.console_block(proc.stdout, tmp_path)
    shown = docs.doc_block((REPO / "docs" / "quickstart.md").read_text())
    assert docs.normalise(shown) == docs.normalise(printed), (
        f"docs/quickstart.md is out of date: run `python ci/docs_examples.py`. A run printed:\n{printed}"
    )
    assert "/home/me/proj/.venv/bin/python -m vt_lightning summary /home/me/proj/lightning_logs/version_0" in shown
    written = docs.window_summary(tmp_path)
    if written is None:
        pytest.skip("the run did not write the example's second window on this loaded machine")
    facts = docs.summary_facts(written)
    assert facts["user functions"] and facts["parts"], written
    shown_summary = docs.doc_block((REPO / "docs" / "summary.md").read_text(), docs.SUMMARY_BEGIN, docs.SUMMARY_END)
    assert docs.summary_facts(shown_summary) == facts, (
        f"docs/summary.md's example is out of date: run `python ci/docs_examples.py`. The run wrote:\n{written}"
    )


def test_normalise_keeps_words_and_commands_and_drops_timings() -> None:
    docs = docs_examples()
    assert docs.normalise("  0   2-4   21.9\n  step ───") == docs.normalise("  0  2-4  1021.25  step ─")
    assert docs.normalise("summary: x -m vt_lightning summary") != docs.normalise("summary: x summary")


def test_summary_facts_catch_a_stale_line_or_call_count() -> None:
    docs = docs_examples()
    row = "| `TinyTransformer.training_step` | train.py:68 | 27.52 | 0.06 | 2 |"
    assert docs.summary_facts(row)["user functions"] == ["`TinyTransformer.training_step` train.py:68 calls 2"]
    assert docs.summary_facts(row) != docs.summary_facts(row.replace(":68", ":71"))
    assert docs.summary_facts(row) != docs.summary_facts(row.replace("| 2 |", "| 3 |"))
    assert docs.summary_facts(row) == docs.summary_facts(row.replace("27.52", "268.98"))
