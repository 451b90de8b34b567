"""Every verdict kind, in one registry: ``RULES`` (kind, rule, thresholds, advice), in the order
docs/verdicts.md lists them, and ``find_verdicts``, which runs them over one window. Adding a kind
is adding one ``Rule`` to its family's ``RULES`` (docs/architecture.md, "a verdict kind"). Pure."""

from __future__ import annotations

from vt_lightning.analysis.schema import Summary, Verdict
from vt_lightning.analysis.steps import WindowData
from vt_lightning.analysis.verdicts import compile as compile_rules
from vt_lightning.analysis.verdicts import cuda, input, job, memory, python
from vt_lightning.analysis.verdicts.base import Rule, make_verdict, sort_verdicts
from vt_lightning.analysis.verdicts.window import WindowView

# (family module, its rules): input, Python, CUDA and host, memory, compile, job.
FAMILIES = (input, python, cuda, memory, compile_rules, job)
RULES: tuple[Rule, ...] = tuple(rule for family in FAMILIES for rule in family.RULES)
KINDS = tuple(rule.kind for rule in RULES)
ADVICE = {rule.kind: rule.advice for rule in RULES}


def find_verdicts(data: WindowData, summary: Summary, memory_snapshot: object = None) -> list[Verdict]:
    """Every rule over one window, largest share first (``[]``: nothing stands out). ``data`` is
    the summary's own read of the window (analysis/steps.py), not redone here."""
    view = WindowView(data, summary, memory_snapshot)
    if not view.steps or view.total_us <= 0:
        return []
    return sort_verdicts(make_verdict(rule, finding) for rule in RULES for finding in rule.find(view))
