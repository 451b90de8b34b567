"""Where each instant of a step went: the breakdown's parts and the ranges that decide them. Pure.

Each instant goes to the innermost range covering it (Lightning's stages, the user's hook overrides,
the window's validation ranges), except that a validation, test or predict range takes everything
inside it; what none covers is ``other``. ``phase_segments`` gives the same parts as a timeline: the
phases the Python tables fold the frameworks' calls by."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX
from vt_lightning.analysis.nest import outer_first
from vt_lightning.analysis.spans import Span, span_of
from vt_lightning.analysis.trace import Calls
from vt_lightning.analysis.usercode import parse_function
from vt_lightning.constants import PL_PROFILE_PREFIX

BREAKDOWN_PARTS = ("data_wait", "forward", "backward", "optimizer", "other")  # always reported, in order
# Reported only when some time went there (before ``other``); ``compile``: torch.compile's spans.
EXTRA_PARTS = ("hooks", "validation", "test", "predict", "compile")
EVAL_PARTS = frozenset({"validation", "test", "predict"})
ALL_PARTS = (*BREAKDOWN_PARTS[:-1], *EXTRA_PARTS, "other")

Range = tuple[float, float, str]  # start µs, end µs, part
_START, _END = itemgetter(0), itemgetter(1)

# Lightning stage (a ``[pl][profile]`` action's last dotted part) -> part.
STAGE_PARTS = {
    "train_dataloader_next": "data_wait",
    "batch_to_device": "data_wait",
    "training_step": "forward",
    "backward": "backward",
    "optimizer_step": "optimizer",
    "optimizer_zero_grad": "optimizer",
    "zero_grad": "optimizer",
    "validation_step": "validation",
    "test_step": "test",
    "predict_step": "predict",
}
# Ranges the window itself opens around work inside a training window (``ProfilingWindow.begin_range``).
WINDOW_RANGE_PARTS = {"validation": "validation"}

# A user override of a Lightning hook -> part (``on_*`` hooks: their stage's, else ``hooks``).
HOOK_PARTS = {
    "training_step": "forward",
    "backward": "backward",
    "manual_backward": "backward",
    "on_before_backward": "backward",
    "on_after_backward": "backward",
    "optimizer_step": "optimizer",
    "optimizer_zero_grad": "optimizer",
    "on_before_optimizer_step": "optimizer",
    "on_before_zero_grad": "optimizer",
    "configure_gradient_clipping": "optimizer",
    "clip_gradients": "optimizer",
    "lr_scheduler_step": "optimizer",
    "toggle_optimizer": "optimizer",
    "untoggle_optimizer": "optimizer",
    "transfer_batch_to_device": "data_wait",
    "on_before_batch_transfer": "data_wait",
    "on_after_batch_transfer": "data_wait",
    "validation_step": "validation",
    "test_step": "test",
    "predict_step": "predict",
}
_HOOK_PREFIX_PARTS = (("on_validation_", "validation"), ("on_test_", "test"), ("on_predict_", "predict"))


def hook_part(hook: str) -> str | None:
    """The part a user override of Lightning hook ``hook`` belongs to (None: no step's work)."""
    part = HOOK_PARTS.get(hook)
    if part is not None:
        return part
    for prefix, stage in _HOOK_PREFIX_PARTS:
        if hook.startswith(prefix):
            return stage
    return "hooks" if hook.startswith("on_") else None


def is_breakdown_hook(hook: str) -> bool:
    """Whether overrides of ``hook`` are worth recording for the breakdown."""
    return hook_part(hook) is not None


def _python_stage_part(name: str) -> str | None:
    """The Lightning methods that run each stage, for traces without ``[pl][profile]`` stages."""
    function, path, _ = parse_function(name)
    if not path:
        return None
    norm = path.replace("\\", "/")
    if "/lightning/pytorch/" not in norm and "/pytorch_lightning/" not in norm:
        return None
    method = function.rsplit(".", 1)[-1]
    if norm.endswith("loops/fetchers.py") and method == "__next__":
        return "data_wait"
    if "/strategies/" in norm and method in STAGE_PARTS and method not in ("optimizer_step", "zero_grad"):
        return STAGE_PARTS[method]
    if norm.endswith("core/module.py") and method in ("optimizer_step", "optimizer_zero_grad"):
        return "optimizer"
    return None


def stage_ranges(
    on_thread: Iterable[Mapping[str, Any]], calls: Calls, user_hooks: Mapping[str, str] | None = None
) -> tuple[list[Range], str, dict[str, str]]:
    """(start, end, part) ranges of the training thread, where the stages came from, and the user's hooks."""
    lightning: list[Range] = []
    window: list[Range] = []
    for event in on_thread:
        name = str(event.get("name", ""))
        if not name.startswith(PL_PROFILE_PREFIX):
            continue
        action = name[len(PL_PROFILE_PREFIX) :]
        if action in WINDOW_RANGE_PARTS:
            window.append((*span_of(event), WINDOW_RANGE_PARTS[action]))
            continue
        part = STAGE_PARTS.get(action.rsplit(".", 1)[-1])
        if part:
            lightning.append((*span_of(event), part))
    source = "lightning stage ranges" if lightning else "none"
    names = list(dict.fromkeys(calls.names))
    if not lightning:
        lightning = _calls_as_ranges(calls, {name: part for name in names if (part := _python_stage_part(name))})
        if lightning:
            # nested calls of one stage (a fetcher's ``__next__`` in another's): the outermost
            lightning = _outermost_per_part(lightning)
            source = "lightning methods (python calls)"
    own = _calls_as_ranges(calls, {name: "compile" for name in names if name.startswith(COMPILE_SPAN_PREFIX)})
    found: dict[str, str] = {}
    if user_hooks:
        hooked = {
            name: (str(hook), part) for name in names if (hook := user_hooks.get(name)) and (part := hook_part(hook))
        }
        for start, end, name in _calls_named(calls, hooked):
            hook, part = hooked[name]
            own.append((start, end, part))
            found[hook] = part
    return [*lightning, *window, *own], source, found


def _calls_named(calls: Calls, wanted: Mapping[str, Any]) -> list[tuple[float, float, str]]:
    if not wanted:
        return []
    picked = [i for i, name in enumerate(calls.names) if name in wanted]
    return list(zip(calls.starts[picked].tolist(), calls.ends[picked].tolist(), [calls.names[i] for i in picked]))


def _calls_as_ranges(calls: Calls, parts: Mapping[str, str]) -> list[Range]:
    """``(start, end, part)`` of the calls ``parts`` names, in the trace's order."""
    return [(start, end, parts[name]) for start, end, name in _calls_named(calls, parts)]


def _outermost_per_part(ranges: list[Range]) -> list[Range]:
    out: list[Range] = []
    ends: dict[str, float] = {}
    for start, end, part in outer_first(ranges, _START, _END):
        if start < ends.get(part, float("-inf")):
            continue
        ends[part] = end
        out.append((start, end, part))
    return out


def attribute_step(step: Span, ranges: Sequence[Range]) -> dict[str, float]:
    """µs of ``step`` per part, as the module docstring says."""
    lo, hi = step
    inside = [(max(s, lo), min(e, hi), part, s, e) for s, e, part in ranges if e > lo and s < hi]
    cuts = sorted({lo, hi, *(r[0] for r in inside), *(r[1] for r in inside)})
    out = dict.fromkeys(ALL_PARTS, 0.0)
    for a, b in itertools.pairwise(cuts):
        if b <= a:
            continue
        mid = (a + b) / 2
        best = None
        best_eval = None
        for cs, ce, part, s, e in inside:
            if not cs <= mid < ce:
                continue
            if best is None or (s, -e) > (best[0], -best[1]):
                best = (s, e, part)
            if part in EVAL_PARTS and (best_eval is None or (s, -e) > (best_eval[0], -best_eval[1])):
                best_eval = (s, e, part)
        chosen = best_eval or best
        out[chosen[2] if chosen else "other"] += b - a
    return reported(out)


def reported(parts_us: Mapping[str, float]) -> dict[str, float]:
    """The parts to report: the five always, the others only when time went there."""
    return {p: parts_us.get(p, 0.0) for p in ALL_PARTS if p in BREAKDOWN_PARTS or parts_us.get(p, 0.0) > 0}


OUTSIDE = "other"  # the phase of an instant outside the covered steps (the loop between them)


class PhaseSegments:
    """Segments ``[starts[i], starts[i + 1])`` of part ``parts[i]``; ``OUTSIDE`` around them."""

    __slots__ = ("parts", "starts")

    def __init__(self, starts: list[float], parts: list[str]) -> None:
        self.starts, self.parts = starts, parts

    def segments_at(self, times: np.ndarray) -> np.ndarray:
        """For each of ``times``, 1 + the index of the segment it falls in (0: before the first)."""
        return np.digitize(times, np.asarray(self.starts, dtype=float))


def phase_segments(steps: Sequence[Span], ranges: Sequence[Range]) -> PhaseSegments | None:
    """The phases over ``steps`` as the breakdown attributes them; None when no range overlaps them."""
    starts: list[float] = []
    parts: list[str] = []
    found = False

    def add(start: float, part: str) -> None:
        if parts and parts[-1] == part:
            return
        if starts and starts[-1] == start:  # an empty piece: the later one replaces it
            starts.pop()
            parts.pop()
            if parts and parts[-1] == part:
                return
        starts.append(start)
        parts.append(part)

    for lo, hi in sorted(steps):
        inside = [r for r in ranges if r[1] > lo and r[0] < hi]
        found = found or bool(inside)
        cuts = sorted({lo, hi, *(max(r[0], lo) for r in inside), *(min(r[1], hi) for r in inside)})
        for a, b in itertools.pairwise(cuts):
            us = attribute_step((a, b), inside)
            add(a, max(us, key=us.__getitem__))  # the one part the piece went to
        add(hi, OUTSIDE)
    return PhaseSegments(starts, parts) if found else None
