"""``nesting.outer_first``: the order every nesting pass walks a thread's calls in (by start, the
longer first at equal starts, equal ones as given), whichever order the calls come in."""

from __future__ import annotations

import random
from typing import Any

import pytest

from vt_lightning.analysis.nesting import outer_first

pytestmark = pytest.mark.unit


def _events(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    events = []
    for i in range(400):
        ts = round(rng.uniform(0.0, 500.0), rng.choice((0, 1, 3)))  # coarse ones tie
        events.append({"ph": "X", "name": f"f{i}", "ts": ts, "dur": round(rng.uniform(0.0, 40.0), 1)})
    return events


@pytest.mark.parametrize("seed", range(5))
def test_outer_first_is_by_start_then_longer_first_in_any_given_order(seed: int) -> None:
    """A placed DataLoader worker's calls come in strictly increasing starts and are kept as given;
    calls in start order whose equal starts come shorter first, calls by end (a raw dump's) and
    shuffled calls are all sorted as ``sorted(key=(ts, -dur))`` sorts them."""
    events = _events(seed)
    by_definition = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    distinct = list({e["ts"]: e for e in by_definition}.values())
    assert len(distinct) < len(events), "the random calls should have equal starts"
    shuffled = list(events)
    random.Random(seed).shuffle(shuffled)
    given_orders = (
        distinct,
        by_definition,
        sorted(events, key=lambda e: (e["ts"], e["dur"])),  # equal starts: the shorter first
        sorted(events, key=lambda e: e["ts"] + e["dur"]),  # by end
        shuffled,
    )
    for given in given_orders:
        before = list(given)
        found = outer_first(given)
        assert found == sorted(given, key=lambda e: (e["ts"], -e["dur"]))
        assert found is not given and given == before  # a new list; the caller's is left as it was
