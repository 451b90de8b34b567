"""Which recorded Python calls a window's trace keeps: the user's filters (their meaning is
docs/options.md's), and never our own frames or their callees. VizTracer's own filters would drop
the whole subtree under a filtered frame (Lightning reaches ``training_step`` through ~20 frames),
so it records unfiltered and the writer filters here. torch's events are never filtered."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from vt_lightning.analysis.nest import outer_first, walk
from vt_lightning.analysis.trace import Thread
from vt_lightning.analysis.usercode import PACKAGE_ROOT, framework_dirs, library_roots

# VizTracer names a Python call "<qualname> (<file>:<first line>)"; C calls have no location.
_TS = itemgetter("ts")
_NAME = itemgetter("name")
_LOCATION = re.compile(r" \((.*):(\d+)\)$")

# LightningModule methods Lightning calls itself (hooks): each counts as depth 1 of the user's code.
LIGHTNING_MODULE_HOOKS = (
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "forward",
    "backward",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_optimizers",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "configure_callbacks",
    "configure_model",
    "configure_sharded_model",
    "transfer_batch_to_device",
    "setup",
    "teardown",
    "prepare_data",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
)


def module_hook_locations(module: Any) -> frozenset[tuple[str, int]]:
    """(file, first line) of the LightningModule hooks ``module``'s class overrides (Lightning's own left
    out: its ``optimizer_step`` calls ``training_step``, which must stay depth 1)."""
    lightning_dirs = framework_dirs("lightning", "pytorch_lightning", "lightning_fabric")
    found = set()
    for name in LIGHTNING_MODULE_HOOKS:
        function = getattr(type(module), name, None)
        code = getattr(function, "__code__", None)
        if code is not None and not code.co_filename.startswith(lightning_dirs):
            found.add((code.co_filename, code.co_firstlineno))
    return frozenset(found)


def path_prefixes(paths: Iterable[str]) -> tuple[str, ...]:
    """Directory-aware prefixes: ``/a/proj`` matches ``/a/proj/x.py`` but not ``/a/project2/x.py``."""
    out = set()
    for path in paths:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            out.add(variant if not os.path.isdir(variant) else variant.rstrip(os.sep) + os.sep)
    return tuple(sorted(out))


def path_matches_anything(path: str) -> bool:
    """True if ``path`` names an existing file or directory (what the filters match against)."""
    return os.path.exists(os.path.abspath(path))


def _under(file: str, prefixes: tuple[str, ...]) -> bool:
    for prefix in prefixes:
        if prefix.endswith(os.sep):
            if file.startswith(prefix):
                return True
        elif file == prefix or file.startswith(prefix + os.sep):
            return True
    return False


def _DUR_OR_ZERO(event: dict[str, Any]) -> Any:
    return event.get("dur", 0.0)  # a "B" event has none


@dataclass(frozen=True)
class PythonFilter:
    """What the writer keeps of VizTracer's events (picklable: it travels to the writer process)."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    max_depth: int = -1
    hook_locations: frozenset[tuple[str, int]] = frozenset()
    library: tuple[str, ...] = field(default_factory=library_roots)
    own: tuple[str, ...] = (PACKAGE_ROOT + os.sep,)

    @property
    def user_filters(self) -> bool:
        return self.include is not None or self.exclude is not None or self.max_depth >= 0


def _name_facts(rules: PythonFilter, name: str) -> tuple[bool, bool, bool, bool, bool]:
    """What a call's name decides: has a location, is ours, starts user code, included, excluded."""
    match = _LOCATION.search(name)
    if match is None:  # a C call: judged by its caller
        return (False, False, False, False, False)
    file = match.group(1)
    own = _under(file, rules.own)
    anchor = not own and (
        (file, int(match.group(2))) in rules.hook_locations or not (file.startswith("<") or _under(file, rules.library))
    )
    return (
        True,
        own,
        anchor,
        rules.include is not None and _under(file, rules.include),
        rules.exclude is not None and _under(file, rules.exclude),
    )


def keeps_whole(rules: PythonFilter, names: Iterable[Any]) -> bool:
    """Whether a thread of calls of these names is kept whole: no user filter, none of them ours."""
    if rules.user_filters:
        return False
    return all(name.__class__ is str and not _name_facts(rules, name)[1] for name in names)


@dataclass
class FilterStats:
    kept: int = 0
    own: int = 0  # vt_lightning's calls and what they called
    filtered: int = 0  # dropped by include_files / exclude_files / max_stack_depth

    def as_dict(self) -> dict[str, int]:
        return {"kept": self.kept, "dropped_own": self.own, "dropped_by_filters": self.filtered}


def filter_python_events(
    events: list[dict[str, Any]],
    rules: PythonFilter,
    grouped: tuple[Mapping[Thread, list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    ordered: Mapping[Thread, set[Any]] | None = None,
) -> tuple[list[dict[str, Any]], dict[Thread, list[dict[str, Any]]], FilterStats]:
    """Keep the calls ``rules`` select; other events pass. Returns them, each thread's kept calls (outer
    first) and what went. ``grouped``: more events, grouped as here; ``ordered``: their threads' names."""
    by_thread: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
    others: list[dict[str, Any]] = []
    for event in events:
        get = event.get
        if get("ph") in ("X", "B") and "ts" in event:
            by_thread[(get("pid"), get("tid"))].append(event)
        else:
            others.append(event)
    if grouped is not None:  # as if they followed ``events``
        more_calls, more_others = grouped
        for key, thread_events in more_calls.items():
            by_thread[key].extend(thread_events)
        others.extend(more_others)
    # name -> (has a location, ours, starts the user's code, under include_files, under exclude_files)
    facts: dict[str, tuple[bool, bool, bool, bool, bool]] = {}
    include, exclude, max_depth = rules.include, rules.exclude, rules.max_depth
    out: dict[Thread, list[dict[str, Any]]] = {}
    own_count = filtered = 0
    select = rules.user_filters
    placed = ordered if ordered is not None and grouped is not None else {}
    for key, unordered in by_thread.items():
        names = placed.get(key)
        if names is not None and len(unordered) == len(grouped[0][key]):  # type: ignore[index]
            calls = unordered  # a worker's thread alone, outer first as placed
        else:
            names = None
            calls = outer_first(unordered, _TS, _DUR_OR_ZERO)  # by (ts, -dur)
        if not select:  # only vt_lightning's own calls go: a thread with none of them is kept whole
            if names is None:
                try:
                    names = set(map(_NAME, unordered))  # at C speed, in memory order
                except KeyError:
                    names = {event.get("name", "") for event in unordered}
            if not any((facts.get(n) or facts.setdefault(n, _name_facts(rules, n)))[1] for n in names):
                out[key] = calls
                continue
        starts = [float(event["ts"]) for event in calls]
        parents, _ = walk(starts, [start + float(event.get("dur", 0.0)) for start, event in zip(starts, calls)])
        # per call, as its callees inherit them: ours, depth (-1: outside the user's code), included, excluded
        inherited: list[tuple[bool, int, bool, bool]] = []
        kept: list[dict[str, Any]] = []
        for event, parent in zip(calls, parents):
            name = event.get("name", "")
            known = facts.get(name)
            if known is None:
                known = facts[name] = _name_facts(rules, name)
            located, own, anchor, included, excluded = known
            if parent >= 0:
                parent_own, parent_depth, parent_included, parent_excluded = inherited[parent]
                own = own or parent_own
                if not located:
                    included, excluded = parent_included, parent_excluded
                depth = parent_depth + 1 if parent_depth >= 0 else (1 if anchor else -1)
            else:
                depth = 1 if anchor else -1
            inherited.append((own, depth, included, excluded))
            if own:
                own_count += 1
            elif (
                (include is not None and not included)
                or (exclude is not None and excluded)
                or (max_depth >= 0 and depth > max_depth)
            ):
                filtered += 1
            else:
                kept.append(event)
        if kept:
            out[key] = kept
    stats = FilterStats(sum(map(len, out.values())), own_count, filtered)
    return others, out, stats
