"""``diff`` on hand-made summaries: "only in A/B" against "under the threshold", one threshold, and
each change beside the steps' own spread (real runs: tests/integration/test_numbers.py)."""

from __future__ import annotations

from typing import Any

from vt_lightning.analysis.compare import diff, diff_table
from vt_lightning.analysis.summary import name_hash, totals

USER = "/home/me/train.py"


def _summary(steps: dict[int, float], ops_us: dict[str, float], python_us: dict[str, float], user: list[Any]) -> Any:
    counted = sorted(steps)
    return {
        "schema": 2,
        "steps": {"recorded": counted, "counted": counted, "ms": {str(n): ms for n, ms in steps.items()}},
        "step_ms": {"mean": sum(steps.values()) / len(steps)},
        "breakdown_ms": {"forward": 1.0},
        "top_python": {"by_self": [], "by_inclusive": user, "totals": totals(python_us, len(steps))},
        "top_ops": {"by_cpu": [], "totals": totals(ops_us, len(steps))},
    }


def _user(function: str, line: int, inclusive_ms: float) -> dict[str, Any]:
    return {"function": function, "file": USER, "line": line, "origin": "user", "inclusive_ms": inclusive_ms}


def test_a_name_run_on_one_side_only_says_so_and_one_under_the_threshold_says_that() -> None:
    # Both windows have a tiny op under the 1 µs/step threshold, so "other_count" alone cannot tell.
    a = _summary({2: 14.1, 3: 40.6}, {"aten::mm": 4000.0, "aten::tiny": 0.5, "aten::view": 40.0}, {}, [])
    b = _summary(
        {2: 20.4, 3: 14.8}, {"aten::mm": 4000.0, "aten::sort": 300.0, "aten::view": 0.4, "aten::tiny": 0.5}, {}, []
    )
    assert name_hash("aten::view") in b["top_ops"]["totals"]["below"]
    result = diff([a], [b], limit=0)
    rows = {r["name"]: r for r in result["ops"]}
    assert rows["aten::sort"]["state"] == "only in B" and rows["aten::sort"]["a_text"] == "–"
    assert rows["aten::sort"]["a_ms"] is None and rows["aten::sort"]["b_ms"] == 0.15
    assert rows["aten::view"]["state"] == "under threshold in B" and rows["aten::view"]["b_text"] == "< 0.001"
    assert "aten::tiny" not in rows  # under the threshold on both sides: not compared
    backwards = {r["name"]: r for r in diff([b], [a], limit=0)["ops"]}
    assert backwards["aten::sort"]["state"] == "only in A" and backwards["aten::sort"]["b_text"] == "–"
    # One threshold, stated once; no "?" in any cell.
    assert result["rule"] == "functions and ops under 0.001 ms/step on both sides are not compared"
    for key in ("breakdown", "user_python", "python", "ops"):
        cells, _ = diff_table(result[key])
        assert not any("?" in cell for row in cells for cell in row)


def test_a_change_inside_the_steps_own_spread_is_within_noise() -> None:
    """A: 14.1 and 40.6 ms, B: 20.4 and 14.8 ms (research-51's two runs): the step's -9.8 ms lies in
    A's own 26.5 ms spread."""
    a = _summary({2: 14.1, 3: 40.6}, {"aten::mm": 2000.0}, {}, [])
    b = _summary({2: 20.4, 3: 14.8}, {"aten::mm": 60000.0}, {}, [])
    result = diff([a], [b])
    assert result["noise"]["a"] == {"steps": 2, "min_ms": 14.1, "max_ms": 40.6, "median_ms": 27.35}
    assert result["noise"]["ms"] == 26.5
    assert result["step"]["delta_ms"] == -9.75 and result["step"]["within_noise"]
    (mm,) = result["ops"]
    assert mm["delta_ms"] == 29.0 and not mm["within_noise"] and mm["delta_percent"] == 2900.0
    cells, styles = diff_table([result["step"], mm])
    assert cells[0][-1] == "within noise" and (0, 3) not in styles and styles[(1, 3)] == "red"


def test_a_users_function_listed_on_one_side_is_a_lower_bound_on_the_other() -> None:
    """The user table lists a few functions by inclusive time; one not listed in A but run there
    shows its self time as a lower bound, never "?" or "new"."""
    key = f"prepare ({USER}:7)"
    a = _summary({2: 10.0, 3: 10.0}, {}, {key: 4000.0}, [])
    b = _summary({2: 40.0, 3: 40.0}, {}, {key: 4000.0}, [_user("prepare", 7, 32.0)])
    (row,) = diff([a], [b])["user_python"]
    assert row["state"] == "lower bound in A" and row["a_text"] == "≥ 2.000" and row["delta_percent"] is None
    new = _summary({2: 40.0, 3: 40.0}, {}, {"other": 1.0}, [_user("brand_new", 9, 30.0)])
    (row,) = diff([a], [new])["user_python"]
    assert row["state"] == "only in B"
