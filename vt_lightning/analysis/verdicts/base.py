"""What every verdict is made of: a ``Rule`` per kind, the ``Finding`` it returns, and
``make_verdict``, the one constructor. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from vt_lightning.analysis.schema import Verdict, VerdictWhere
from vt_lightning.analysis.usercode import code_origin, is_user_file, parse_function

if TYPE_CHECKING:
    from vt_lightning.analysis.verdicts.window import WindowView

TOP_WHERE = 3  # places per verdict


class Finding(NamedTuple):
    """What a rule found: the share of step time (None: unknown), the user's code, its numbers."""

    share: float | None
    where: list[VerdictWhere]
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One verdict kind: its rule, its thresholds by name (as docs/verdicts.md has them), its advice."""

    kind: str
    find: Callable[[WindowView], Iterable[Finding]]
    thresholds: Mapping[str, float]
    advice: str


def make_verdict(rule: Rule, finding: Finding) -> Verdict:
    """The one constructor: ``share`` first in the evidence, the rule's advice."""
    evidence = dict(finding.evidence)
    if finding.share is not None:
        evidence = {"share": finding.share, **evidence}
    return {"kind": rule.kind, "where": list(finding.where), "evidence": evidence, "advice": rule.advice}


def sort_verdicts(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """Largest share first (a verdict without a share last, in the order found)."""
    return sorted(verdicts, key=lambda v: float(v["evidence"].get("share") or 0.0), reverse=True)


def share_of(us: float, total_us: float) -> float:
    return round(us / total_us, 3) if total_us > 0 else 0.0


def where_of(name: str, us: float | None = None, steps: int = 1) -> VerdictWhere:
    """A VizTracer function name as a place, with its µs as ms per step."""
    function, path, line = parse_function(name)
    out: VerdictWhere = {"function": function, "file": path, "line": line}
    if us is not None:
        out["ms"] = round(us / 1000.0 / max(steps, 1), 3)
    return out


def top_where(per_name: Mapping[str, float], steps: int, limit: int = TOP_WHERE) -> list[VerdictWhere]:
    """The places with the most time, most first."""
    ranked = sorted(per_name.items(), key=lambda kv: kv[1], reverse=True)
    return [where_of(name, us, steps) for name, us in ranked[:limit] if us > 0]


def place(item: Mapping[str, Any]) -> list[VerdictWhere]:
    """``[{function, file, line}]`` of a summary entry that names one (``[]`` when it names none)."""
    if not item.get("file") and not item.get("function"):
        return []
    return [{"function": item.get("function"), "file": item.get("file"), "line": item.get("line")}]  # type: ignore[typeddict-item]


def users_first(places: Sequence[VerdictWhere]) -> list[VerdictWhere]:
    """The user's places; only when there is none, the others (a library's, never a generated one)."""
    user = [p for p in places if is_user_file(p.get("file"))]
    return user or [p for p in places if code_origin(p.get("file"))[0] != "generated"]
