"""Verdicts for people: the console line, the summary.md bullets, and what ``diff`` says about
verdicts that appeared or went away between two windows or runs. Pure; the rules are analysis/verdicts/."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from vt_lightning.analysis.verdicts import KINDS, MEMORY_RESERVED_SHARE


def verdict_line(verdict: Mapping[str, Any]) -> str:
    """One line for the console and the markdown: kind, share, the first place, the advice."""
    evidence = verdict.get("evidence") or {}
    where = verdict.get("where") or []
    place = ""
    if where:
        first = where[0]
        location = f"{first.get('file')}:{first.get('line')}" if first.get("file") else "builtin"
        place = f" at {location} ({first.get('function')})"
    headline = _headline(evidence)
    return f"{verdict.get('kind')}{f' ({headline})' if headline else ''}{place}: {verdict.get('advice')}"


def _headline(evidence: Mapping[str, Any]) -> str:
    """ "40% of step time" (or, for memory near the device's total, "95% of device memory reserved")."""
    reserved = evidence.get("reserved_of_device")
    if isinstance(reserved, (int, float)) and reserved >= MEMORY_RESERVED_SHARE:
        return f"{reserved:.0%} of device memory reserved"
    share = evidence.get("share")
    return f"{share:.0%} of step time" if isinstance(share, (int, float)) else ""


def _place(where: Mapping[str, Any]) -> str:
    location = f"{str(where.get('file')).rsplit('/', 1)[-1]}:{where.get('line')}" if where.get("file") else "builtin"
    ms = where.get("ms")
    return f"`{where.get('function')}` ({location}" + (f", {ms:.2f} ms/step)" if isinstance(ms, (int, float)) else ")")


def _value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "(" + ", ".join(f"{k}: {v}" for k, v in value.items()) + ")"
    return str(value)


def verdicts_markdown(verdicts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary.md lines: one bullet per verdict (kind, share, places, numbers, advice)."""
    if not verdicts:
        return ["**Verdicts**: none (no rule in docs/verdicts.md fired)."]
    lines = ["**Verdicts** (rules: docs/verdicts.md):", ""]
    for verdict in verdicts:
        evidence = dict(verdict.get("evidence") or {})
        headline = _headline(evidence)
        evidence.pop("share", None)
        head = f"- `{verdict.get('kind')}`" + (f", {headline}" if headline else "")
        places = ", ".join(_place(w) for w in verdict.get("where") or []) or "no user code found"
        numbers = "; ".join(f"{k} {_value(v)}" for k, v in evidence.items())
        lines.append(f"{head}: {places}. {numbers}. {verdict.get('advice')}")
    return lines


def _kinds(summaries: Sequence[Mapping[str, Any]]) -> tuple[int, dict[str, list[float]]]:
    """How many summaries have verdicts at all, and per kind the share in each window that had it."""
    judged = 0
    shares: dict[str, list[float]] = defaultdict(list)
    for summary in summaries:
        verdicts = summary.get("verdicts")
        if not isinstance(verdicts, list):
            continue
        judged += 1
        for verdict in verdicts:
            if isinstance(verdict, Mapping) and isinstance(verdict.get("kind"), str):
                share = (verdict.get("evidence") or {}).get("share")
                shares[verdict["kind"]].append(float(share) if isinstance(share, (int, float)) else 0.0)
    return judged, shares


def verdict_changes(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per kind on either side: its windows and mean share in A and B, and whether it came or went."""
    judged_a, kinds_a = _kinds(a)
    judged_b, kinds_b = _kinds(b)
    if not judged_a or not judged_b:
        return []
    rows = []
    for kind in sorted(set(kinds_a) | set(kinds_b), key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
        in_a, in_b = kinds_a.get(kind, []), kinds_b.get(kind, [])
        rows.append(
            {
                "kind": kind,
                "a_windows": f"{len(in_a)}/{judged_a}",
                "b_windows": f"{len(in_b)}/{judged_b}",
                "a_share": round(sum(in_a) / len(in_a), 3) if in_a else None,
                "b_share": round(sum(in_b) / len(in_b), 3) if in_b else None,
                "change": "appeared" if not in_a else ("went away" if not in_b else "still there"),
            }
        )
    return rows


def verdict_change_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``diff``'s console lines: one per kind that appeared, went away or stayed."""

    def side(share: Any, windows: str) -> str:
        return (
            f"{share:.0%} in {windows} windows"
            if isinstance(share, (int, float))
            else f"none of {windows.split('/')[-1]} windows"
        )

    return [
        f"  {row['kind']}: {row['change']} (A: {side(row['a_share'], row['a_windows'])}; "
        f"B: {side(row['b_share'], row['b_windows'])})"
        for row in rows
    ]
