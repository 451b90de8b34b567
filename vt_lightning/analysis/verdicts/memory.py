"""The memory family: ``memory_pressure``, the caching allocator is short of device memory. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from vt_lightning.analysis.spans import span_of
from vt_lightning.analysis.usercode import is_user_file
from vt_lightning.analysis.verdicts.base import (
    TOP_WHERE,
    Finding,
    Rule,
    share_of,
    top_where,
    users_first,
    where_of,
)
from vt_lightning.analysis.verdicts.window import WindowView

MEMORY_RESERVED_SHARE = 0.90  # peak reserved of the device's total memory
MEMORY_FREES_PER_STEP = 1.0  # cudaFree calls per counted step (allocator retries or empty_cache)
FREE_CALLS = frozenset({"cudaFree", "cuMemFree_v2", "cudaFreeAsync"})


def memory_pressure(w: WindowView) -> Iterator[Finding]:
    """CUDA only: the allocator reserved nearly all device memory, freed memory inside the steps or ran
    out; where: the user code that freed, else the top allocation sites."""
    memory: Mapping[str, Any] = w.summary.get("memory") or {}
    totals = {
        f"cuda:{d.get('id')}": float(d.get("totalGlobalMem") or 0)
        for d in w.trace.header.get("deviceProperties") or []
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
        1
        for trace_ in (w.snapshot or {}).get("device_traces") or []
        for entry in trace_
        if entry.get("action") == "oom"
    )
    frees_per_step = len(frees) / max(w.steps, 1)
    if fullest < MEMORY_RESERVED_SHARE and frees_per_step < MEMORY_FREES_PER_STEP and not ooms:
        return
    per_user: dict[str, float] = defaultdict(float)
    for e in frees:
        user = w.user_at(e)
        if user:
            per_user[user] += float(e.get("dur", 0.0))
    where = top_where(per_user, w.steps)
    if not where:
        where = [where_of(site["site"]) for site in (memory.get("top_allocation_sites") or [])[:TOP_WHERE]]
        where = [x for x in where if is_user_file(x["file"])] or users_first(where)[:1]
    freed_us = sum(float(e.get("dur", 0.0)) for e in frees)
    evidence = {
        "reserved_of_device": round(fullest, 3),
        "cuda_frees_per_step": round(frees_per_step, 2),
        "cuda_free_ms": w.per_step_ms(freed_us),
        "ooms": ooms,
    }
    yield Finding(share_of(freed_us, w.total_us), where, evidence)


RULES = (
    Rule(
        "memory_pressure",
        memory_pressure,
        {"MEMORY_RESERVED_SHARE": MEMORY_RESERVED_SHARE, "MEMORY_FREES_PER_STEP": MEMORY_FREES_PER_STEP},
        "The caching allocator is short of device memory: lower the batch size, checkpoint "
        "activations, use mixed precision, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ),
)
