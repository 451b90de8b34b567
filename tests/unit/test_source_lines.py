"""Recorded source lines (export/source_lines.py): bounds, files that are not regular, and the
note when the file on disk changed since the window (a real run: tests/integration/test_source_lines.py)."""

from __future__ import annotations

import os
from pathlib import Path

from vt_lightning.export import source_lines
from vt_lightning.export.source_lines import changed_since, excerpt_lines, named_places, record_sources


def test_lines_around_each_place_merged_per_file_and_cut_to_bounds(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "train.py"
    script.write_text("".join(f"line {n}" + ("x" * 500 if n == 12 else "") + "\n" for n in range(1, 31)))
    recorded = record_sources([(str(script), 10), (str(script), 12), (str(script), 29)])
    lines = recorded["files"][str(script)]["lines"]
    assert sorted(map(int, lines)) == [*range(6, 17), *range(25, 31)]  # ±4, merged, stops at the last line
    assert lines["10"] == "line 10" and len(lines["12"]) == source_lines.MAX_LINE_CHARS
    assert recorded["truncated"] is False
    monkeypatch.setattr(source_lines, "MAX_TOTAL_CHARS", 100)
    assert record_sources([(str(script), 10)])["truncated"] is True


def test_a_fifo_or_a_missing_file_gets_an_error_and_no_lines(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)  # reading it would block the writer
    recorded = record_sources([(str(fifo), 1), (str(tmp_path / "gone.py"), 3)])
    assert set(recorded["files"]) == {str(fifo), str(tmp_path / "gone.py")}
    assert all("error" in f and "lines" not in f for f in recorded["files"].values())


def test_an_edited_or_touched_file_is_changed_since(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n\ndef step():\n    return 1\n")
    recorded = record_sources([(str(script), 3)])["files"][str(script)]
    assert changed_since(str(script), recorded) is None
    os.utime(script, ns=(1, 1))  # another mtime: a stat cannot tell it from an edit, and reads nothing
    assert changed_since(str(script), recorded) == "changed since this window: lines as they were"
    script.write_text("# two lines\n# added\nimport torch\n\ndef step():\n    return 1\n")
    assert changed_since(str(script), recorded) == "changed since this window: lines as they were"
    script.unlink()
    assert changed_since(str(script), recorded) == "not on this machine: lines as recorded"


def test_the_places_a_summary_names_and_the_commands_excerpt(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("a = 1\n\ndef slow():\n    pass\n")
    where = {"function": "slow", "file": str(script), "line": 3}
    summary = {
        "verdicts": [{"kind": "python_bound", "where": [where], "evidence": {}, "advice": ""}],
        "top_python": {"by_self": [{**where, "origin": "user"}, {**where, "line": 99, "origin": "package"}]},
        "memory": {"top_sites_at_peak": [{**where, "line": 4, "origin": "user"}]},
        "job": {"straggler": None},
    }
    assert named_places(summary) == {(str(script), 3), (str(script), 4)}  # type: ignore[arg-type]
    summary["sources"] = record_sources(named_places(summary))  # type: ignore[arg-type]
    assert excerpt_lines(summary) == [  # type: ignore[arg-type]
        f"python_bound: slow ({script}:3)",
        "       1 | a = 1",
        "       2 | ",
        "  >    3 | def slow():",
        "       4 |     pass",
    ]
    old = {**summary, "sources": {"files": {}, "truncated": False}}
    assert excerpt_lines(old)[0].endswith("no recorded lines (written by an older version)")  # type: ignore[arg-type]
