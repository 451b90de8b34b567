"""Why is my step slow? One window's verdicts, each naming the user's code beside its evidence.

One room per answer, the way HTA keeps one analyzer per module:

* ``steps.WindowData`` (analysis/steps.py): the window read once by the summary; ``window.py``
  turns it into the ``WindowView`` every rule reads (counted steps, events by kind, per-thread
  timelines);
* one module per family of rules: ``input.py``, ``python.py``, ``cuda.py`` (CUDA and host),
  ``memory.py``, ``compile.py``, ``job.py``; each rule returns ``Finding``s;
* ``base.py``: ``Rule`` and ``make_verdict``, the one constructor every verdict goes through;
* ``registry.py``: ``RULES`` and ``find_verdicts``, which sorts once every verdict is in.

Each rule has one relative threshold (a share of the counted steps' time) and a small absolute
floor, so a tiny step never earns a verdict for microseconds; a healthy window gets none: a false
alarm costs more trust than a missed one. ``where`` is the user's code (analysis/usercode.py:
never a framework's or a compiler's generated code when a user frame exists). docs/verdicts.md
explains every kind.
"""

from vt_lightning.analysis.verdicts.base import Finding, Rule, make_verdict, sort_verdicts
from vt_lightning.analysis.verdicts.job import with_job_verdicts
from vt_lightning.analysis.verdicts.memory import MEMORY_RESERVED_SHARE
from vt_lightning.analysis.verdicts.registry import ADVICE, KINDS, RULES, find_verdicts

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
