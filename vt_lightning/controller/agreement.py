"""DDP: every rank opens the same triggered window at the same batch. At each coarse check (the
same batch on every rank) the ranks exchange what fired with one all-reduce (MAX) of
``1 + len(REASONS)`` int64s on a gloo group of their own, off the GPU. Slot 0 holds minus the
batches each proposes until the next check (the smallest wins); a slot per reason holds
``(2**40 - batch) * 2**20 + (2**20 - 1 - rank)`` if it fired, else 0 (the earliest batch wins, the
lowest rank on a tie). Only when something fired, a second all-reduce gives all the winner's numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from vt_lightning.analysis.triggers import MEMORY_GROWTH, REASONS, SLOW_STEP, Firing

_BATCH_LIMIT = 1 << 40
_RANK_LIMIT = 1 << 20

ReduceMax = Callable[[list[int]], list[int]]
ReduceSum = Callable[[list[float]], list[float]]


def encode(firings: Sequence[Firing], gap: int, rank: int) -> list[int]:
    slots = [-gap] + [0] * len(REASONS)
    for firing in firings:
        slot = 1 + REASONS.index(firing.reason)
        key = (_BATCH_LIMIT - firing.batch) * _RANK_LIMIT + (_RANK_LIMIT - 1 - rank)
        slots[slot] = max(slots[slot], key)
    return slots


def decode(reduced: Sequence[int]) -> tuple[tuple[str, int, int] | None, int]:
    """((reason, batch, rank) of the winner or None, agreed gap)."""
    gap = -int(reduced[0])
    for reason, key in zip(REASONS, reduced[1:]):  # REASONS is in priority order
        if key > 0:
            batch = _BATCH_LIMIT - key // _RANK_LIMIT
            rank = _RANK_LIMIT - 1 - key % _RANK_LIMIT
            return (reason, int(batch), int(rank)), gap
    return None, gap


class Agreement:
    """Agree on at most one firing per check, and on the gap to the next check."""

    def __init__(self, rank: int, reduce_max: ReduceMax | None = None, reduce_sum: ReduceSum | None = None) -> None:
        self.rank = rank
        self.reduce_max = reduce_max
        self.reduce_sum = reduce_sum

    @property
    def distributed(self) -> bool:
        return self.reduce_max is not None

    def agree(
        self, firings: Sequence[Firing], gap: int, detail: Callable[[str], str | None] = lambda reason: None
    ) -> tuple[Firing | None, int]:
        if self.reduce_max is None or self.reduce_sum is None:  # one process: nothing to agree on
            first = min(firings, key=lambda firing: REASONS.index(firing.reason), default=None)  # by priority
            return (dataclasses.replace(first, rank=self.rank) if first is not None else None), gap
        winner, agreed_gap = decode(self.reduce_max(encode(firings, gap, self.rank)))
        if winner is None:
            return None, agreed_gap
        reason, batch, rank = winner
        mine = next((f for f in firings if f.reason == reason), None) if rank == self.rank else None
        numbers = [0.0, 0.0, 0.0]
        if mine is not None and mine.value is not None:
            numbers = [1.0, float(mine.value), float(mine.baseline or 0.0)]
        have, value, baseline = self.reduce_sum(numbers)
        if mine is not None:
            return dataclasses.replace(mine, rank=rank), agreed_gap
        unit = {SLOW_STEP: "s", MEMORY_GROWTH: "bytes"}.get(reason) if have else None
        firing = Firing(reason, batch, value if have else None, baseline if have else None, unit, rank, detail(reason))
        return firing, agreed_gap


def first_failure(problem: str | None) -> tuple[int, str] | None:
    """(rank, problem) of the lowest rank with a ``problem``, on every rank: one rank's failure stops all."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return (0, problem) if problem is not None else None
    gathered: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problem)
    return next(((rank, found) for rank, found in enumerate(gathered) if found is not None), None)


def gloo_agreement(rank: int, ranks: Sequence[int] | None) -> tuple[Agreement, Any]:
    """(An Agreement over a new gloo group of ``ranks`` (None: all), the group); collective."""
    group = dist.new_group(ranks=list(ranks) if ranks is not None else None, backend="gloo")

    def reduce_max(values: list[int]) -> list[int]:
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        return tensor.tolist()

    def reduce_sum(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor.tolist()

    return Agreement(rank, reduce_max, reduce_sum), group
