"""Where did the step go? One window's summary, from its merged trace. Pure; runs in the writer.

Every per-step number covers the same steps (``covers.steps``): all but the first, which misses its
batch's fetch (later steps open at the previous batch's end, as torch's ``profile.step()`` does).
``totals`` beside each top list let ``diff`` tell "below the threshold" from "absent"."""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from vt_lightning.analysis.breakdown import BREAKDOWN_PARTS as BREAKDOWN_PARTS  # re-exported
from vt_lightning.analysis.breakdown import PhaseSegments, attribute_step, phase_segments, reported
from vt_lightning.analysis.compile import compile_summary, named_graph_ops
from vt_lightning.analysis.nest import Nest
from vt_lightning.analysis.python_tables import (
    FOLDED_ORIGINS,
    GENERATED_PACKAGE,
    PythonStats,
    Stat,
    Thread,
    ThreadStats,
    python_stats_of,
)
from vt_lightning.analysis.schema import (
    SCHEMA_VERSION,
    KernelsByOp,
    PythonEntry,
    Summary,
    TopOps,
    TopPython,
    Totals,
)
from vt_lightning.analysis.spans import Span
from vt_lightning.analysis.spans import ms as _ms
from vt_lightning.analysis.spans import percentile as _percentile
from vt_lightning.analysis.spans import span_of as _span
from vt_lightning.analysis.steps import WindowData, observer, read_window
from vt_lightning.analysis.summary_devices import KERNEL_CATEGORIES, gpu_summary, memory_summary
from vt_lightning.analysis.trace import Calls, WindowTrace
from vt_lightning.analysis.usercode import FRAMEWORKS, GENERATED, MODEL_LIBRARIES
from vt_lightning.analysis.verdicts import find_verdicts
from vt_lightning.constants import ANNOTATION_PREFIXES, CPU_OP_CATEGORY, UNTRACED_WAIT_KEY

TOP_PYTHON = 10  # entries per list, user code first
TOP_UNFOLDED = 3  # package functions this high in a ranking keep their own line
TOP_OPS = 10
TOTALS_MIN_US = 1.0  # per step: ``totals`` list everything at least this long...
TOTALS_MAX = 200  # ...up to about this many entries (the threshold rises to keep the file small)
# Folded even when they rank high: the frameworks' frames sit around every step at ~100 % inclusive.
ALWAYS_FOLDED = frozenset({*FRAMEWORKS, GENERATED_PACKAGE})
COVERED_KEYS = ["step_ms", "breakdown_ms", "top_python", "top_ops"]


def _clipped(start: float, end: float, region: Span | None) -> Span | None:
    """``(start, end)`` within ``region`` (None: outside it); no region keeps everything."""
    if region is None:
        return start, end
    lo, hi = region
    if end <= lo or start >= hi:
        return None
    return max(start, lo), min(end, hi)


def name_hash(name: str) -> str:
    """The 8-hex crc32 ``totals.below`` lists for a name under the threshold: with it, ``diff`` tells
    "under the threshold" from "only in the other" (a collision errs towards "under", never "only in")."""
    return f"{zlib.crc32(name.encode('utf-8', 'surrogatepass')):08x}"


def totals(values_us: Mapping[str, float], steps: int) -> Totals:
    """Every entry whose per-step value is at least the threshold, and the rest as one bucket."""
    per_step = sorted(((k, v / steps) for k, v in values_us.items()), key=lambda kv: kv[1], reverse=True)
    threshold = TOTALS_MIN_US
    if len(per_step) > TOTALS_MAX:
        threshold = max(threshold, per_step[TOTALS_MAX - 1][1])
    rest = [(k, v) for k, v in per_step if v < threshold]
    return {
        "threshold_ms": _ms(threshold),
        "ms": {k: _ms(v) for k, v in per_step if v >= threshold},
        "other_ms": _ms(sum(v for _, v in rest)),
        "other_count": len(rest),
        "below": sorted({name_hash(k) for k, _ in rest}),
    }


def trace_bounds(rest: Sequence[Mapping[str, Any]], calls: Iterable[Calls]) -> list[float] | None:
    """``[first start, last end]`` of a trace's timed events (µs): where a viewer's range must stay."""
    starts = [float(e["ts"]) for e in rest if "ts" in e]
    ends = [float(e["ts"]) + float(e.get("dur", 0.0) or 0.0) for e in rest if "ts" in e]
    for c in calls:
        if len(c.starts):
            starts.append(float(c.starts.min()))
            ends.append(float(c.ends.max()))
    return [round(min(starts), 3), round(max(ends), 3)] if starts else None


def function_key(entry: Mapping[str, Any]) -> str:
    """How ``diff`` names a function: ``"Model.forward (/src/model.py:12)"``, or a C function's name."""
    if entry.get("file"):
        return f"{entry['function']} ({entry['file']}:{entry.get('line')})"
    return str(entry.get("function"))


def _entry(meta: Mapping[str, Any], stat: Stat, steps: int, folded: int = 0) -> PythonEntry:
    return {
        "function": meta["function"],
        "file": meta["file"],
        "line": meta["line"],
        "origin": meta["origin"],
        "package": meta["package"],
        "folded": folded,
        "calls": stat.calls,
        "calls_per_step": round(stat.calls / steps, 3),
        "self_ms": _ms(stat.self_us / steps),
        "inclusive_ms": _ms(stat.inclusive_us / steps),
    }


def folded_name(package: str, phase: str) -> str:
    """A folded line's name: ``"lightning · optimizer (folded)"``, ``"torch (folded)"`` without phases."""
    return f"{package} · {phase.replace('_', ' ')} (folded)" if phase else f"{package} (folded)"


def _top_python_of(
    calls: Mapping[Thread, Calls],
    steps: int,
    region: Span | None,
    phases: PhaseSegments | None,
    command: Container[str],
) -> TopPython:
    """Top functions per step of ``region``: the user's first, a model library's, then the rest folded."""
    stats = python_stats_of(calls, region, phases, command)
    return rank_python(stats, stats.merged(), steps)


def rank_python(stats: PythonStats, tables: ThreadStats, steps: int, limit: int = TOP_PYTHON) -> TopPython:
    """``top_python``'s rankings of ``tables`` (``stats.merged`` of some of its threads)."""
    functions, packages = tables
    info = stats.info
    steps = max(steps, 1)

    def ranking(metric: str, by: Callable[[PythonEntry], float]) -> list[PythonEntry]:
        ranked = sorted(functions, key=lambda n: getattr(functions[n], metric), reverse=True)
        keep_whole = set(ranked[:TOP_UNFOLDED])
        user: list[PythonEntry] = []
        model: list[PythonEntry] = []  # a model library's functions (usercode.MODEL_LIBRARIES)
        other: list[PythonEntry] = []
        folded_packages: set[str] = set()
        for name in ranked:
            meta = info[name]
            if meta["origin"] == "user":
                user.append(_entry(meta, functions[name], steps))
            elif meta["package"] in MODEL_LIBRARIES:
                model.append(_entry(meta, functions[name], steps))
            elif meta["origin"] in FOLDED_ORIGINS and (name not in keep_whole or meta["package"] in ALWAYS_FOLDED):
                folded_packages.add(meta["package"])
            else:
                other.append(_entry(meta, functions[name], steps))
        for (package, phase), stat in packages.items():
            if package in folded_packages:
                fold = {
                    "function": folded_name(package, phase),
                    "file": None,
                    "line": None,
                    "origin": GENERATED if package == GENERATED_PACKAGE else "package",
                    "package": package,
                }
                other.append(_entry(fold, stat, steps, len(stat.functions)))
        other.sort(key=by, reverse=True)
        user = [e for e in user if by(e) > 0][: limit // 2]
        model = [e for e in model if by(e) > 0][: limit - len(user)]
        return user + model + other[: limit - len(user) - len(model)]

    self_us: dict[str, float] = defaultdict(float)
    for name, stat in functions.items():
        self_us[function_key(info[name])] += stat.self_us
    return TopPython(
        by_self=ranking("self_us", lambda e: e["self_ms"]),
        by_inclusive=ranking("inclusive_us", lambda e: e["inclusive_ms"]),
        totals=totals(self_us, steps),
    )


def _is_op(event: Mapping[str, Any]) -> bool:
    return event.get("cat") == CPU_OP_CATEGORY and not str(event.get("name", "")).startswith(ANNOTATION_PREFIXES)


def top_ops(
    events: Sequence[Mapping[str, Any]],
    steps: int,
    launches: Mapping[Any, Any],
    limit: int = TOP_OPS,
    region: Span | None = None,
) -> TopOps:
    """Ops by CPU time per step of ``region``, ``totals``, and on CUDA the kernel time they launched."""
    steps = max(steps, 1)
    by_thread: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for event in events:
        if event.get("cat") == CPU_OP_CATEGORY and _is_op(event):  # the category first: most events are calls
            kept = _clipped(*_span(event), region)
            if kept is not None:
                by_thread[(event.get("pid"), event.get("tid"))].append((*kept, str(event["name"])))
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, total, self
    op_spans: dict[Any, tuple[list[float], list[tuple[float, float, str]]]] = {}
    for thread, found in by_thread.items():
        # an op's time is its own, even past its parent's end
        nest = Nest([op[0] for op in found], [op[1] for op in found], clip=False)
        ops = [found[i] for i in nest.order.tolist()]
        lengths = nest.lengths.tolist()
        for (_, _, name), dur in zip(ops, lengths):
            stat = stats[name]
            stat[0] += 1
            stat[1] += dur
        inner = nest.parents >= 0
        children = np.bincount(nest.parents[inner], weights=nest.lengths[inner], minlength=len(ops))
        own = np.maximum(nest.lengths - children, 0.0).tolist()
        for done in nest.closing.tolist():
            stats[ops[done][2]][2] += own[done]
        op_spans[thread] = ([o[0] for o in ops], ops)
    by_cpu = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:limit]
    out: TopOps = {
        "by_cpu": [
            {
                "name": name,
                "calls": int(s[0]),
                "calls_per_step": round(s[0] / steps, 3),
                "self_cpu_ms": _ms(s[2] / steps),
                "cpu_ms": _ms(s[1] / steps),
            }
            for name, s in by_cpu
        ],
        "totals": totals({name: s[2] for name, s in stats.items()}, steps),
    }
    kernels = []
    for kernel in events:
        if kernel.get("cat") not in KERNEL_CATEGORIES:
            continue
        launch = launches.get((kernel.get("args") or {}).get("correlation"))
        launched = float((launch if launch is not None else kernel)["ts"])
        if region is None or region[0] <= launched < region[1]:
            kernels.append((kernel, launch))
    if kernels:
        out["by_kernel"] = _ops_by_kernel(kernels, op_spans, steps, limit)
        kernel_names: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for kernel, _ in kernels:
            kernel_names[str(kernel.get("name"))][0] += 1
            kernel_names[str(kernel.get("name"))][1] += float(kernel.get("dur", 0.0))
        out["kernels"] = [
            {"name": name, "calls": int(s[0]), "kernel_ms": _ms(s[1] / steps)}
            for name, s in sorted(kernel_names.items(), key=lambda kv: kv[1][1], reverse=True)[:limit]
        ]
    return out


def _ops_by_kernel(
    kernels: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    op_spans: Mapping[Any, tuple[list[float], list[tuple[float, float, str]]]],
    steps: int,
    limit: int,
) -> list[KernelsByOp]:
    """Kernel time per op: kernel -> its launch (same ``correlation``) -> innermost op around it."""
    per_op: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kernel, launch in kernels:
        name = "(no launching op)"
        if launch is not None:
            starts, ops = op_spans.get((launch.get("pid"), launch.get("tid")), ([], []))
            ts = float(launch["ts"])
            for i in range(bisect_right(starts, ts) - 1, -1, -1):  # the innermost op around it
                start, end, op = ops[i]
                if start <= ts < end:
                    name = op
                    break
        per_op[name][0] += 1
        per_op[name][1] += float(kernel.get("dur", 0.0))
    ranked = sorted(per_op.items(), key=lambda kv: kv[1][1], reverse=True)[:limit]
    return [{"name": name, "kernels": int(s[0]), "kernel_ms": _ms(s[1] / steps)} for name, s in ranked]


def summarize(
    trace: WindowTrace | Mapping[str, Any],
    memory_snapshot: Mapping[str, Any] | None = None,
    window: WindowData | None = None,
) -> Summary:
    """One window's summary (``trace`` typed or read back; ``window``: its ``read_window``, if read)."""
    data = read_window(trace) if window is None else window
    meta, rest, steps, thread, ranges = data.meta, data.rest, data.steps, data.thread, data.ranges
    recorded = list(steps)
    counted = data.counted  # the first step misses its fetch
    per_step: dict[int, float] = {n: steps[n][1] - steps[n][0] for n in recorded}
    parts: dict[str, float] = defaultdict(float)
    for n in counted:
        for part, us in attribute_step(steps[n], ranges).items():
            parts[part] += us
    durations = [per_step[n] for n in counted]
    count = max(len(counted), 1)
    span = (steps[recorded[0]][0], steps[recorded[-1]][1]) if recorded else (0.0, 0.0)
    region = (steps[counted[0]][0], steps[counted[-1]][1]) if counted else None
    summary: Summary = {
        "schema": SCHEMA_VERSION,
        "window": {
            "index": meta.get("window"),
            "worker": meta.get("worker"),
            "span": meta.get("span"),
            "global_rank": meta.get("global_rank"),
            "log_step": meta.get("log_step"),
            "partial": bool(meta.get("partial", False)),
            "overflow": bool(meta.get("overflow", False)),
            "device": "cuda" if any(e.get("cat") in KERNEL_CATEGORIES for e in rest) else "cpu",
        },
        "covers": {"steps": counted, "keys": list(COVERED_KEYS)},
        "steps": {
            "recorded": recorded,
            "counted": counted,
            "ms": {str(n): _ms(per_step[n]) for n in recorded},
            "bounds_us": {str(n): [round(steps[n][0], 3), round(steps[n][1], 3)] for n in recorded},
            "trace_us": trace_bounds(rest, data.python_calls.values()),
            "breakdown_source": data.breakdown_source,
            "user_hooks": data.user_hooks,
        },
        "step_ms": {
            "min": _ms(min(durations)) if durations else None,
            "mean": _ms(sum(durations) / count) if durations else None,
            "p50": _ms(_percentile(durations, 0.5)) if durations else None,
            "max": _ms(max(durations)) if durations else None,
        },
        "breakdown_ms": {part: _ms(us / count) for part, us in reported(parts).items()},
        # the training thread's calls: a background thread's waits are no step's time
        "top_python": _top_python_of(
            {t: c for t, c in data.python_calls.items() if thread is None or t == thread},
            len(counted),
            region,
            phase_segments([steps[n] for n in counted], ranges),
            data.command,
        ),
        "top_ops": top_ops(rest, len(counted), region=region, launches=data.launches),
        "gpu": gpu_summary(
            rest, span, (data.python_calls.get(thread) if thread else None) or Calls.of([]), data.command
        )
        if recorded
        else None,
        "memory": memory_summary(data.memory, memory_snapshot),
        "compile": compile_summary(meta.get("compile"), rest, steps, data.python_calls),
    }
    compiled = summary["compile"]
    summary["top_ops"] = named_graph_ops(summary["top_ops"], (compiled.get("graphs") if compiled else None) or [])
    summary["observer"] = observer(meta.get(UNTRACED_WAIT_KEY), summary["step_ms"]["p50"])
    summary["verdicts"] = find_verdicts(data, summary, memory_snapshot)
    return summary
