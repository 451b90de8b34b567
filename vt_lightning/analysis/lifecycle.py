"""The window lifecycle as a transition table, after ``torch.profiler.profile.step()``'s action map:
a new phase or boundary is a new row, not a new branch. ``BATCH_START``: (the open window's phase,
this batch's); ``BATCH_END``: (this batch's, the next one's in the window: ``NONE`` after its last
batch closes it at once, as there may be no next batch)."""

from __future__ import annotations

import enum

from vt_lightning.analysis.schedule import Phase, Window


class Boundary(enum.Enum):
    BATCH_START = "batch_start"
    BATCH_END = "batch_end"


class Action(enum.Enum):
    """What the controller does at a boundary, in the order the table lists them."""

    OPEN = "open"  # check for rivals and writer room, then prepare torch.profiler (warmup)
    BEGIN_STEP = "begin_step"  # start recording if not yet, open ``ProfilerStep#<batch>``
    END_STEP = "end_step"  # close ``ProfilerStep#<batch>`` (and open the next if still active)
    CLOSE = "close"  # stop everything, hand the immutable job to the writer


_S, _E = Boundary.BATCH_START, Boundary.BATCH_END
_N, _W, _A = Phase.NONE, Phase.WARMUP, Phase.ACTIVE

TRANSITIONS: dict[tuple[Boundary, Phase, Phase], tuple[Action, ...]] = {
    (_S, _N, _N): (),
    (_S, _N, _W): (Action.OPEN,),
    (_S, _N, _A): (Action.OPEN, Action.BEGIN_STEP),  # warmup=0
    (_S, _W, _W): (),
    (_S, _W, _A): (Action.BEGIN_STEP,),
    (_S, _A, _A): (Action.BEGIN_STEP,),
    (_S, _W, _N): (Action.CLOSE,),  # the window ended unseen (nothing recorded: no file)
    (_S, _A, _N): (Action.CLOSE,),  # its last batch end was never seen
    (_E, _N, _N): (),
    (_E, _W, _W): (),
    (_E, _W, _A): (),  # recording starts at the next batch start, not before its data fetch
    (_E, _A, _A): (Action.END_STEP,),
    (_E, _A, _N): (Action.END_STEP, Action.CLOSE),
    (_E, _W, _N): (Action.CLOSE,),
}


def actions(boundary: Boundary, previous: Phase, current: Phase) -> tuple[Action, ...]:
    """The actions between two phases at a boundary (KeyError: a transition that cannot happen)."""
    return TRANSITIONS[(boundary, previous, current)]


def phase_in(window: Window, step: int) -> Phase:
    if step < window.warmup_start or step >= window.end:
        return Phase.NONE
    return Phase.ACTIVE if step >= window.active_start else Phase.WARMUP
