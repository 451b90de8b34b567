"""The job family: ``straggler``, from rank 0's ``job`` block (``straggler.py``), added after the
window's own verdicts by ``with_job_verdicts``. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from vt_lightning.analysis.schema import Summary, Verdict, VerdictWhere
from vt_lightning.analysis.straggler import MIN_SHARE, MIN_WAIT_MS
from vt_lightning.analysis.verdicts.base import Finding, Rule, make_verdict, sort_verdicts, users_first


def straggler(job: Mapping[str, Any] | None) -> Iterator[Finding]:
    """The late rank from the ``job`` block; where: the user function with the most extra time."""
    found = (job or {}).get("straggler")
    if not found:
        return
    where: list[VerdictWhere] = []
    if found.get("function"):
        where = users_first([{"function": found["function"], "file": found.get("file"), "line": found.get("line")}])
    evidence = {
        "rank": found.get("rank"),
        "others_wait_ms": found.get("others_wait_ms"),
        "step_ms": found.get("step_ms"),
        "excess_ms": found.get("excess_ms"),
    }
    yield Finding(found.get("share_of_step"), where, evidence)


RULES = (
    Rule(
        "straggler",
        lambda w: straggler(w.summary.get("job")),
        {"MIN_SHARE": MIN_SHARE, "MIN_WAIT_MS": MIN_WAIT_MS},
        "One rank is late at the collectives: look at what it does between them (its data, its Python, "
        "an uneven batch or a busy host), and balance the work.",
    ),
)


def with_job_verdicts(summary: Summary) -> list[Verdict]:
    """The summary's verdicts with this family's added, largest share first again."""
    job = summary.get("job")
    added = [make_verdict(rule, finding) for rule in RULES for finding in straggler(job)]
    return sort_verdicts([*summary.get("verdicts", []), *added])
