"""Why is my step slow? One window's verdicts, each naming the user's code beside its evidence.

One room per answer, the way HTA keeps one analyzer per module:

* ``steps.WindowData`` (analysis/steps.py): the window read once by the summary; ``window.py``
  turns it into the ``WindowView`` every rule reads (counted steps, events by kind, per-thread
  timelines);
* one module per family of rules: ``input.py``, ``python.py``, ``cuda.py`` (CUDA and host),
  ``memory.py``, ``compile.py``, ``job.py``; each rule returns ``Finding``s;
* ``base.py``: ``Rule`` and ``make_verdict``, the one constructor every verdict goes through;
* here: ``RULES`` (kind, rule, thresholds, advice, in the order docs/verdicts.md lists them) and
  ``find_verdicts``, which runs them over one window and sorts once every verdict is in.

Each rule has one relative threshold (a share of the counted steps' time) and a small absolute
floor, so a tiny step never earns a verdict for microseconds; a healthy window gets none: a false
alarm costs more trust than a missed one. ``where`` is the user's code (analysis/usercode.py:
never a framework's or a compiler's generated code when a user frame exists). docs/verdicts.md
explains every kind.
"""

from __future__ import annotations

from vt_lightning.analysis.schema import Summary, Verdict
from vt_lightning.analysis.steps import WindowData
from vt_lightning.analysis.verdicts import compile as compile_rules
from vt_lightning.analysis.verdicts import cuda, input, job, memory, python
from vt_lightning.analysis.verdicts.base import Finding, Rule, make_verdict, sort_verdicts
from vt_lightning.analysis.verdicts.job import with_job_verdicts
from vt_lightning.analysis.verdicts.memory import MEMORY_RESERVED_SHARE
from vt_lightning.analysis.verdicts.window import WindowView

# (family module, its rules): input, Python, CUDA and host, memory, compile, job. Adding a kind is
# adding one ``Rule`` to its family's ``RULES`` (docs/architecture.md, "a verdict kind").
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
