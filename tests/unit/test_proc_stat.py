"""``export.atomic.scheduler_state``: the scheduler state of a ``/proc/<pid>/stat`` line."""

from __future__ import annotations

from vt_lightning.export.atomic import scheduler_state


def test_the_state_is_read_after_the_last_parenthesis_of_the_name():
    assert scheduler_state(b"12 (pt_main_thread) R 1 12 12 0") == "R"
    assert scheduler_state(b"13 (odd) S (name) R 1 12") == "R"  # a name may hold ") S ("
    assert scheduler_state(b"14 (gloo) S 1 12") == "S"
    assert scheduler_state(b"15 (python) Z 1 12") == "Z"


def test_a_line_without_a_state_has_none():
    assert scheduler_state(b"") == ""
    assert scheduler_state(b"16 python R") == ""  # no name in parentheses: not a stat line
