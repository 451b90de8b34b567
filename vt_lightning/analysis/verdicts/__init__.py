"""Why is my step slow? One window's verdicts, each naming the user's code beside its evidence.

One module per family, each a ``RULES`` of ``base.Rule``s over ``window.WindowView``. Each rule has
a relative threshold and a small absolute floor: a healthy window gets none, as a false alarm costs
more trust than a missed one. docs/verdicts.md explains every kind."""

from __future__ import annotations

from vt_lightning.analysis.schema import Summary, Verdict
from vt_lightning.analysis.steps import WindowData
from vt_lightning.analysis.verdicts import compile as compile_rules
from vt_lightning.analysis.verdicts import cuda, input, job, memory, python
from vt_lightning.analysis.verdicts.base import Finding, Rule, make_verdict, sort_verdicts
from vt_lightning.analysis.verdicts.job import with_job_verdicts
from vt_lightning.analysis.verdicts.memory import MEMORY_RESERVED_SHARE
from vt_lightning.analysis.verdicts.window import WindowView

FAMILIES = (input, python, cuda, memory, compile_rules, job)
RULES: tuple[Rule, ...] = tuple(rule for family in FAMILIES for rule in family.RULES)
KINDS = tuple(rule.kind for rule in RULES)
ADVICE = {rule.kind: rule.advice for rule in RULES}


def find_verdicts(data: WindowData, summary: Summary, memory_snapshot: object = None) -> list[Verdict]:
    """Every rule over one window (``data``: the summary's own read of it), largest share first."""
    view = WindowView(data, summary, memory_snapshot)
    if not view.steps or view.total_us <= 0:
        return []
    return sort_verdicts(make_verdict(rule, finding) for rule in RULES for finding in rule.find(view))


__all__ = [
    "ADVICE",
    "KINDS",
    "MEMORY_RESERVED_SHARE",
    "RULES",
    "Finding",
    "Rule",
    "find_verdicts",
    "make_verdict",
    "sort_verdicts",
    "with_job_verdicts",
]
