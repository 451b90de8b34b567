"""Why is my step slow? One window's verdicts, each naming the user's code beside its evidence. Pure.

Input: the merged trace (Python calls, torch ops, kernels and CUDA runtime calls on one timeline),
the window's summary (step times, breakdown, GPU, memory) and, when there is one, the memory
snapshot. Output: ``summary["verdicts"]``, a list of ``Verdict`` (analysis/schema.py), largest share
first. Each rule below has one relative threshold (a share of the counted steps' time) and a small
absolute floor, so a tiny step never earns a verdict for microseconds; a healthy window gets none:
a false alarm costs more trust than a missed one. docs/verdicts.md explains every kind.

Every share is over the summary's counted steps (``covers.steps``), the steps the breakdown and the
tables average over; ``where`` is the user's code (analysis/usercode.py), at most ``TOP_WHERE``.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from vt_lightning.analysis.breakdown import stage_ranges
from vt_lightning.analysis.compile import compile_verdicts
from vt_lightning.analysis.schema import Summary, Verdict, VerdictWhere
from vt_lightning.analysis.spans import Span, clip, span_of, union, x_events
from vt_lightning.analysis.summary_devices import KERNEL_CATEGORIES, RUNTIME_CATEGORIES
from vt_lightning.analysis.usercode import code_origin, parse_function
from vt_lightning.constants import PL_PREFIX, PYTHON_CATEGORY, STEP_PREFIX, TRACE_METADATA_KEY

KINDS = (
    "input_bound",
    "python_bound",
    "host_sync",
    "gpu_idle",
    "compile_time",
    "recompile",
    "graph_break",
    "gc",
    "straggler",
    "comm_bound",
    "memory_pressure",
)

# Thresholds: a share of the counted steps' time (docs/verdicts.md), and an absolute floor per step.
INPUT_BOUND_SHARE = 0.25  # fetching the next batch (breakdown ``data_wait``)
INPUT_BOUND_MIN_MS = 1.0
PYTHON_BOUND_SHARE = 0.30  # the user's own Python with no torch op under it
PYTHON_BOUND_MIN_MS = 1.0
HOST_SYNC_SHARE = 0.10  # GPU idle right after a blocking CUDA call that waited for it
HOST_SYNC_MIN_MS = 0.2
GPU_IDLE_SHARE = 0.50  # GPU idle over the window's steps (busy < 50 %)
COMM_BOUND_SHARE = 0.20  # communication kernels not overlapped by compute kernels
GC_SHARE = 0.05  # the garbage collector's pauses
GC_MIN_MS = 0.5
MEMORY_RESERVED_SHARE = 0.90  # peak reserved of the device's total memory
MEMORY_FREES_PER_STEP = 1.0  # cudaFree calls per counted step (allocator retries or empty_cache)
TOP_WHERE = 3

GC_SPAN_PREFIX = "[gc] "  # recording/gc_watch.py names its spans "[gc] generation N"
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
    }
)
FREE_CALLS = frozenset({"cudaFree", "cuMemFree_v2", "cudaFreeAsync"})
ANNOTATIONS = (PL_PREFIX, STEP_PREFIX, TRACE_METADATA_KEY)
# Builtins that wait rather than compute (``time.sleep``, lock and queue waits, I/O polling): time
# in them is not "Python-bound", even when the user's code called them.
BLOCKING_SUFFIXES = ("sleep", "acquire", "wait", "select", "poll", "recv", "recv_into", "join")

ADVICE = {
    "input_bound": "Fetch batches in parallel: raise DataLoader num_workers (with persistent_workers=True, "
    "pin_memory=True), or make the dataset code named here cheaper (precompute, cache).",
    "python_bound": "Move the per-step Python named here into tensor ops, precompute it once, or run it every N steps.",
    "host_sync": "Keep values on the GPU in the step: drop .item()/.cpu()/.tolist()/synchronize at the line "
    "named here, or log them every N steps; copy with non_blocking=True.",
    "gpu_idle": "The GPU waits for the CPU: bigger batches, fewer small ops (torch.compile, CUDA graphs), "
    "and the code named here runs while it waits.",
    "comm_bound": "Communication is not hidden behind compute: tune DDP bucket_cap_mb, accumulate gradients "
    "with no_sync, or check the interconnect.",
    "gc": "Python's garbage collector paused the step: avoid reference cycles in per-step objects, call "
    "gc.freeze() after setup, or raise gc.set_threshold().",
    "memory_pressure": "The caching allocator is short of device memory: lower the batch size, checkpoint "
    "activations, use mixed precision, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
}

Call = tuple[float, float, str]


def _share(us: float, total_us: float) -> float:
    return round(us / total_us, 3) if total_us > 0 else 0.0


def _where(name: str, us: float | None = None, steps: int = 1) -> VerdictWhere:
    function, path, line = parse_function(name)
    out: VerdictWhere = {"function": function, "file": path, "line": line}
    if us is not None:
        out["ms"] = round(us / 1000.0 / max(steps, 1), 3)
    return out


def _top_where(per_name: Mapping[str, float], steps: int, limit: int = TOP_WHERE) -> list[VerdictWhere]:
    ranked = sorted(per_name.items(), key=lambda kv: kv[1], reverse=True)
    return [_where(name, us, steps) for name, us in ranked[:limit] if us > 0]


def _is_user(name: str) -> bool:
    return code_origin(parse_function(name)[1])[0] == "user"


def _verdict(kind: str, share: float, where: list[VerdictWhere], evidence: dict[str, Any]) -> Verdict:
    return {"kind": kind, "where": where, "evidence": {"share": share, **evidence}, "advice": ADVICE[kind]}


# --------------------------------------------------------------------------------------------------
# One thread's timeline: which call (and which user call) each instant belongs to
# --------------------------------------------------------------------------------------------------


class Timeline:
    """One thread's Python calls cut into non-overlapping segments, each owned by the innermost
    call open then. Per segment: that call, the innermost user-code call around it, the user call
    that entered user code from library code (``__getitem__`` under torch's fetcher), and the
    owner for "pure Python" time (a user call, or a builtin / stdlib call made from one)."""

    def __init__(self, calls: Iterable[Call]) -> None:
        self.starts: list[float] = []
        self.segments: list[tuple[float, float, str, str | None, str | None, str | None]] = []
        add_start, add_segment = self.starts.append, self.segments.append
        origin: dict[str, str] = {}
        stack: list[tuple[float, str, str | None, str | None, str | None, bool]] = []
        cursor = 0.0
        for start, negative_end, name in sorted((s, -e, n) for s, e, n in calls):  # outer call first
            end = -negative_end
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                if done[0] > cursor:
                    add_start(cursor)
                    add_segment((cursor, done[0], done[1], done[2], done[3], done[4]))
                cursor = done[0]
            parent = stack[-1] if stack else None
            if parent is not None:
                if start > cursor:
                    add_start(cursor)
                    add_segment((cursor, start, parent[1], parent[2], parent[3], parent[4]))
                end = min(end, parent[0])
            kind = origin.get(name)
            if kind is None:
                kind = origin[name] = (
                    "gc" if name.startswith(GC_SPAN_PREFIX) else code_origin(parse_function(name)[1])[0]
                )
            if kind == "user":
                # the user call that entered user code from library code is inherited down the stack
                entry = parent[3] if parent is not None and parent[5] else name
                stack.append((end, name, name, entry, name, True))
            elif parent is None:
                stack.append((end, name, None, None, None, False))
            else:
                pure = kind in ("builtin", "stdlib") and not name.endswith(BLOCKING_SUFFIXES)
                stack.append((end, name, parent[2], parent[3], parent[4] if pure else None, False))
            cursor = start
        while stack:
            done = stack.pop()
            if done[0] > cursor:
                add_start(cursor)
                add_segment((cursor, done[0], done[1], done[2], done[3], done[4]))
            cursor = done[0]

    def at(self, t: float) -> tuple[str, str | None] | None:
        """(innermost call, innermost user call) at time ``t``; None outside every call."""
        i = bisect_right(self.starts, t) - 1
        if i >= 0:
            start, end, name, user, _, _ = self.segments[i]
            if start <= t < end:
                return name, user
        return None

    def within(self, spans: Sequence[Span]) -> Iterable[tuple[Span, tuple[Any, ...]]]:
        """(the part inside ``spans``, segment) for every segment overlapping the sorted, disjoint
        ``spans``."""
        for lo, hi in spans:
            i = max(bisect_right(self.starts, lo) - 1, 0)
            while i < len(self.segments) and self.segments[i][0] < hi:
                seg = self.segments[i]
                part = (max(seg[0], lo), min(seg[1], hi))
                if part[1] > part[0]:
                    yield part, seg
                i += 1


def _overlap(span: Span, sorted_spans: Sequence[Span], starts: Sequence[float]) -> float:
    """µs of ``span`` covered by the sorted, disjoint ``sorted_spans``."""
    lo, hi = span
    total = 0.0
    i = max(bisect_right(starts, lo) - 1, 0)
    while i < len(sorted_spans) and sorted_spans[i][0] < hi:
        s, e = sorted_spans[i]
        total += max(0.0, min(e, hi) - max(s, lo))
        i += 1
    return total


def _difference(spans: Sequence[Span], minus: Sequence[Span]) -> list[Span]:
    """The parts of the sorted, disjoint ``spans`` outside the sorted, disjoint ``minus``."""
    out: list[Span] = []
    for lo, hi in spans:
        cursor = lo
        for s, e in minus:
            if e <= cursor or s >= hi:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < hi:
            out.append((cursor, hi))
    return out


def _subtract(spans: Sequence[Span], minus: Sequence[Span]) -> float:
    """µs of the union of ``spans`` not covered by the union of ``minus``."""
    a, b = union(spans), union(minus)
    starts = [s for s, _ in b]
    return sum((e - s) - _overlap((s, e), b, starts) for s, e in a)


# --------------------------------------------------------------------------------------------------
# The window, read once for every rule
# --------------------------------------------------------------------------------------------------


class Window:
    """What every rule needs: counted steps, the training thread, per-thread timelines."""

    def __init__(self, trace: Mapping[str, Any], summary: Summary, shared: Mapping[str, Any]) -> None:
        from vt_lightning.analysis.summary import find_steps  # summary imports this module

        self.meta = trace.get(TRACE_METADATA_KEY) or {}
        self.events = shared["events"] if "events" in shared else x_events(trace)
        steps, self.thread = (shared["steps"], shared["thread"]) if "steps" in shared else find_steps(self.events)
        counted = [n for n in (summary.get("steps") or {}).get("counted") or [] if n in steps]
        self.steps = len(counted)
        self.step_starts = sorted(steps[n][0] for n in counted)
        self.step_spans = union(steps[n] for n in counted)
        self.total_us = sum(steps[n][1] - steps[n][0] for n in counted)
        self.region: Span = (self.step_spans[0][0], self.step_spans[-1][1]) if self.step_spans else (0.0, 0.0)
        self.pid = self.thread[0] if self.thread else None
        self._ranges = shared.get("ranges")
        # One pass over the events, by what the rules read.
        self._calls: dict[Any, list[Call]] = defaultdict(list)
        self.ops: list[Span] = []  # the training thread's torch ops and CUDA runtime calls
        self.runtime: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.gc: list[dict[str, Any]] = []
        for e in self.events:
            cat = e.get("cat")
            if cat == PYTHON_CATEGORY:
                name = str(e.get("name", ""))
                span = span_of(e)
                self._calls[(e.get("pid"), e.get("tid"))].append((span[0], span[1], name))
                if name.startswith(GC_SPAN_PREFIX):
                    self.gc.append(e)
            elif cat in KERNEL_CATEGORIES:
                self.kernels.append(e)
            elif cat in RUNTIME_CATEGORIES or cat == "cpu_op":
                if cat != "cpu_op":
                    self.runtime.append(e)
                elif str(e.get("name", "")).startswith(ANNOTATIONS):
                    continue
                if (e.get("pid"), e.get("tid")) == self.thread:
                    self.ops.append(span_of(e))
        self._timelines: dict[Any, Timeline] = {}
        self._waits: list[Span] | None = None

    def data_waits(self) -> list[Span]:
        """The counted steps' ``data_wait`` ranges (fetching the batch), as the breakdown has them."""
        if self._waits is None:
            ranges = self._ranges
            if ranges is None:
                hooks = self.meta.get("user_hooks")
                ranges, _, _ = stage_ranges(self.events, self.thread, hooks if isinstance(hooks, dict) else None)
            self._waits = union(clip([(s, e) for s, e, part in ranges if part == "data_wait"], *self.region))
        return self._waits

    def data_wait_per_step_ms(self) -> list[float]:
        """ms of ``data_waits`` in each counted step's slot (from its start to the next one's, the
        last to the region's end), so a fetch between two steps counts for the step it fed."""
        waits = self.data_waits()
        starts = [s for s, _ in waits]
        edges = [*self.step_starts, self.region[1]]
        return [_overlap((lo, hi), waits, starts) / 1000.0 for lo, hi in pairwise(edges)]

    def timeline(self, thread: Any) -> Timeline:
        found = self._timelines.get(thread)
        if found is None:
            found = self._timelines[thread] = Timeline(self._calls.get(thread, ()))
        return found

    def threads(self) -> list[Any]:
        return list(self._calls)

    def in_steps(self, span: Span) -> bool:
        lo, hi = span
        return any(s < hi and lo < e for s, e in self.step_spans)

    def per_step_ms(self, us: float) -> float:
        return round(us / 1000.0 / max(self.steps, 1), 3)


# --------------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------------


def input_bound(w: Window, summary: Summary) -> Verdict | None:
    """Fetching the next batch (the breakdown's ``data_wait``) is a large share of the step; where:
    the user's dataset / collate code that ran meanwhile, on the training thread or in workers."""
    wait_ms = float((summary.get("breakdown_ms") or {}).get("data_wait") or 0.0)
    step_ms = w.total_us / 1000.0 / max(w.steps, 1)
    if not step_ms or wait_ms < INPUT_BOUND_MIN_MS or wait_ms / step_ms < INPUT_BOUND_SHARE:
        return None
    # The typical step must wait too: one fetch the OS descheduled on a busy machine lifts the mean
    # of a few steps past the threshold (a healthy model on a loaded CI box: 32 %), never the median.
    per_step = w.data_wait_per_step_ms()
    median_wait_ms = statistics.median(per_step) if per_step else None
    if median_wait_ms is not None and (
        median_wait_ms < INPUT_BOUND_MIN_MS or median_wait_ms / step_ms < INPUT_BOUND_SHARE
    ):
        return None
    waits = w.data_waits()
    per_entry: dict[str, float] = defaultdict(float)
    for (lo, hi), seg in w.timeline(w.thread).within(waits):
        if seg[4]:
            per_entry[seg[4]] += hi - lo
    workers: dict[str, float] = defaultdict(float)
    everything = (-math.inf, math.inf)  # workers fetch ahead: a window's batches were fetched before its steps
    for thread in w.threads():
        if thread[0] == w.pid:
            continue
        for (lo, hi), seg in w.timeline(thread).within([everything]):
            if seg[4]:
                workers[seg[4]] += hi - lo
    where = _top_where(per_entry, w.steps) if per_entry else _top_where(workers, w.steps)
    evidence = {
        "data_wait_ms": round(wait_ms, 3),
        "median_step_data_wait_ms": None if median_wait_ms is None else round(median_wait_ms, 3),
        "step_ms": round(step_ms, 3),
        "source": "main process" if per_entry else ("worker processes" if workers else "no user code recorded"),
    }
    return _verdict("input_bound", round(wait_ms / step_ms, 3), where, evidence)


def _python_upper_bound_ms(summary: Summary) -> float | None:
    """Per step, the self time of every user, builtin and stdlib function (``top_python.totals``):
    at least the pure-Python time, so a window under the threshold skips the timeline."""
    totals = (summary.get("top_python") or {}).get("totals")
    if not totals:
        return None
    kinds = ("user", "builtin", "stdlib")
    own = sum(ms for key, ms in totals["ms"].items() if code_origin(parse_function(key)[1])[0] in kinds)
    return own + totals["other_ms"]


def python_bound(w: Window, summary: Summary) -> Verdict | None:
    """The user's own Python, with no torch op running under it, is a large share of the step
    outside fetching the batch (that is ``input_bound``'s); where: the user functions with the most
    such time."""
    bound = _python_upper_bound_ms(summary)
    step_ms = w.total_us / 1000.0 / max(w.steps, 1)
    if bound is not None and (bound < PYTHON_BOUND_SHARE * step_ms or bound < PYTHON_BOUND_MIN_MS):
        return None
    ops = union(w.ops)  # torch ops, and CUDA runtime calls (blocked in a sync, a launch): not Python
    outside_waits = _difference(w.step_spans, w.data_waits())
    # The time counted below lies in the steps outside the waits and outside every op (the
    # timeline's segments are disjoint): when even all of that is too little, the timeline (the
    # rules' costliest structure) is never built. An op-bound step ends here.
    most_us = sum(hi - lo for lo, hi in _difference(outside_waits, ops))
    if _share(most_us, w.total_us) < PYTHON_BOUND_SHARE or w.per_step_ms(most_us) < PYTHON_BOUND_MIN_MS:
        return None
    starts = [s for s, _ in ops]
    per_owner: dict[str, float] = defaultdict(float)
    for (lo, hi), seg in w.timeline(w.thread).within(outside_waits):
        owner = seg[5]
        if owner:
            per_owner[owner] += max((hi - lo) - _overlap((lo, hi), ops, starts), 0.0)
    pure_us = sum(per_owner.values())
    share = _share(pure_us, w.total_us)
    if share < PYTHON_BOUND_SHARE or w.per_step_ms(pure_us) < PYTHON_BOUND_MIN_MS:
        return None
    evidence = {"user_python_ms": w.per_step_ms(pure_us), "step_ms": w.per_step_ms(w.total_us)}
    return _verdict("python_bound", share, _top_where(per_owner, w.steps), evidence)


def _kernels(w: Window, names: Any = None) -> list[Span]:
    return [span_of(e) for e in w.kernels if names is None or names(e)]


def host_sync(w: Window) -> Verdict | None:
    """The CPU blocked in a CUDA call that waited for the GPU (``.item()``, ``.cpu()``,
    ``.tolist()``, ``synchronize``), and the GPU then sat idle for a large share of the step
    while the CPU caught up; where: the user function around each blocking call."""
    busy = union(_kernels(w))
    if not busy:
        return None
    starts = [s for s, _ in busy]
    timeline = w.timeline(w.thread)
    idle_after: dict[int, float] = {}  # the busy interval ending the gap -> idle µs (each gap once)
    per_user: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    blocked_us = 0.0
    for e in w.runtime:
        if e.get("name") not in SYNC_CALLS:
            continue
        if (e.get("pid"), e.get("tid")) != w.thread or not w.in_steps(span_of(e)):
            continue
        start, end = span_of(e)
        if _overlap((start, end), busy, starts) <= 0:  # the GPU was idle already: the call cost nothing
            continue
        i = bisect_right(starts, end)
        if i > 0 and busy[i - 1][1] > end:  # another stream still busy: no idle gap after it
            continue
        idle = min(busy[i][0] if i < len(busy) else w.region[1], w.region[1]) - end
        if idle <= 0:
            continue
        idle_after[i] = max(idle_after.get(i, 0.0), idle)
        blocked_us += end - start
        here = timeline.at((start + end) / 2)
        if here is not None:
            calls[parse_function(here[0])[0]] += 1
            if here[1]:
                per_user[here[1]] += idle
    idle_us = sum(idle_after.values())
    share = _share(idle_us, w.total_us)
    if share < HOST_SYNC_SHARE or w.per_step_ms(idle_us) < HOST_SYNC_MIN_MS:
        return None
    evidence = {
        "gpu_idle_after_sync_ms": w.per_step_ms(idle_us),
        "blocked_ms": w.per_step_ms(blocked_us),
        "step_ms": w.per_step_ms(w.total_us),
        "calls": dict(sorted(calls.items(), key=lambda kv: kv[1], reverse=True)[:TOP_WHERE]),
    }
    return _verdict("host_sync", share, _top_where(per_user, w.steps), evidence)


def gpu_idle(summary: Summary) -> Verdict | None:
    """The GPU was idle for most of the window's steps; where: the user code the training thread
    was in during the largest idle gaps."""
    gpu = summary.get("gpu")
    if not gpu or not gpu.get("wall_ms"):
        return None
    idle = 1.0 - float(gpu.get("busy_percent") or 0.0) / 100.0
    if idle < GPU_IDLE_SHARE:
        return None
    per_user: dict[str, float] = defaultdict(float)
    for gap in gpu.get("idle_gaps") or []:
        if gap.get("user_python"):
            per_user[str(gap["user_python"])] += float(gap.get("ms") or 0.0) * 1000.0
    recorded = len((summary.get("steps") or {}).get("recorded") or []) or 1
    evidence = {"busy_percent": gpu.get("busy_percent"), "idle_ms": round(gpu["wall_ms"] * idle / recorded, 3)}
    return _verdict("gpu_idle", round(idle, 3), _top_where(per_user, recorded), evidence)


def _is_comm(event: Mapping[str, Any]) -> bool:
    return "nccl" in str(event.get("name", "")).lower()


def comm_bound(w: Window) -> Verdict | None:
    """Communication kernels (NCCL) not overlapped by compute kernels are a large share of the
    step; where: the user code that launched them."""
    comm = clip(_kernels(w, _is_comm), *w.region)
    if not comm:
        return None
    exposed = _subtract(comm, clip(_kernels(w, lambda e: not _is_comm(e)), *w.region))
    share = _share(exposed, w.total_us)
    if share < COMM_BOUND_SHARE:
        return None
    launches = {(e.get("args") or {}).get("correlation"): e for e in w.runtime}
    per_user: dict[str, float] = defaultdict(float)
    for e in w.kernels:
        if _is_comm(e):
            launch = launches.get((e.get("args") or {}).get("correlation"))
            if launch is not None:
                here = w.timeline((launch.get("pid"), launch.get("tid"))).at(float(launch["ts"]))
                if here is not None and here[1]:
                    per_user[here[1]] += float(e.get("dur", 0.0))
    evidence = {"exposed_comm_ms": w.per_step_ms(exposed), "step_ms": w.per_step_ms(w.total_us)}
    return _verdict("comm_bound", share, _top_where(per_user, w.steps), evidence)


def gc_pauses(w: Window) -> Verdict | None:
    """The garbage collector's pauses (recording/gc_watch.py's spans) inside the counted steps are
    a share of the step; where: the user code that was running when each pause began."""
    pauses: list[Span] = []
    per_user: dict[str, float] = defaultdict(float)
    generations: dict[str, int] = defaultdict(int)
    longest = 0.0
    for e in w.gc:
        name = str(e.get("name", ""))
        if e.get("pid") != w.pid:
            continue
        kept = clip([span_of(e)], *w.region)
        if not kept or not w.in_steps(kept[0]):
            continue
        pauses.append(kept[0])
        us = kept[0][1] - kept[0][0]
        longest = max(longest, us)
        generations[name[len(GC_SPAN_PREFIX) :]] += 1
        here = w.timeline((e.get("pid"), e.get("tid"))).at(kept[0][0] - 1e-3)
        if here is not None and here[1]:
            per_user[here[1]] += us
    paused = sum(e - s for s, e in union(pauses))
    share = _share(paused, w.total_us)
    if share < GC_SHARE or w.per_step_ms(paused) < GC_MIN_MS:
        return None
    evidence = {
        "gc_ms": w.per_step_ms(paused),
        "pauses": len(pauses),
        "longest_ms": round(longest / 1000.0, 3),
        "by_generation": dict(generations),
        "step_ms": w.per_step_ms(w.total_us),
    }
    return _verdict("gc", share, _top_where(per_user, w.steps), evidence)


def memory_pressure(w: Window, summary: Summary, trace: Mapping[str, Any], snapshot: Any) -> Verdict | None:
    """CUDA only: the allocator reserved nearly all of the device's memory, or it returned memory
    to the driver inside the steps (``cudaFree``: a retry after a failed ``cudaMalloc``, or
    ``empty_cache``), or the snapshot saw an out-of-memory; where: the top allocation sites / the
    user code that freed."""
    memory: Mapping[str, Any] = summary.get("memory") or {}
    totals = {
        f"cuda:{d.get('id')}": float(d.get("totalGlobalMem") or 0)
        for d in trace.get("deviceProperties") or []
        if isinstance(d, Mapping)
    }
    fullest = 0.0
    for label, device in (memory.get("devices") or {}).items():
        total = totals.get(label, 0.0)
        reserved = float(device.get("peak_reserved_mb") or 0.0) * 2**20
        if total > 0:
            fullest = max(fullest, reserved / total)
    frees: list[dict[str, Any]] = [
        e for e in w.runtime if e.get("name") in FREE_CALLS and e.get("pid") == w.pid and w.in_steps(span_of(e))
    ]
    ooms = sum(
        1 for trace_ in (snapshot or {}).get("device_traces") or [] for entry in trace_ if entry.get("action") == "oom"
    )
    frees_per_step = len(frees) / max(w.steps, 1)
    if fullest < MEMORY_RESERVED_SHARE and frees_per_step < MEMORY_FREES_PER_STEP and not ooms:
        return None
    per_user: dict[str, float] = defaultdict(float)
    for e in frees:
        here = w.timeline((e.get("pid"), e.get("tid"))).at(float(e["ts"]))
        if here is not None and here[1]:
            per_user[here[1]] += float(e.get("dur", 0.0))
    where = _top_where(per_user, w.steps)
    if not where:
        where = [_where(site["site"]) for site in (memory.get("top_allocation_sites") or [])[:TOP_WHERE]]
        where = [x for x in where if x["file"] and code_origin(x["file"])[0] == "user"] or where[:1]
    freed_us = sum(float(e.get("dur", 0.0)) for e in frees)
    evidence = {
        "reserved_of_device": round(fullest, 3),
        "cuda_frees_per_step": round(frees_per_step, 2),
        "cuda_free_ms": w.per_step_ms(freed_us),
        "ooms": ooms,
    }
    return _verdict("memory_pressure", _share(freed_us, w.total_us), where, evidence)


def find_verdicts(
    trace: Mapping[str, Any], summary: Summary, memory_snapshot: Any = None, **shared: Any
) -> list[Verdict]:
    """Every rule over one window, largest share first (``[]``: nothing stands out). ``shared``:
    what ``summarize`` computed already (``events``, ``steps``, ``thread``, ``ranges``), not redone."""
    w = Window(trace, summary, shared)
    if not w.steps or w.total_us <= 0:
        return []
    found = [
        input_bound(w, summary),
        python_bound(w, summary),
        host_sync(w),
        gpu_idle(summary),
        comm_bound(w),
        gc_pauses(w),
        memory_pressure(w, summary, trace, memory_snapshot),
    ]
    verdicts = [v for v in found if v is not None]
    verdicts.extend(compile_verdicts(summary.get("compile"), summary.get("step_ms")))  # analysis/compile.py
    verdicts.sort(key=lambda v: v["evidence"].get("share", 0.0), reverse=True)
    return verdicts
