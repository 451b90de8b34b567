"""The nesting engine (analysis/nest.py) against plain walks written here: whatever the intervals
(ties, zero lengths, siblings that touch, a function inside itself, calls that outlast their
parent), its order, parents, ends, depths, closing order, self and inclusive time, its moments and
its queries are the reference's; the tables read off it are the reference loop's to the bit; and
no other module of analysis/ or export/ walks nested intervals on its own."""

from __future__ import annotations

import ast
import random
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import REPO

from vt_lightning.analysis import nest as engine
from vt_lightning.analysis.nest import DROP_PARENT, SKIP, Nest, covering, lanes, outer_first, outer_first_order, walk
from vt_lightning.analysis.python_tables import PythonStats
from vt_lightning.analysis.trace import Calls
from vt_lightning.analysis.verdicts.window import Timeline

USER = "/home/me/project/data.py"
LIB = "/usr/lib/python3.11/site-packages/PIL/Image.py"
NAMES = [
    f"__getitem__ ({USER}:10)",
    f"augment ({USER}:20)",
    f"resize ({LIB}:5)",
    f"crop ({LIB}:9)",
    "<built-in method sleep>",
    "[gc] generation 0",
]


# --------------------------------------------------------------------------------------------------
# The reference: one sort on (start, -end), then a stack of open intervals
# --------------------------------------------------------------------------------------------------


def reference_order(starts: list[float], ends: list[float]) -> list[int]:
    return sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))


def reference_walk(starts: list[float], ends: list[float], clip: bool = True) -> dict[str, Any]:
    """Parents, nested ends, depths, the order intervals close in, and each one's self time (its
    length less its children's, children added in order), by a stack of open intervals."""
    parents: list[int] = []
    nested: list[float] = []
    depths: list[int] = []
    closing: list[int] = []
    children = [0.0] * len(starts)
    stack: list[int] = []
    for i, (start, end) in enumerate(zip(starts, ends)):
        while stack and nested[stack[-1]] <= start:
            closing.append(stack.pop())
        parent = stack[-1] if stack else -1
        if clip and parent >= 0 and end > nested[parent]:
            end = nested[parent]
        parents.append(parent)
        nested.append(end)
        depths.append(len(stack))
        if parent >= 0:
            children[parent] += end - start
        stack.append(i)
    open_at_end = len(stack)
    closing += reversed(stack)
    own = [(nested[i] - starts[i]) - children[i] for i in range(len(starts))]
    return {
        "parents": parents,
        "ends": nested,
        "depths": depths,
        "closing": closing,
        "own": own,
        "open_at_end": open_at_end,
    }


def reference_moments(starts: list[float], walked: dict[str, Any]) -> list[tuple[float, float, int]]:
    """The stretches of the walk: before each start, its parent owns the time since the last
    moment; at each close, the closing interval does."""
    out: list[tuple[float, float, int]] = []
    cursor = 0.0
    stack: list[int] = []
    parents, nested = walked["parents"], walked["ends"]
    for i, start in enumerate(starts):
        while stack and stack[-1] != parents[i]:
            done = stack.pop()
            if nested[done] > cursor:
                out.append((cursor, nested[done], done))
            cursor = nested[done]
        if parents[i] >= 0 and start > cursor:
            out.append((cursor, start, parents[i]))
        cursor = start
        stack.append(i)
    while stack:
        done = stack.pop()
        if nested[done] > cursor:
            out.append((cursor, nested[done], done))
        cursor = nested[done]
    return out


# --------------------------------------------------------------------------------------------------
# Intervals
# --------------------------------------------------------------------------------------------------


@st.composite
def intervals(draw: Any, max_size: int = 60) -> tuple[list[float], list[float]]:
    """Starts and ends on a coarse grid (ties and touching siblings are common), some of zero
    length, nested, overlapping and crossing at random."""
    count = draw(st.integers(0, max_size))
    grid = draw(st.sampled_from((1.0, 0.5, 0.001)))
    starts, ends = [], []
    for _ in range(count):
        start = draw(st.integers(0, 40)) * grid
        length = draw(st.sampled_from((0, 0, 1, 2, 3, 5, 8, 13, 40))) * grid
        starts.append(start)
        ends.append(start + length)
    return starts, ends


def nested_calls(rng: random.Random, count: int) -> list[tuple[float, float, str]]:
    """Calls that nest, as a DataLoader worker's do once placed: children that start or end with
    their parent, zero-length calls, siblings that touch, a function inside itself."""
    calls: list[tuple[float, float, str]] = []

    def fill(lo: float, hi: float, depth: int) -> None:
        at = lo
        while len(calls) < count and at < hi and rng.random() < 0.8:
            start = at if rng.random() < 0.3 else rng.uniform(at, at + (hi - at) * rng.random())
            start = min(max(round(start, rng.choice((2, 9))), at), hi)
            pick = rng.random()
            end = start if pick < 0.05 else hi if pick < 0.2 else rng.uniform(start, hi)
            calls.append((start, end, rng.choice(NAMES)))
            if depth < 10 and end > start:
                fill(start, end, depth + 1)
            at = end

    origin = 0.1
    while len(calls) < count:
        region_end = origin + rng.uniform(1.0, 500.0)
        fill(origin, region_end, 0)
        origin = region_end + rng.choice((0.0, 0.3))
    return calls


def random_calls(rng: random.Random, count: int) -> list[tuple[float, float, str]]:
    """Calls nested, overlapping, tied and crossing at random, with float times that do not add
    up exactly."""
    calls = []
    for _ in range(count):
        start = round(rng.uniform(0.0, 1000.0), rng.choice((0, 1, 3)))
        calls.append((start, start + rng.uniform(0.01, 80.0) * rng.random(), rng.choice(NAMES)))
    return calls


# --------------------------------------------------------------------------------------------------
# The ordering and the walk
# --------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(intervals())
def test_the_order_is_by_start_the_longer_first_then_as_given(spans: tuple[list[float], list[float]]) -> None:
    starts, ends = spans
    expected = reference_order(starts, ends)
    items = list(zip(starts, ends, range(len(starts))))
    assert [item[2] for item in outer_first(items, lambda x: x[0], lambda x: x[1])] == expected
    assert outer_first_order(np.array(starts), np.array(ends)).tolist() == expected
    in_order = [items[i] for i in expected]  # given in order: kept as it is
    assert outer_first(in_order, lambda x: x[0], lambda x: x[1]) == in_order


@pytest.mark.parametrize("seed", range(5))
def test_events_come_out_by_ts_the_longer_first_in_a_new_list_whatever_order_they_came_in(seed: int) -> None:
    """A placed DataLoader worker's calls come in strictly increasing starts and are kept as given;
    calls in start order whose equal starts come shorter first, calls by end (a raw dump's) and
    shuffled calls are all sorted as ``sorted(key=(ts, -dur))`` sorts them."""
    rng = random.Random(seed)
    events = [
        {"ph": "X", "name": f"f{i}", "ts": round(rng.uniform(0.0, 500.0), rng.choice((0, 1, 3))), "dur": d}
        for i in range(400)
        for d in (round(rng.uniform(0.0, 40.0), 1),)
    ]
    by_definition = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    distinct = list({e["ts"]: e for e in by_definition}.values())
    assert len(distinct) < len(events), "the random calls should have equal starts"
    shuffled = list(events)
    rng.shuffle(shuffled)
    for given_order in (
        distinct,
        by_definition,
        sorted(events, key=lambda e: (e["ts"], e["dur"])),  # equal starts: the shorter first
        sorted(events, key=lambda e: e["ts"] + e["dur"]),  # by end
        shuffled,
    ):
        before = list(given_order)
        found = outer_first(given_order)
        assert found == sorted(given_order, key=lambda e: (e["ts"], -e["dur"]))
        assert found is not given_order and given_order == before  # a new list; the caller's is left as it was


@settings(max_examples=300, deadline=None)
@given(intervals(), st.booleans())
def test_the_walk_and_the_nest_are_the_stack_walks(spans: tuple[list[float], list[float]], clip: bool) -> None:
    starts, ends = spans
    order = reference_order(starts, ends)
    ordered_starts, ordered_ends = [starts[i] for i in order], [ends[i] for i in order]
    expected = reference_walk(ordered_starts, ordered_ends, clip)
    parents, nested = walk(ordered_starts, ordered_ends, clip=clip)
    assert (parents, nested) == (expected["parents"], expected["ends"])
    found = Nest(starts, ends, clip=clip)
    assert found.order.tolist() == order
    assert found.parents.tolist() == expected["parents"] and found.ends.tolist() == expected["ends"]
    assert found.depths.tolist() == expected["depths"]
    assert found.closing.tolist() == expected["closing"]
    assert found.open_at_end == expected["open_at_end"]
    if clip:  # self time, the moments (each double the same)
        assert [x.hex() for x in found.own.tolist()] == [x.hex() for x in expected["own"]]
        lo, hi, owners = found.segments()
        assert list(zip(lo.tolist(), hi.tolist(), owners.tolist())) == reference_moments(ordered_starts, expected)


@settings(max_examples=200, deadline=None)
@given(intervals(), st.lists(st.integers(0, 3), min_size=60, max_size=60))
def test_first_opened_and_inherited_are_the_stacks(spans: tuple[list[float], list[float]], keys: list[int]) -> None:
    starts, ends = spans
    found = Nest(starts, ends)
    count = len(found)
    key = np.array(keys[:count], dtype=np.intp) - 1  # -1: no key
    open_keys: dict[int, int] = defaultdict(int)
    first, stack, inherit = [], [], []
    keeps = key >= 1
    for i in range(count):
        while stack and stack[-1] != found.parents[i]:
            open_keys[int(key[stack.pop()])] -= 1
        first.append(not open_keys[int(key[i])])
        parent = int(found.parents[i])
        inherit.append(int(key[i]) if keeps[i] else (inherit[parent] if parent >= 0 else -1))
        open_keys[int(key[i])] += 1
        stack.append(i)
    assert found.first_opened(key).tolist() == first
    assert found.inherited(key, keeps).tolist() == inherit


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from((1, 7, 400, 1500, 5000)))
def test_a_long_thread_nested_as_arrays_is_the_walks(seed: int, count: int) -> None:
    """From ``ARRAY_NEST_MIN`` intervals on, a thread none of which outlasts its parent is nested
    from sorted searches: the same parents, depths and ends as the walk."""
    calls = nested_calls(random.Random(seed), count)
    starts, ends = [c[0] for c in calls], [c[1] for c in calls]
    as_arrays = Nest(starts, ends)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "ARRAY_NEST_MIN", count + 1)
        as_loop = Nest(starts, ends)
    assert as_arrays.parents.tolist() == as_loop.parents.tolist()
    assert as_arrays.ends.tolist() == as_loop.ends.tolist()
    assert as_arrays.depths.tolist() == as_loop.depths.tolist()
    assert engine.nests(as_arrays.starts, as_arrays.ends)


def test_a_thread_with_a_call_outlasting_its_parent_is_walked() -> None:
    calls = random_calls(random.Random(0), 2000)
    starts, ends = [c[0] for c in calls], [c[1] for c in calls]
    found = Nest(starts, ends)
    order = reference_order(starts, ends)
    assert not engine.nests(np.array([starts[i] for i in order]), np.array([ends[i] for i in order]))
    expected = reference_walk([starts[i] for i in order], [ends[i] for i in order])
    assert found.parents.tolist() == expected["parents"] and found.ends.tolist() == expected["ends"]


def test_crossing_policies_cut_skip_or_drop_the_parent() -> None:
    """A call outlasting its parent is cut where the policy says; a skipped interval is nobody's
    parent; a dropped parent leaves the interval to nest in the next one down."""
    starts = [0.0, 1.0, 2.0, 3.0, 6.0]
    ends = [10.0, 5.0, 7.0, 4.0, 6.5]
    seen: list[tuple[int, int, float]] = []

    def skip(i: int, parent: int, parent_end: float) -> Any:
        seen.append((i, parent, parent_end))
        return SKIP

    parents, _ = walk(starts, ends, crossing=skip)
    assert seen == [(2, 1, 5.0)]  # [2, 7] crosses [1, 5]
    assert parents == [-1, 0, 1, 1, 0]  # [3, 4] is [1, 5]'s, not the skipped one's; [6, 6.5] is [0, 10]'s
    parents, nested = walk(starts, ends, crossing=lambda i, parent, parent_end: DROP_PARENT)
    assert parents == [-1, 0, 0, 2, 2] and nested == ends  # [2, 7] nests in [0, 10] once [1, 5] is dropped
    parents, nested = walk(starts, ends, crossing=lambda i, parent, parent_end: parent_end - 0.5)
    assert parents == [-1, 0, 1, 2, 0] and nested == [10.0, 5.0, 4.5, 4.0, 6.5]


# --------------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(intervals(), st.lists(st.integers(-2, 90), max_size=30), st.booleans())
def test_covering_is_every_interval_holding_the_instant(
    spans: tuple[list[float], list[float]], instants: list[int], inclusive: bool
) -> None:
    starts, ends = spans
    order = reference_order(starts, ends)
    ordered_starts, ordered_ends = [starts[i] for i in order], [ends[i] for i in order]
    times = sorted(t * 0.5 for t in instants)
    ordered = list(zip(ordered_starts, ordered_ends, range(len(order))))
    found = covering(ordered, times, inclusive)
    for t, got in zip(times, found):
        holds = [iv for iv in ordered if (iv[0] <= t <= iv[1] if inclusive else iv[0] < t < iv[1])]
        assert got == holds


@settings(max_examples=200, deadline=None)
@given(intervals())
def test_lanes_hold_no_two_intervals_that_cross(spans: tuple[list[float], list[float]]) -> None:
    starts, ends = spans
    order = reference_order(starts, ends)
    ordered = [(starts[i], ends[i]) for i in order]
    numbers = lanes([s for s, _ in ordered], [e for _, e in ordered])
    for lane in set(numbers):
        on_lane = [span for span, number in zip(ordered, numbers) if number == lane]
        for a, (s1, e1) in enumerate(on_lane):
            for s2, e2 in on_lane[a + 1 :]:
                assert not (s1 < s2 < e1 < e2), (s1, e1, s2, e2)  # later ones start inside or after


# --------------------------------------------------------------------------------------------------
# The tables read off the nest, to the bit
# --------------------------------------------------------------------------------------------------


def reference_tables(calls: list[tuple[float, float, str]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per function: calls, self time (added where positive, as calls close; the ones open at the
    end from the outermost), inclusive time (a call inside one of the same name counts once); and
    the timeline's entry times (µs per user entry, and per entry and innermost user callee)."""
    order = reference_order([c[0] for c in calls], [c[1] for c in calls])
    ordered = [calls[i] for i in order]
    walked = reference_walk([c[0] for c in ordered], [c[1] for c in ordered])
    table: dict[str, list[Any]] = {}
    open_names: dict[str, int] = defaultdict(int)
    stack: list[int] = []
    parents, nested = walked["parents"], walked["ends"]
    children = [0.0] * len(ordered)

    def close(done: int) -> None:
        own = nested[done] - ordered[done][0] - children[done]
        if own > 0:
            table[ordered[done][2]][1] += own

    for i, (start, _, name) in enumerate(ordered):
        while stack and stack[-1] != parents[i]:
            done = stack.pop()
            close(done)
            open_names[ordered[done][2]] -= 1
        row = table.setdefault(name, [0, 0.0, 0.0])
        row[0] += 1
        if not open_names[name]:
            row[2] += nested[i] - start
        open_names[name] += 1
        if parents[i] >= 0:
            children[parents[i]] += nested[i] - start
        stack.append(i)
    for done in stack:
        close(done)
    entries: dict[str, float] = defaultdict(float)
    callees: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for start, end, _, found_user, entry, _ in Timeline(Calls.of(calls)).segments:
        if entry:
            entries[entry] += end - start
            if found_user and found_user != entry:
                callees[entry][found_user] += end - start
    return (
        {name: (row[0], row[1].hex(), row[2].hex()) for name, row in table.items()},
        {
            "entries": [(k, v.hex()) for k, v in entries.items()],
            "callees": [(k, sorted(v.items())) for k, v in callees.items()],
        },
    )


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from((1, 2, 7, 60, 400, 1500)), st.booleans())
def test_tables_and_entry_times_are_the_reference_loops_to_the_bit(seed: int, count: int, nested: bool) -> None:
    rng = random.Random(seed)
    calls = nested_calls(rng, count) if nested else random_calls(rng, count)
    table, times = reference_tables(calls)
    stats = PythonStats()
    found = Calls.of(calls)
    distinct, codes = stats.add((1, 1), found.nest, found.ordered_names)
    functions, _ = stats.threads[(1, 1)]
    assert {name: (s.calls, s.self_us.hex(), s.inclusive_us.hex()) for name, s in functions.items()} == table
    assert list(functions) == list(table)  # keys in the order calls first start
    entries, callees = stats.entry_times(found.nest, distinct, codes)
    assert [(k, v.hex()) for k, v in entries.items()] == times["entries"]
    assert [(k, sorted(v.items())) for k, v in callees.items()] == times["callees"]


# --------------------------------------------------------------------------------------------------
# One engine: no other module walks nested intervals
# --------------------------------------------------------------------------------------------------

PACKAGE = REPO / "vt_lightning"
ENGINE = PACKAGE / "analysis" / "nest.py"


def stack_walks(source: str) -> list[str]:
    """What walks nested intervals by itself in ``source``: a loop that pops a list while its last
    item says so (``while stack and stack[-1][1] <= start: stack.pop()``), a sorted search over
    interval bounds (``searchsorted``), and a sort key of its own by start and descending end
    (``key=lambda c: (c[0], -c[1])``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.While):
            tops = {
                sub.value.id
                for sub in ast.walk(node.test)
                if isinstance(sub, ast.Subscript)
                and isinstance(sub.value, ast.Name)
                and isinstance(sub.slice, ast.UnaryOp)
                and isinstance(sub.slice.op, ast.USub)
            }
            pops = {
                call.func.value.id
                for statement in node.body
                for call in ast.walk(statement)
                if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "pop"
                and isinstance(call.func.value, ast.Name)
            }
            if tops & pops:
                found.append(f"line {node.lineno}: a stack of open intervals ({', '.join(sorted(tops & pops))})")
        elif isinstance(node, ast.Attribute) and node.attr == "searchsorted":
            found.append(f"line {node.lineno}: searchsorted")
        elif isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id == "sorted")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "sort")
        ):
            for keyword in node.keywords:
                body = keyword.value.body if isinstance(keyword.value, ast.Lambda) else None
                if (
                    keyword.arg == "key"
                    and isinstance(body, ast.Tuple)
                    and any(isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) for e in body.elts[1:])
                ):
                    found.append(f"line {node.lineno}: a (start, -end) sort key")
    return found


def test_the_detector_finds_a_walk_of_its_own() -> None:
    sample = """
spans.sort(key=lambda span: (span[0], -span[1]))
stack = []
for start, end in spans:
    while stack and stack[-1] <= start:
        stack.pop()
    stack.append(end)
parents = np.searchsorted(starts, ends)
"""
    assert len(stack_walks(sample)) == 3
    assert len(stack_walks(ENGINE.read_text(encoding="utf-8"))) >= 3  # the engine's own are found


def test_no_module_of_analysis_or_export_walks_nested_intervals_but_the_engine() -> None:
    """A second walk over nested intervals is a second implementation of the engine: it drifts
    from it (ties, zero lengths, a call outlasting its parent) and costs a pass per thread."""
    offenders = {}
    for path in sorted([*(PACKAGE / "analysis").rglob("*.py"), *(PACKAGE / "export").rglob("*.py")]):
        if path == ENGINE:
            continue
        found = stack_walks(path.read_text(encoding="utf-8"))
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert not offenders, f"ask analysis/nest.py instead: {offenders}"
