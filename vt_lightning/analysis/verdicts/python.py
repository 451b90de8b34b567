"""The Python family: ``python_bound`` and ``gc``. Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterator

from vt_lightning.analysis.spans import Span, clip, covered, difference, span_of, union
from vt_lightning.analysis.usercode import function_origin
from vt_lightning.analysis.verdicts.base import Finding, Rule, share_of, top_where
from vt_lightning.analysis.verdicts.window import WindowView
from vt_lightning.constants import GC_SPAN_PREFIX

PYTHON_BOUND_SHARE = 0.30  # the user's own Python with no torch op under it, of the step
PYTHON_BOUND_MIN_MS = 1.0  # per step
GC_SHARE = 0.05  # the garbage collector's pauses, of the step
GC_MIN_MS = 0.5  # per step
PURE_ORIGINS = ("user", "builtin", "stdlib")


def _python_upper_bound_ms(w: WindowView) -> float | None:
    """Per step, an upper bound of the pure Python time: a window under it skips the timeline."""
    totals = (w.summary.get("top_python") or {}).get("totals")
    if not totals:
        return None
    own = sum(ms for key, ms in totals["ms"].items() if function_origin(key, w.data.command)[0] in PURE_ORIGINS)
    return own + totals["other_ms"]


def python_bound(w: WindowView) -> Iterator[Finding]:
    """The user's own Python, with no torch op under it, outside the data wait, is a large share."""
    bound = _python_upper_bound_ms(w)
    if bound is not None and (bound < PYTHON_BOUND_SHARE * w.step_ms or bound < PYTHON_BOUND_MIN_MS):
        return
    ops = union(w.ops)  # torch ops, and CUDA runtime calls (blocked in a sync, a launch): not Python
    outside_waits = difference(w.step_spans, w.data_waits)
    # all the time counted below: when it is too little, the timeline (the costliest part) is never built
    most_us = sum(hi - lo for lo, hi in difference(outside_waits, ops))
    if share_of(most_us, w.total_us) < PYTHON_BOUND_SHARE or w.per_step_ms(most_us) < PYTHON_BOUND_MIN_MS:
        return
    starts = [s for s, _ in ops]
    slot_starts = [lo for lo, _ in w.slots]
    per_owner: dict[str, float] = defaultdict(float)
    per_step = [0.0] * len(slot_starts)
    for (lo, hi), (_, _, _, _, _, owner) in w.timeline(w.thread).within(outside_waits):
        if owner:
            pure = max((hi - lo) - covered((lo, hi), ops, starts), 0.0)
            per_owner[owner] += pure
            per_step[max(bisect_right(slot_starts, lo) - 1, 0)] += pure
    pure_us = sum(per_owner.values())
    share = share_of(pure_us, w.total_us)
    if share < PYTHON_BOUND_SHARE or not w.most_steps(per_step, PYTHON_BOUND_SHARE, PYTHON_BOUND_MIN_MS):
        return
    evidence = {
        "user_python_ms": w.per_step_ms(pure_us),
        "step_ms": w.per_step_ms(w.total_us),
        "per_step_ms": [round(us / 1000.0, 3) for us in per_step],
    }
    yield Finding(share, top_where(per_owner, w.steps), evidence)


def gc_pauses(w: WindowView) -> Iterator[Finding]:
    """The garbage collector's pauses are a share of the step; where: the user code they interrupted."""
    pauses: list[Span] = []
    per_user: dict[str, float] = defaultdict(float)
    generations: dict[str, int] = defaultdict(int)
    longest = 0.0
    for e in w.gc:
        if e.get("pid") != w.pid:
            continue
        kept = clip([span_of(e)], *w.region)
        if not kept or not w.in_steps(kept[0]):
            continue
        pauses.append(kept[0])
        us = kept[0][1] - kept[0][0]
        longest = max(longest, us)
        generations[str(e.get("name", ""))[len(GC_SPAN_PREFIX) :]] += 1
        user = w.user_at(e, kept[0][0] - 1e-3)
        if user:
            per_user[user] += us
    paused_spans = union(pauses)
    paused = sum(e - s for s, e in paused_spans)
    share = share_of(paused, w.total_us)
    per_step = w.per_step_us(paused_spans)
    if share < GC_SHARE or not w.most_steps(per_step, GC_SHARE, GC_MIN_MS):
        return
    evidence = {
        "gc_ms": w.per_step_ms(paused),
        "pauses": len(pauses),
        "longest_ms": round(longest / 1000.0, 3),
        "by_generation": dict(generations),
        "step_ms": w.per_step_ms(w.total_us),
        "per_step_ms": [round(us / 1000.0, 3) for us in per_step],
    }
    yield Finding(share, top_where(per_user, w.steps), evidence)


RULES = (
    Rule(
        "python_bound",
        python_bound,
        {"PYTHON_BOUND_SHARE": PYTHON_BOUND_SHARE, "PYTHON_BOUND_MIN_MS": PYTHON_BOUND_MIN_MS},
        "Move the per-step Python named here into tensor ops, precompute it once, or run it every N steps.",
    ),
    Rule(
        "gc",
        gc_pauses,
        {"GC_SHARE": GC_SHARE, "GC_MIN_MS": GC_MIN_MS},
        "Python's garbage collector paused the step: avoid reference cycles in per-step objects, call "
        "gc.freeze() after setup, or raise gc.set_threshold().",
    ),
)
