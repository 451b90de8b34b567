"""The compile family (docs/compile.md), from the summary's ``compile`` key. Pure. ``where`` is the
compiled function when it is the user's, else the user's call around its compile span."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from vt_lightning.analysis.schema import VerdictWhere
from vt_lightning.analysis.spans import span_of
from vt_lightning.analysis.usercode import is_user_file
from vt_lightning.analysis.verdicts.base import (
    Finding,
    Rule,
    place,
    top_where,
    users_first,
    where_of,
)
from vt_lightning.analysis.verdicts.window import WindowView

COMPILE_SHARE = 0.10  # compile_time: compile took at least this share of the window's step time...
COMPILE_MIN_MS = 20.0  # ...and at least this long
SHAPE_REASON = re.compile(r"\b(size|sizes|shape|shapes|stride|strides|dtype|dim|ndim|numel|rank)\b", re.I)
FUNCTIONS_LISTED = 5  # compiled functions looked at for compile_time's ``where``


class Callers:
    """The user's calls that ran each compile: by compile id, and µs of compile per caller."""

    def __init__(self) -> None:
        self.by_id: dict[str, str] = {}
        self.us: dict[str, float] = {}

    @classmethod
    def of(cls, w: WindowView) -> Callers:
        """From the window's compile spans: the innermost user call open on their thread."""
        callers = cls()
        spent: dict[str, float] = defaultdict(float)
        for e in w.compile_spans:
            user = w.user_at(e)
            if not user:
                continue
            compile_id = (e.get("args") or {}).get("compile_id")
            if compile_id is not None:
                callers.by_id.setdefault(str(compile_id), user)
            start, end = span_of(e)
            spent[user] += end - start
        callers.us = dict(spent)
        return callers


def _mean_step_ms(step_ms: float | Mapping[str, Any] | None) -> float | None:
    if isinstance(step_ms, Mapping):
        step_ms = step_ms.get("mean")
    return float(step_ms) if isinstance(step_ms, (int, float)) else None


def _user_place(item: Mapping[str, Any], callers: Callers) -> list[VerdictWhere]:
    """The compiled function when it is the user's, else the user's call that ran it."""
    if is_user_file(item.get("file")):
        return place(item)
    caller = callers.by_id.get(str(item.get("compile_id")))
    if caller is None and len(callers.us) == 1:
        caller = next(iter(callers.us))
    if caller is not None:
        return [where_of(caller)]
    return users_first(place(item))


def compile_time(info: Mapping[str, Any], step_ms: Any, callers: Callers) -> Iterator[Finding]:
    """Compile time inside the recorded steps is a share of them."""
    share = info.get("share")
    in_steps = float(info.get("in_steps_ms") or 0.0)
    if not (isinstance(share, (int, float)) and share >= COMPILE_SHARE and in_steps >= COMPILE_MIN_MS):
        return
    functions = [f for f in info.get("functions") or () if isinstance(f, Mapping)][:FUNCTIONS_LISTED]
    where = [w for f in functions if is_user_file(f.get("file")) for w in place(f)]
    if not where:
        where = top_where(callers.us, 1) or users_first([w for f in functions for w in place(f)])
    evidence = {
        "compile_ms": in_steps,
        "steps_ms": info.get("steps_ms"),
        "compiles": info.get("compiles"),
        "phases_ms": info.get("phases_ms"),
        "step_ms": _mean_step_ms(step_ms),
    }
    yield Finding(share, [_strip_ms(w) for w in where], evidence)


def _strip_ms(where: VerdictWhere) -> VerdictWhere:
    """compile_time names places, not per-step times."""
    return {"function": where["function"], "file": where["file"], "line": where["line"]}


def recompile(info: Mapping[str, Any], callers: Callers) -> Iterator[Finding]:
    """A compiled function recompiled for a changed shape, stride or dtype: one verdict per function."""
    share = info.get("share")
    by_function: dict[tuple[Any, Any, Any], list[Mapping[str, Any]]] = {}
    for item in info.get("recompiles") or ():
        if isinstance(item, Mapping) and item.get("reason") and SHAPE_REASON.search(str(item["reason"])):
            by_function.setdefault((item.get("function"), item.get("file"), item.get("line")), []).append(item)
    for items in by_function.values():
        evidence = {
            "recompiles": len(items),
            "reason": items[-1]["reason"],
            "reasons": [str(i["reason"]) for i in items[:3]],
        }
        # the window's compile share: what the recompiles cost (absent when unknown)
        yield Finding(share if isinstance(share, (int, float)) else None, _user_place(items[0], callers), evidence)


def graph_break(info: Mapping[str, Any]) -> Iterator[Finding]:
    """Every graph break, at the user's line dynamo reported (dynamo traces the user's frames)."""
    for item in info.get("graph_breaks") or ():
        if isinstance(item, Mapping):
            evidence = {
                "reason": item.get("reason"),
                "compiles": item.get("compiles", 0),
                "calls": item.get("calls", 0),
            }
            yield Finding(None, place(item), evidence)


def _info(w: WindowView) -> Mapping[str, Any]:
    return w.summary.get("compile") or {}


RULES = (
    Rule(
        "compile_time",
        lambda w: compile_time(_info(w), w.summary.get("step_ms"), Callers.of(w)) if _info(w) else iter(()),
        {"COMPILE_SHARE": COMPILE_SHARE, "COMPILE_MIN_MS": COMPILE_MIN_MS},
        "torch.compile ran inside the measured steps: record after warm-up (a later window), and remove "
        "the recompiles and graph breaks that make it compile again.",
    ),
    Rule(
        "recompile",
        lambda w: recompile(_info(w), Callers.of(w)) if _info(w) else iter(()),
        {},
        "inputs change shape from step to step: mark the changing dimension dynamic "
        "(torch._dynamo.mark_dynamic) or pad batches to a few fixed sizes.",
    ),
    Rule(
        "graph_break",
        lambda w: graph_break(_info(w)),
        {},
        "this line splits the compiled graph in two and runs Python between them: move it out of the "
        "compiled function, or rewrite it so dynamo can trace it.",
    ),
)
