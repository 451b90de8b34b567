"""Where did the step go? One window's summary, computed from its merged trace dict.

Pure: a merged trace (and, optionally, its memory snapshot) in, a JSON-ready dict out. Runs in the
writer process (``finish.finish_window``), never on the training thread. The dict's layout is the
stable, versioned schema documented in docs/files.md; ``SCHEMA_VERSION`` changes whenever a key
changes meaning or disappears (new keys may be added within a version).

Sources, all from the one calibrated timeline:

* **steps**: torch's ``ProfilerStep#N`` ranges on the training thread. A window's first step is
  opened at its ``on_train_batch_start``, after its batch was fetched; every later step is opened at
  the previous batch's end and so includes its fetch, as torch's own ``profile.step()`` does. Step
  times and the breakdown are therefore averaged over the steps that include their fetch
  (``steps.counted``), unless the window has only one step.
* **breakdown**: Lightning's ``[pl][profile]`` stage ranges (``lightning_view=True``), else the
  Lightning methods that run those stages, from the Python calls. Each instant of a step goes to the
  innermost stage range covering it (``optimizer_step`` wraps the closure that runs
  ``training_step`` and ``backward``); what no stage covers is ``other``.
* **top_python**: VizTracer's calls (``cat == "FEE"``), self and inclusive time per function.
* **top_ops**: torch's ``cpu_op`` events (annotations excluded); on CUDA, kernel time per launching op.
* **gpu**: the union of kernel time over the window's steps, and the largest gaps in it with the
  Python call the training thread was in meanwhile.
* **memory**: torch's ``[memory]`` events (``Total Allocated`` / ``Total Reserved``) and, for
  allocation sites, the memory snapshot's ``device_traces`` frames.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vt_lightning.analysis.schema import SCHEMA_VERSION, KernelsByOp, PythonEntry, Summary, TopOps, TopPython
from vt_lightning.analysis.spans import Span
from vt_lightning.analysis.spans import ms as _ms
from vt_lightning.analysis.spans import percentile as _percentile
from vt_lightning.analysis.spans import span_of as _span
from vt_lightning.analysis.spans import x_events as _x_events
from vt_lightning.analysis.summary_devices import KERNEL_CATEGORIES, RUNTIME_CATEGORIES, gpu_summary, memory_summary
from vt_lightning.analysis.usercode import code_origin, parse_function
from vt_lightning.constants import PL_PREFIX, PL_PROFILE_PREFIX, PYTHON_CATEGORY, STEP_PREFIX, TRACE_METADATA_KEY

BREAKDOWN_PARTS = ("data_wait", "forward", "backward", "optimizer", "other")
ANNOTATION_PREFIXES = (PL_PREFIX, STEP_PREFIX, TRACE_METADATA_KEY)
TOP_PYTHON = 10  # entries per list, user code first
TOP_UNFOLDED = 3  # package functions this high in a ranking keep their own line
TOP_OPS = 10

# Lightning stage (the action's last dotted part) -> breakdown part.
_STAGE_PARTS = {
    "train_dataloader_next": "data_wait",
    "training_step": "forward",
    "backward": "backward",
    "optimizer_step": "optimizer",
    "optimizer_zero_grad": "optimizer",
    "zero_grad": "optimizer",
}


def _step_number(name: str) -> int | None:
    if not name.startswith(STEP_PREFIX):
        return None
    try:
        return int(name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def find_steps(events: Iterable[Mapping[str, Any]]) -> tuple[dict[int, Span], Any]:
    """``{step: (start, end)}`` from ``ProfilerStep#N`` ranges, and the (pid, tid) they are on."""
    steps: dict[int, Span] = {}
    thread = None
    for event in events:
        number = _step_number(str(event.get("name", "")))
        if number is None or event.get("cat") not in ("user_annotation", "cpu_op"):
            continue
        steps[number] = _span(event)
        thread = (event.get("pid"), event.get("tid"))
    return dict(sorted(steps.items())), thread


# --------------------------------------------------------------------------------------------------
# Breakdown
# --------------------------------------------------------------------------------------------------


def _stage_part(action: str) -> str | None:
    return _STAGE_PARTS.get(action.rsplit(".", 1)[-1])


def _python_stage_part(name: str) -> str | None:
    """The Lightning methods that run each stage, for traces without ``[pl][profile]`` ranges."""
    function, path, _ = parse_function(name)
    if not path:
        return None
    norm = path.replace("\\", "/")
    if "/lightning/pytorch/" not in norm and "/pytorch_lightning/" not in norm:
        return None
    method = function.rsplit(".", 1)[-1]
    if norm.endswith("loops/fetchers.py") and method == "__next__":
        return "data_wait"
    if "/strategies/" in norm and method in ("training_step", "backward"):
        return _STAGE_PARTS[method]
    if norm.endswith("core/module.py") and method in ("optimizer_step", "optimizer_zero_grad"):
        return "optimizer"
    return None


def stage_ranges(events: Sequence[Mapping[str, Any]], thread: Any) -> tuple[list[tuple[float, float, str]], str]:
    """(start, end, part) ranges on the training thread, and where they came from."""
    ranges: list[tuple[float, float, str]] = []
    for event in events:
        name = str(event.get("name", ""))
        if name.startswith(PL_PROFILE_PREFIX) and (event.get("pid"), event.get("tid")) == thread:
            part = _stage_part(name[len(PL_PROFILE_PREFIX) :])
            if part:
                ranges.append((*_span(event), part))
    if ranges:
        return ranges, "lightning stage ranges"
    for event in events:
        if event.get("cat") == PYTHON_CATEGORY and (event.get("pid"), event.get("tid")) == thread:
            part = _python_stage_part(str(event.get("name", "")))
            if part:
                ranges.append((*_span(event), part))
    if ranges:
        # Nested calls of one stage (``_PrefetchDataFetcher.__next__`` calls ``_DataFetcher.__next__``)
        # are the same stage: keep the outermost.
        return _outermost_per_part(ranges), "lightning methods (python calls)"
    return [], "none"


def _outermost_per_part(ranges: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    out: list[tuple[float, float, str]] = []
    ends: dict[str, float] = {}
    for start, end, part in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if start < ends.get(part, float("-inf")):
            continue
        ends[part] = end
        out.append((start, end, part))
    return out


def attribute_step(step: Span, ranges: Sequence[tuple[float, float, str]]) -> dict[str, float]:
    """Microseconds of ``step`` per part: each instant goes to the innermost range covering it."""
    lo, hi = step
    inside = [(max(s, lo), min(e, hi), part, s, e) for s, e, part in ranges if e > lo and s < hi]
    cuts = sorted({lo, hi, *(r[0] for r in inside), *(r[1] for r in inside)})
    out = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    for a, b in itertools.pairwise(cuts):
        if b <= a:
            continue
        mid = (a + b) / 2
        best = None
        for cs, ce, part, s, e in inside:
            if cs <= mid < ce and (best is None or (s, -e) > (best[0], -best[1])):
                best = (s, e, part)
        out[best[2] if best else "other"] += b - a
    return out


# --------------------------------------------------------------------------------------------------
# Python functions
# --------------------------------------------------------------------------------------------------


class _Stat:
    __slots__ = ("calls", "functions", "inclusive_us", "self_us")

    def __init__(self) -> None:
        self.calls = 0
        self.self_us = 0.0
        self.inclusive_us = 0.0
        self.functions: set[str] = set()


def python_stats(events: Sequence[Mapping[str, Any]]) -> tuple[dict[str, _Stat], dict[str, _Stat], dict[str, dict]]:
    """Per function and per package: calls, self time, inclusive time (a recursive call or a call
    under another call of the same package is counted once). One sort and one stack sweep per
    thread; runs once per Python event, so it is written for speed."""
    by_thread: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for event in events:
        if event.get("cat") == PYTHON_CATEGORY:
            start = float(event["ts"])
            by_thread[(event.get("pid"), event.get("tid"))].append(
                (start, start + float(event.get("dur", 0.0) or 0.0), event.get("name", ""))
            )
    functions: dict[str, _Stat] = {}
    packages: dict[str, _Stat] = {}
    info: dict[str, dict] = {}
    package_of: dict[str, str] = {}  # function name -> "package:<name>" or ""
    for calls in by_thread.values():
        calls.sort(key=lambda c: (c[0], -c[1]))
        stack: list[list[Any]] = []  # [end, function stat, package stat or None, child time, start, name, pkey]
        open_count: dict[str, int] = defaultdict(int)  # open calls per function name and per package key
        for start, end, name in calls:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                own = done[0] - done[4] - done[3]
                if own > 0:
                    done[1].self_us += own
                    if done[2] is not None:
                        done[2].self_us += own
                open_count[done[5]] -= 1
                if done[6]:
                    open_count[done[6]] -= 1
            if stack and end > stack[-1][0]:
                end = stack[-1][0]
            dur = end - start
            fstat = functions.get(name)
            if fstat is None:
                function, path, line = parse_function(name)
                origin, package = code_origin(path)
                info[name] = {"function": function, "file": path, "line": line, "origin": origin, "package": package}
                package_of[name] = f"package:{package}" if origin == "package" else ""
                fstat = functions[name] = _Stat()
            pkey = package_of[name]
            fstat.calls += 1
            if not open_count[name]:
                fstat.inclusive_us += dur
            open_count[name] += 1
            pstat = None
            if pkey:
                pstat = packages.get(pkey)
                if pstat is None:
                    pstat = packages[pkey] = _Stat()
                pstat.calls += 1
                pstat.functions.add(name)
                if not open_count[pkey]:
                    pstat.inclusive_us += dur
                open_count[pkey] += 1
            if stack:
                stack[-1][3] += dur
            stack.append([end, fstat, pstat, 0.0, start, name, pkey])
        for done in stack:
            own = done[0] - done[4] - done[3]
            if own > 0:
                done[1].self_us += own
                if done[2] is not None:
                    done[2].self_us += own
    return functions, packages, info


def _entry(name: str, stat: _Stat, meta: Mapping[str, Any], steps: int) -> PythonEntry:
    return {
        "function": meta["function"],
        "file": meta["file"],
        "line": meta["line"],
        "origin": meta["origin"],
        "package": meta["package"],
        "folded": 0,
        "calls": stat.calls,
        "self_ms": _ms(stat.self_us / steps),
        "inclusive_ms": _ms(stat.inclusive_us / steps),
    }


def top_python(events: Sequence[Mapping[str, Any]], steps: int, limit: int = TOP_PYTHON) -> TopPython:
    """Top functions by self and by inclusive time, per active step; user code first, other code
    under site-packages folded to one line per package unless it ranks in the top few."""
    functions, packages, info = python_stats(events)
    steps = max(steps, 1)

    def ranking(metric: str, by: Callable[[PythonEntry], float]) -> list[PythonEntry]:
        ranked = sorted(functions, key=lambda n: getattr(functions[n], metric), reverse=True)
        keep_whole = set(ranked[:TOP_UNFOLDED])
        user: list[PythonEntry] = []
        other: list[PythonEntry] = []
        folded_packages: set[str] = set()
        for name in ranked:
            meta = info[name]
            if meta["origin"] == "user":
                user.append(_entry(name, functions[name], meta, steps))
            elif meta["origin"] == "package" and name not in keep_whole:
                folded_packages.add(meta["package"])
            else:
                other.append(_entry(name, functions[name], meta, steps))
        for package in folded_packages:
            stat = packages[f"package:{package}"]
            other.append(
                {
                    "function": f"{package} (folded)",
                    "file": None,
                    "line": None,
                    "origin": "package",
                    "package": package,
                    "folded": len(stat.functions),
                    "calls": stat.calls,
                    "self_ms": _ms(stat.self_us / steps),
                    "inclusive_ms": _ms(stat.inclusive_us / steps),
                }
            )
        other.sort(key=by, reverse=True)
        user = [e for e in user if by(e) > 0][: limit // 2]
        return user + other[: limit - len(user)]

    return TopPython(
        by_self=ranking("self_us", lambda e: e["self_ms"]),
        by_inclusive=ranking("inclusive_us", lambda e: e["inclusive_ms"]),
    )


# --------------------------------------------------------------------------------------------------
# Torch ops and kernels
# --------------------------------------------------------------------------------------------------


def _is_op(event: Mapping[str, Any]) -> bool:
    return event.get("cat") == "cpu_op" and not str(event.get("name", "")).startswith(ANNOTATION_PREFIXES)


def top_ops(events: Sequence[Mapping[str, Any]], steps: int, limit: int = TOP_OPS) -> TopOps:
    """Ops by CPU time (self and total), and on CUDA by the kernel time they launched."""
    steps = max(steps, 1)
    by_thread: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for event in events:
        if _is_op(event):
            by_thread[(event.get("pid"), event.get("tid"))].append((*_span(event), str(event["name"])))
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, total, self
    op_spans: dict[Any, tuple[list[float], list[tuple[float, float, str]]]] = {}
    for thread, ops in by_thread.items():
        ops.sort(key=lambda o: (o[0], -o[1]))
        stack: list[list[Any]] = []
        for start, end, name in ops:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                stats[done[1]][2] += max(done[3] - done[2], 0.0)
            dur = end - start
            stat = stats[name]
            stat[0] += 1
            stat[1] += dur
            if stack:
                stack[-1][2] += dur
            stack.append([end, name, 0.0, dur])
        while stack:
            done = stack.pop()
            stats[done[1]][2] += max(done[3] - done[2], 0.0)
        op_spans[thread] = ([o[0] for o in ops], ops)
    by_cpu = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:limit]
    out: TopOps = {
        "by_cpu": [
            {"name": name, "calls": int(s[0]), "self_cpu_ms": _ms(s[2] / steps), "cpu_ms": _ms(s[1] / steps)}
            for name, s in by_cpu
        ]
    }
    kernels = [e for e in events if e.get("cat") in KERNEL_CATEGORIES]
    if kernels:
        out["by_kernel"] = _ops_by_kernel(events, kernels, op_spans, steps, limit)
        kernel_names: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for kernel in kernels:
            kernel_names[str(kernel.get("name"))][0] += 1
            kernel_names[str(kernel.get("name"))][1] += float(kernel.get("dur", 0.0))
        out["kernels"] = [
            {"name": name, "calls": int(s[0]), "kernel_ms": _ms(s[1] / steps)}
            for name, s in sorted(kernel_names.items(), key=lambda kv: kv[1][1], reverse=True)[:limit]
        ]
    return out


def _ops_by_kernel(
    events: Sequence[Mapping[str, Any]],
    kernels: Sequence[Mapping[str, Any]],
    op_spans: Mapping[Any, tuple[list[float], list[tuple[float, float, str]]]],
    steps: int,
    limit: int,
) -> list[KernelsByOp]:
    """Kernel time per op: kernel -> its launch (same ``correlation``) -> innermost op around it."""
    launches = {
        (e.get("args") or {}).get("correlation"): e
        for e in events
        if e.get("cat") in RUNTIME_CATEGORIES and (e.get("args") or {}).get("correlation") is not None
    }
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kernel in kernels:
        launch = launches.get((kernel.get("args") or {}).get("correlation"))
        name = "(no launching op)"
        if launch is not None:
            starts, ops = op_spans.get((launch.get("pid"), launch.get("tid")), ([], []))
            ts = float(launch["ts"])
            best = None
            for i in range(bisect_right(starts, ts) - 1, -1, -1):
                start, end, op = ops[i]
                if start <= ts < end and (best is None or start >= best[0]):
                    best = (start, end, op)
                    break
            if best is not None:
                name = best[2]
        totals[name][0] += 1
        totals[name][1] += float(kernel.get("dur", 0.0))
    ranked = sorted(totals.items(), key=lambda kv: kv[1][1], reverse=True)[:limit]
    return [{"name": name, "kernels": int(s[0]), "kernel_ms": _ms(s[1] / steps)} for name, s in ranked]


# --------------------------------------------------------------------------------------------------
# The summary
# --------------------------------------------------------------------------------------------------


def summarize(trace: Mapping[str, Any], memory_snapshot: Mapping[str, Any] | None = None) -> Summary:
    """The summary of one merged window trace (see the module docstring and docs/files.md)."""
    meta = trace.get("vt_lightning") or {}
    events = _x_events(trace)
    steps, thread = find_steps(events)
    recorded = list(steps)
    counted = recorded[1:] if len(recorded) > 1 else recorded  # the first step misses its fetch
    ranges, source = stage_ranges(events, thread)
    per_step: dict[int, float] = {n: steps[n][1] - steps[n][0] for n in recorded}
    parts = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    for n in counted:
        for part, us in attribute_step(steps[n], ranges).items():
            parts[part] += us
    durations = [per_step[n] for n in counted]
    count = max(len(counted), 1)
    span = (steps[recorded[0]][0], steps[recorded[-1]][1]) if recorded else (0.0, 0.0)
    all_events = trace.get("traceEvents", ())
    return {
        "schema": SCHEMA_VERSION,
        "window": {
            "index": meta.get("window"),
            "worker": meta.get("worker"),
            "span": meta.get("span"),
            "global_rank": meta.get("global_rank"),
            "log_step": meta.get("log_step"),
            "partial": bool(meta.get("partial", False)),
            "overflow": bool(meta.get("overflow", False)),
            "device": "cuda" if any(e.get("cat") in KERNEL_CATEGORIES for e in events) else "cpu",
        },
        "steps": {
            "recorded": recorded,
            "counted": counted,
            "ms": {str(n): _ms(per_step[n]) for n in recorded},
            "breakdown_source": source,
        },
        "step_ms": {
            "mean": _ms(sum(durations) / count) if durations else None,
            "p50": _ms(_percentile(durations, 0.5)) if durations else None,
            "max": _ms(max(durations)) if durations else None,
        },
        "breakdown_ms": {part: _ms(us / count) for part, us in parts.items()},
        # The training thread's calls: a background thread that waits (a logger's flush loop
        # sleeping, a queue get) would otherwise top the list with time no step spent.
        "top_python": top_python(
            [e for e in events if thread is None or (e.get("pid"), e.get("tid")) == thread], len(recorded)
        ),
        "top_ops": top_ops(events, len(recorded)),
        "gpu": gpu_summary(events, span, thread) if recorded else None,
        "memory": memory_summary(all_events, memory_snapshot),
    }
