"""The CUDA and host family: ``host_sync``, ``gpu_idle`` and ``comm_bound`` (CUDA windows only). Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vt_lightning.analysis.spans import Span, clip, covered, difference, span_of, union
from vt_lightning.analysis.usercode import parse_function
from vt_lightning.analysis.verdicts.base import TOP_WHERE, Finding, Rule, share_of, top_where
from vt_lightning.analysis.verdicts.window import WindowView

HOST_SYNC_SHARE = 0.10  # GPU idle right after a blocking CUDA call that waited for it, of the step
HOST_SYNC_MIN_MS = 0.2  # per step
GPU_IDLE_SHARE = 0.50  # GPU idle over the window's steps (busy < 50 %)
COMM_BOUND_SHARE = 0.20  # communication kernels not overlapped by compute kernels, of the step
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


def _kernels(w: WindowView, keep: Callable[[Mapping[str, Any]], bool] | None = None) -> list[Span]:
    return [span_of(e) for e in w.kernels if keep is None or keep(e)]


def host_sync(w: WindowView) -> Iterator[Finding]:
    """The CPU blocked in a CUDA call that waited for the GPU, which then sat idle; where: the user's call."""
    busy = union(_kernels(w))
    if not busy:
        return
    starts = [s for s, _ in busy]
    timeline = w.timeline(w.thread)
    idle_after: dict[int, Span] = {}  # the busy interval ending the gap -> the idle gap (each gap once)
    per_user: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    blocked_us = 0.0
    for e in w.runtime:
        if e.get("name") not in SYNC_CALLS:
            continue
        if (e.get("pid"), e.get("tid")) != w.thread or not w.in_steps(span_of(e)):
            continue
        start, end = span_of(e)
        if covered((start, end), busy, starts) <= 0:  # the GPU was idle already: the call cost nothing
            continue
        i = bisect_right(starts, end)
        if i > 0 and busy[i - 1][1] > end:  # another stream still busy: no idle gap after it
            continue
        idle = min(busy[i][0] if i < len(busy) else w.region[1], w.region[1]) - end
        if idle <= 0:
            continue
        if i not in idle_after or idle_after[i][0] > end:
            idle_after[i] = (end, end + idle)
        blocked_us += end - start
        here = timeline.at((start + end) / 2)
        if here is not None:
            _, _, call, user, _, _ = here
            calls[parse_function(call)[0]] += 1
            if user:
                per_user[user] += idle
    gaps = union(idle_after.values())
    idle_us = sum(hi - lo for lo, hi in gaps)
    share = share_of(idle_us, w.total_us)
    per_step = w.per_step_us(gaps)
    if share < HOST_SYNC_SHARE or not w.most_steps(per_step, HOST_SYNC_SHARE, HOST_SYNC_MIN_MS):
        return
    evidence = {
        "gpu_idle_after_sync_ms": w.per_step_ms(idle_us),
        "per_step_ms": [round(us / 1000.0, 3) for us in per_step],
        "blocked_ms": w.per_step_ms(blocked_us),
        "step_ms": w.per_step_ms(w.total_us),
        "calls": dict(sorted(calls.items(), key=lambda kv: kv[1], reverse=True)[:TOP_WHERE]),
    }
    yield Finding(share, top_where(per_user, w.steps), evidence)


def gpu_idle(w: WindowView) -> Iterator[Finding]:
    """The GPU was idle most of the steps; where: the user code in the largest idle gaps."""
    gpu = w.summary.get("gpu")
    if not gpu or not gpu.get("wall_ms"):
        return
    idle = 1.0 - float(gpu.get("busy_percent") or 0.0) / 100.0
    if idle < GPU_IDLE_SHARE:
        return
    per_user: dict[str, float] = defaultdict(float)
    for gap in gpu.get("idle_gaps") or []:
        if gap.get("user_python"):
            per_user[str(gap["user_python"])] += float(gap.get("ms") or 0.0) * 1000.0
    recorded = len((w.summary.get("steps") or {}).get("recorded") or []) or 1
    evidence = {"busy_percent": gpu.get("busy_percent"), "idle_ms": round(gpu["wall_ms"] * idle / recorded, 3)}
    yield Finding(round(idle, 3), top_where(per_user, recorded), evidence)


def _is_comm(event: Mapping[str, Any]) -> bool:
    return "nccl" in str(event.get("name", "")).lower()


def comm_bound(w: WindowView) -> Iterator[Finding]:
    """Communication kernels not hidden behind compute; where: the user code that launched them."""
    comm = clip(_kernels(w, _is_comm), *w.region)
    if not comm:
        return
    exposed_spans = difference(union(comm), union(clip(_kernels(w, lambda e: not _is_comm(e)), *w.region)))
    exposed = sum(hi - lo for lo, hi in exposed_spans)
    share = share_of(exposed, w.total_us)
    per_step = w.per_step_us(exposed_spans)
    if share < COMM_BOUND_SHARE or not w.most_steps(per_step, COMM_BOUND_SHARE, 0.0):
        return
    launches = w.data.launches
    per_user: dict[str, float] = defaultdict(float)
    for e in w.kernels:
        if _is_comm(e):
            launch = launches.get((e.get("args") or {}).get("correlation"))
            user = w.user_at(launch) if launch is not None else None
            if user:
                per_user[user] += float(e.get("dur", 0.0))
    evidence = {
        "exposed_comm_ms": w.per_step_ms(exposed),
        "step_ms": w.per_step_ms(w.total_us),
        "per_step_ms": [round(us / 1000.0, 3) for us in per_step],
    }
    yield Finding(share, top_where(per_user, w.steps), evidence)


RULES = (
    Rule(
        "host_sync",
        host_sync,
        {"HOST_SYNC_SHARE": HOST_SYNC_SHARE, "HOST_SYNC_MIN_MS": HOST_SYNC_MIN_MS},
        "Keep values on the GPU in the step: drop .item()/.cpu()/.tolist()/synchronize at the line "
        "named here, or log them every N steps; copy with non_blocking=True.",
    ),
    Rule(
        "gpu_idle",
        gpu_idle,
        {"GPU_IDLE_SHARE": GPU_IDLE_SHARE},
        "The GPU waits for the CPU: bigger batches, fewer small ops (torch.compile, CUDA graphs), "
        "and the code named here runs while it waits.",
    ),
    Rule(
        "comm_bound",
        comm_bound,
        {"COMM_BOUND_SHARE": COMM_BOUND_SHARE},
        "Communication is not hidden behind compute: tune DDP bucket_cap_mb, accumulate gradients "
        "with no_sync, or check the interconnect.",
    ),
)
