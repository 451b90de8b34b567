"""Which rank is late, how long the others wait for it, and which of its Python lines took the time
(the rule: docs/distributed.md, "The straggler"). Collectives are matched across ranks by (step,
name, k-th), from the first family of ``FAMILIES`` on every rank (so the c10d op and the backend's
work never both count); a rank is named only if its net wait reaches both thresholds, as balanced
ranks take turns being last."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from vt_lightning.analysis.python_tables import name_codes
from vt_lightning.analysis.trace import Calls, ThreadSpans
from vt_lightning.analysis.usercode import is_user_file, parse_function
from vt_lightning.constants import STEP_PREFIX

MIN_SHARE = 0.10  # of the mean step time
MIN_WAIT_MS = 1.0  # per step
SLOW_OP_RATIO = 3.0  # an op this many times slower on one rank than on the fastest...
SLOW_OP_MIN_MS = 1.0  # ...and by at least this much per step, or SLOW_OP_MIN_SHARE of the step
SLOW_OP_MIN_SHARE = 0.05
FAMILIES = ("gloo:", "nccl:", "c10d::", "record_param_comms")
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "recv_", "recv_any_source", "recv_any_source_")

Key = tuple[int | None, str, int]  # (step, collective name, k-th of that name in the step)
Segment = tuple[float, float, str]  # [start, end) µs attributed to one user function label


def is_collective(name: str, family: str) -> bool:
    if not name.startswith(family):
        return False
    op = name[len(family) :].lstrip(":").lower()
    return op not in POINT_TO_POINT


def choose_family(ranks: Mapping[int, Sequence[Mapping[str, Any]]]) -> str | None:
    """The first collective family present on every rank (None: no common collectives)."""
    for family in FAMILIES:
        if all(
            any(e.get("ph") == "X" and is_collective(str(e.get("name", "")), family) for e in events)
            for events in ranks.values()
        ):
            return family
    return None


def steps_of(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, float, int]]:
    """``ProfilerStep#N`` spans as ``(start, end, N)``, by start."""
    out = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit():
            start = float(e["ts"])
            out.append((start, start + float(e.get("dur", 0.0)), int(name[len(STEP_PREFIX) :])))
    return sorted(out)


def _step_at(steps: Sequence[tuple[float, float, int]], t: float) -> int | None:
    i = bisect.bisect_right(steps, (t, float("inf"), 1 << 62)) - 1
    if i >= 0 and steps[i][0] <= t <= steps[i][1]:
        return steps[i][2]
    return None


def keyed_collectives(
    events: Sequence[Mapping[str, Any]], family: str, steps: Sequence[tuple[float, float, int]]
) -> dict[Key, tuple[float, float]]:
    """``{(step, name, k): (arrival, exit)}`` of one rank."""
    found = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e["name"]))
        for e in events
        if e.get("ph") == "X" and "ts" in e and is_collective(str(e.get("name", "")), family)
    )
    seen: dict[tuple[int | None, str], int] = defaultdict(int)
    out: dict[Key, tuple[float, float]] = {}
    for start, end, name in found:
        step = _step_at(steps, start)
        k = seen[(step, name)]
        seen[(step, name)] = k + 1
        out[(step, name, k)] = (start, end)
    return out


def _label(name: str) -> str | None:
    function, path, line = parse_function(name)
    if not is_user_file(path):
        return None
    return f"{function} ({path}:{line})"


def user_segments(events: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """Each thread's time as sorted segments, labelled by the innermost user call around them."""
    segments: list[Segment] = []
    for found in ThreadSpans(cast(dict[str, Any], e) for e in events if "ts" in e).python.values():
        calls = Calls.from_events(found)
        nest = calls.nest
        distinct, codes = name_codes(calls.ordered_names)
        labels = [_label(name) for name in distinct]
        label_codes = np.array([-1 if label is None else code for code, label in enumerate(labels)], dtype=np.intp)
        own = label_codes[codes] if len(codes) else codes
        effective = nest.inherited(own, own >= 0)
        lo, hi, owners = nest.segments()
        labelled = effective[owners] if len(owners) else owners
        kept = labelled >= 0
        named = [str(labels[code]) for code in labelled[kept].tolist()]
        segments += zip(lo[kept].tolist(), hi[kept].tolist(), named)
    segments.sort()
    return segments


def time_in(segments: Sequence[Segment], intervals: Iterable[tuple[float, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    starts = [s[0] for s in segments]
    longest = max((s[1] - s[0] for s in segments), default=0.0)
    for a, b in intervals:
        i = bisect.bisect_left(starts, a - longest)
        while i < len(segments) and segments[i][0] < b:
            s, e, label = segments[i]
            overlap = min(e, b) - max(s, a)
            if overlap > 0:
                out[label] += overlap
            i += 1
    return out


def analyze_straggler(ranks: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The job summary's ``straggler`` block for one window (see the module docstring)."""
    out: dict[str, Any] = {
        "family": None,
        "collectives": 0,
        "steps": [],
        "wait_ms_per_step": [],
        "straggler": None,
        "thresholds": {"min_share_of_step": MIN_SHARE, "min_wait_ms": MIN_WAIT_MS},
    }
    if len(ranks) < 2:
        return out
    family = choose_family(ranks)
    out["family"] = family
    if family is None:
        return out
    steps = {r: steps_of(events) for r, events in ranks.items()}
    keyed = {r: keyed_collectives(events, family, steps[r]) for r, events in ranks.items()}
    first = keyed[min(keyed)]
    common = sorted(set.intersection(*(set(k) for k in keyed.values())), key=lambda k: first[k][0])
    out["collectives"] = len(common)
    step_ms = {
        n: statistics.fmean(e - s for r in ranks for s, e, m in steps[r] if m == n) / 1000.0
        for n in sorted({m for r in ranks for _, _, m in steps[r]})
    }
    caused, waited, late_at = _waits(common, keyed)
    counted_steps = [n for n in step_ms if n in caused] or list(step_ms)
    out["steps"] = _step_rows(step_ms, caused)
    per_step = max(len(counted_steps), 1)
    out["wait_ms_per_step"] = [
        {"rank": r, "wait_ms": round(waited.get(r, 0.0) / 1000.0 / per_step, 3)} for r in sorted(ranks)
    ]
    total_caused: dict[int, float] = defaultdict(float)
    for by_rank in caused.values():
        for r, us in by_rank.items():
            total_caused[r] += us
    if not total_caused or not step_ms:
        return out
    candidate = max(total_caused, key=lambda r: (total_caused[r] - waited.get(r, 0.0), -r))
    mean_wait_ms = total_caused[candidate] / 1000.0 / per_step
    own_wait_ms = waited.get(candidate, 0.0) / 1000.0 / per_step
    net_ms = mean_wait_ms - own_wait_ms
    mean_step_ms = statistics.fmean(step_ms.values())
    share = net_ms / mean_step_ms if mean_step_ms > 0 else 0.0
    out["candidate"] = {
        "rank": candidate,
        "others_wait_ms": round(mean_wait_ms, 3),
        "own_wait_ms": round(own_wait_ms, 3),
        "share_of_step": round(share, 4),
    }
    if net_ms < MIN_WAIT_MS or share < MIN_SHARE:
        return out
    verdict: dict[str, Any] = {
        "rank": candidate,
        "others_wait_ms": round(mean_wait_ms, 3),
        "own_wait_ms": round(own_wait_ms, 3),
        "step_ms": round(mean_step_ms, 3),
        "share_of_step": round(share, 4),
        "late_in_steps": sum(1 for s in out["steps"] if s["late_rank"] == candidate),
        "steps": len(out["steps"]),
    }
    verdict.update(_where(ranks, keyed, steps, candidate, late_at[candidate], per_step))
    verdict["explains_share"] = round(min(verdict["excess_ms"] / mean_wait_ms, 1.0), 3) if mean_wait_ms > 0 else 0.0
    verdict["unattributed_ms"] = round(max(mean_wait_ms - verdict["excess_ms"], 0.0), 3)
    out["straggler"] = verdict
    return out


def _waits(
    common: Sequence[Key], keyed: Mapping[int, Mapping[Key, tuple[float, float]]]
) -> tuple[dict[int | None, dict[int, float]], dict[int, float], dict[int, list[Key]]]:
    """Per collective the last rank and the others' wait: per step and late rank the mean wait, per
    rank its own total wait, and the collectives each was last at (µs)."""
    caused: dict[int | None, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    waited: dict[int, float] = defaultdict(float)
    late_at: dict[int, list[Key]] = defaultdict(list)
    for key in common:
        arrivals = {r: keyed[r][key][0] for r in keyed}
        last = max(arrivals, key=lambda r: (arrivals[r], -r))
        waits = {r: arrivals[last] - t for r, t in arrivals.items() if r != last}
        for r, w in waits.items():
            waited[r] += w
        caused[key[0]][last] += statistics.fmean(waits.values())
        late_at[last].append(key)
    return caused, waited, late_at


def _step_rows(step_ms: Mapping[int, float], caused: Mapping[int | None, Mapping[int, float]]) -> list[dict[str, Any]]:
    """The ``steps`` rows: each step's time, the rank the others waited for most, and how long."""
    rows: list[dict[str, Any]] = []
    for n in step_ms:
        by_rank = caused.get(n, {})
        late = max(by_rank, key=lambda r: by_rank[r]) if by_rank else None
        rows.append(
            {
                "step": n,
                "step_ms": round(step_ms[n], 3),
                "late_rank": late,
                "others_wait_ms": round(by_rank[late] / 1000.0, 3) if late is not None else 0.0,
            }
        )
    return rows


def _thread(event: Mapping[str, Any]) -> tuple[Any, Any]:
    return event.get("pid"), event.get("tid")


def _interval(
    keyed: Mapping[Key, tuple[float, float]], steps: Sequence[tuple[float, float, int]], key: Key
) -> tuple[float, float]:
    """From the rank's previous collective's exit (or the step's start) to its arrival at ``key``."""
    arrival = keyed[key][0]
    begin = next((s for s, e, n in steps if n == key[0]), None)
    previous = [end for start, end in keyed.values() if end <= arrival]
    begin = max([*previous, *([begin] if begin is not None else [])], default=arrival)
    return (min(begin, arrival), arrival)


def _where(
    ranks: Mapping[int, Sequence[Mapping[str, Any]]],
    keyed: Mapping[int, Mapping[Key, tuple[float, float]]],
    steps: Mapping[int, Sequence[tuple[float, float, int]]],
    late: int,
    keys: Sequence[Key],
    per_step: int,
) -> dict[str, Any]:
    """The late rank's user function with the largest excess over the others' mean, on each rank's training
    thread (which issues the collectives: other threads are off the critical path)."""
    excess: dict[str, float] = defaultdict(float)
    times = {}
    for r, events in ranks.items():
        training = next((_thread(e) for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)), None)
        segments = user_segments(e for e in events if _thread(e) == training)
        times[r] = time_in(segments, [_interval(keyed[r], steps[r], k) for k in keys])
    others = [r for r in ranks if r != late]
    for label in set().union(*times.values()):
        excess[label] = times[late].get(label, 0.0) - statistics.fmean(times[o].get(label, 0.0) for o in others)
    if not excess:
        return {"function": None, "file": None, "line": None, "excess_ms": 0.0}
    label = max(excess, key=lambda k: excess[k])
    if excess[label] <= 0:
        return {"function": None, "file": None, "line": None, "excess_ms": 0.0}
    function, path, line = parse_function(label)
    return {"function": function, "file": path, "line": line, "excess_ms": round(excess[label] / 1000.0 / per_step, 3)}


def slow_ops(
    ms_per_step: Mapping[int, Mapping[str, float]], step_ms: float, family: str | None
) -> list[dict[str, Any]]:
    """Ops much slower on one rank than another (``SLOW_OP_RATIO`` and a floor apart); a collective's time
    is waiting, on whichever rank the backend waits, so it is worded as such."""
    found = []
    for name in sorted({name for ops in ms_per_step.values() for name in ops}):
        by_rank = {r: float(ops.get(name, 0.0)) for r, ops in ms_per_step.items()}
        slow, fast = max(by_rank, key=lambda r: by_rank[r]), min(by_rank, key=lambda r: by_rank[r])
        spread = by_rank[slow] - by_rank[fast]
        if by_rank[slow] < SLOW_OP_RATIO * by_rank[fast] or spread < max(SLOW_OP_MIN_MS, SLOW_OP_MIN_SHARE * step_ms):
            continue
        collective = any(name.startswith(f) for f in (family, *FAMILIES) if f)
        others = ", ".join(f"{by_rank[r]:.2f} on rank {r}" for r in sorted(by_rank) if r != slow)
        text = f"{name}: {by_rank[slow]:.2f} ms/step on rank {slow}, {others}"
        found.append(
            {
                "name": name,
                "collective": collective,
                "ms_per_step": {str(r): round(v, 3) for r, v in sorted(by_rank.items())},
                "slow_rank": slow,
                "spread_ms": round(spread, 3),
                "text": text + (": time in the collective (waiting), see the straggler" if collective else ""),
            }
        )
    return sorted(found, key=lambda op: op["spread_ms"], reverse=True)
