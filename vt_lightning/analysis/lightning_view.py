"""The "Lightning" view of torch-tb-profiler 0.4.3, written into a window's trace. Pure.

The plugin builds it only from ``cpu_op`` events and with ``"Framework": "pytorch-lightning"``;
the ranges (``recording/lightning_hooks.py``) are exported as ``user_annotation``. Its pitfalls:
``Framework`` hides torch's own Module view (set only when a module event is kept); a
``[pl][module]`` range that partially overlaps another on its thread is no node of its tree and
fails the whole file (such ranges stay ``user_annotation``); its timeline fails without a
``[pl][profile]`` range (one per step is added); ``gpu_user_annotation`` events stay as they are."""

from __future__ import annotations

from collections import defaultdict
from operator import itemgetter
from typing import Any

from vt_lightning.analysis.nest import SKIP, outer_first, walk
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.constants import (
    CPU_OP_CATEGORY,
    FRAMEWORK_KEY,
    FRAMEWORK_LIGHTNING,
    PL_MODULE_PREFIX,
    PL_PROFILE_PREFIX,
    PYTHON_CATEGORY,
    STEP_PREFIX,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)

# Lightning's main step stages: a range per other action and batch costs more than it tells.
MAIN_STAGES = frozenset(
    {
        "run_training_batch",
        "training_step",
        "backward",
        "optimizer_step",
        "optimizer_zero_grad",
        "zero_grad",
        "train_dataloader_next",
        "batch_to_device",
        "validation_step",
        "run_optimization",
        "test_step",
        "predict_step",
    }
)


def is_main_stage(action_name: str) -> bool:
    """``[Strategy]DDPStrategy.backward`` -> True; ``[Callback]X.on_train_batch_end`` -> False."""
    if action_name.startswith("[Callback]"):
        return False
    return action_name.rsplit(".", 1)[-1] in MAIN_STAGES


_START, _END = itemgetter(0), itemgetter(1)
# Categories whose X events the plugin puts in its per-thread operator list (besides ours).
_TREE_CATEGORIES = frozenset({CPU_OP_CATEGORY, "operator", "python"})
_COMM_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)


def module_record_name(module: Any, path: str) -> str:
    """``[pl][module]<module>.<Type>: <path>`` — the form Lightning's own profiler writes."""
    cls = type(module)
    return f"{PL_MODULE_PREFIX}{cls.__module__}.{cls.__name__}: {path}"


def profile_record_name(action_name: str) -> str:
    return f"{PL_PROFILE_PREFIX}{action_name}"


def _is_pl_candidate(event: dict[str, Any], prefix: str) -> bool:
    if event.get("ph") != "X":
        return False
    name = event.get("name")
    if not isinstance(name, str) or not name.startswith(prefix):
        return False
    return event.get("cat") in (USER_ANNOTATION_CATEGORY, CPU_OP_CATEGORY)


def _tid_key(tid: Any) -> Any:
    try:
        return int(tid)
    except (TypeError, ValueError):
        return tid


def _in_plugin_tree(event: dict[str, Any]) -> bool:
    """Would the plugin (Lightning mode) put this X event in its per-thread operator list?"""
    if event.get("ph") != "X":
        return False
    cat = event.get("cat")
    if not isinstance(cat, str):
        return False
    cat = cat.lower()
    name = event.get("name")
    if cat in _TREE_CATEGORIES:
        return not (isinstance(name, str) and name.startswith(PL_PROFILE_PREFIX))
    if cat == USER_ANNOTATION_CATEGORY:
        return isinstance(name, str) and (name.startswith(STEP_PREFIX) or name in _COMM_NAMES)
    return False


def _rejected_module_events(tree_events: list[dict[str, Any]], modules: set[int]) -> set[int]:
    """Replay the plugin's tree building: ids of the module events that lose a node."""
    bad: set[int] = set()
    by_tid: dict[Any, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for event in tree_events:
        start = float(event["ts"])
        by_tid[_tid_key(event.get("tid"))].append((start, start + float(event.get("dur", 0) or 0), event))
    for found in by_tid.values():
        if not any(id(e) in modules for _, _, e in found):
            continue
        items = outer_first(found, _START, _END)

        def partial_overlap(
            i: int, tail: int, _: float, items: list[tuple[float, float, dict[str, Any]]] = items
        ) -> str:
            event, open_event = items[i][2], items[tail][2]
            if id(event) in modules:
                bad.add(id(event))
            elif id(open_event) in modules:
                bad.add(id(open_event))
            return SKIP

        walk([item[0] for item in items], [item[1] for item in items], crossing=partial_overlap)
    return bad


def apply_lightning_view(trace: WindowTrace) -> dict[str, int]:
    """Make the plugin offer the Lightning view, in place (counts returned, kept in the metadata); nothing
    changes when no module range survives."""
    events = trace.other_events()
    modules: list[dict[str, Any]] = []
    stages: list[dict[str, Any]] = []
    tree_events: list[dict[str, Any]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("cat") == PYTHON_CATEGORY:
            continue
        module = _is_pl_candidate(e, PL_MODULE_PREFIX)
        if module:
            modules.append(e)
        elif _is_pl_candidate(e, PL_PROFILE_PREFIX):
            stages.append(e)
        if "ts" in e and (module or _in_plugin_tree(e)):
            tree_events.append(e)
    summary = {"modules": 0, "stages": 0, "demoted": 0, "synthesized_stages": 0, "framework": 0}

    kept = {id(e) for e in modules}
    if kept:
        for _ in range(16):
            bad = _rejected_module_events(tree_events, kept)
            if not bad:
                break
            kept -= bad
            tree_events = [e for e in tree_events if id(e) not in bad]
        else:
            kept = set()  # pathological: give up on the view rather than risk the file
    summary["demoted"] = len(modules) - len(kept)

    if kept:
        for event in modules:
            event["cat"] = CPU_OP_CATEGORY if id(event) in kept else USER_ANNOTATION_CATEGORY
        for event in stages:
            event["cat"] = CPU_OP_CATEGORY
        if not stages:
            steps = [
                e
                for e in events
                if isinstance(e, dict)
                and e.get("ph") == "X"
                and isinstance(e.get("name"), str)
                and e["name"].startswith(STEP_PREFIX)
            ]
            synthesized = [
                {
                    "ph": "X",
                    "cat": CPU_OP_CATEGORY,
                    "name": profile_record_name(e["name"]),
                    "pid": e.get("pid"),
                    "tid": e.get("tid"),
                    "ts": e.get("ts"),
                    "dur": e.get("dur", 0),
                    "args": {"vt_lightning": "step range added for the Lightning view"},
                }
                for e in steps
            ]
            trace.add(synthesized)
            summary["synthesized_stages"] = len(synthesized)
        summary["modules"] = len(kept)
        summary["stages"] = len(stages)
        summary["framework"] = 1
        trace.header[FRAMEWORK_KEY] = FRAMEWORK_LIGHTNING

    meta = trace.header.get(TRACE_METADATA_KEY)
    if isinstance(meta, dict):
        meta["lightning_view"] = dict(summary)
    return summary
