"""The run budget (issue 22: 9): by default profiling takes at most a documented share of a run
(windows, bytes, time); past it no window opens. The budget's arithmetic and its options, with no
Trainer (a real run meeting each limit: tests/integration/test_budget.py)."""

from __future__ import annotations

import pytest

from vt_lightning.analysis.budget import MIB, BudgetLimits, RunBudget, size_text


def test_overhead_may_pass_the_grace_then_only_its_share_of_the_run():
    budget = RunBudget(BudgetLimits(budget_output_mb=None, budget_time_share=0.1, grace_seconds=3), started_at=0.0)
    budget.spent(2.9, batches=0)  # a window's time beyond its batches (no batch ran in it)
    assert budget.exhausted(now=10.0, batch=100) is None  # 2.9 s: under the 3 s grace
    budget.spent(0.2, batches=0)
    reached = budget.exhausted(now=10.0, batch=100)
    assert reached is not None and reached.limit == "time" and reached.option == "budget_time_share"
    assert "budget_time_share=0.1" in reached.message and "3.1 s" in reached.message
    assert budget.exhausted(now=100.0, batch=1000) is None  # 3.1 s of 100 s: room again as the run goes on


def test_a_window_of_slow_batches_costs_only_what_it_adds_to_them():
    # 100 batches of 1 s; a window of 10 of them took 10.5 s: 0.5 s of overhead, whatever its length.
    budget = RunBudget(BudgetLimits(budget_output_mb=None, budget_time_share=0.1, grace_seconds=0.1), started_at=0.0)
    budget.spent(10.5, batches=10)
    assert budget.overhead(now=100.5, batch=100) == pytest.approx(0.5)
    assert budget.exhausted(now=100.5, batch=100) is None  # 0.5 s of 100.5 s
    # A one-batch window at every batch: no quiet batch to compare with, all of it is overhead.
    every = RunBudget(BudgetLimits(budget_output_mb=None, budget_time_share=0.1, grace_seconds=0.1), started_at=0.0)
    every.spent(2.0, batches=50)
    assert every.overhead(now=2.0, batch=50) == pytest.approx(2.0)
    assert every.exhausted(now=2.0, batch=50) is not None


def test_a_resumed_run_counts_its_quiet_batches_from_its_first():
    budget = RunBudget(BudgetLimits(budget_output_mb=None), started_at=0.0, first_batch=1000)
    budget.spent(11.0, batches=10)
    # 90 quiet batches in 90 s since batch 1000: 1 s each, so the window added 1 s.
    assert budget.overhead(now=101.0, batch=1100) == pytest.approx(1.0)


def test_bytes_written_stop_windows_at_the_limit():
    budget = RunBudget(BudgetLimits(budget_output_mb=1.0, budget_time_share=None), started_at=0.0)
    budget.wrote(MIB - 1)
    assert budget.exhausted(now=1.0, batch=1) is None
    budget.wrote(1)
    reached = budget.exhausted(now=1.0, batch=1)
    assert reached is not None and reached.option == "budget_output_mb" and "budget_output_mb=1" in reached.message


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(0.05 * MIB, "51.2 KiB"), (900, "900 B"), (3 * MIB, "3 MiB"), (1536 * MIB, "1.5 GiB"), (1023.9 * MIB, "1024 MiB")],
)
def test_sizes_are_said_in_the_unit_that_fits(nbytes, text):
    assert size_text(nbytes) == text


def test_a_small_bytes_limit_is_reported_in_the_unit_that_fits():
    budget = RunBudget(BudgetLimits(budget_output_mb=0.05, budget_time_share=None), started_at=0.0)
    budget.wrote(int(0.06 * MIB))
    reached = budget.exhausted(1.0, 10)
    assert reached is not None and "reached 61.4 KiB" in reached.message, reached


def test_lifted_limits_never_stop_windows():
    budget = RunBudget(BudgetLimits(budget_output_mb=None, budget_time_share=None), started_at=0.0)
    budget.spent(1e9, batches=0)
    budget.wrote(10**15)
    assert budget.exhausted(now=1.0, batch=1) is None


@pytest.mark.parametrize(
    "name, bad",
    [
        ("budget_time_share", 0),
        ("budget_time_share", 1.5),
        ("budget_time_share", float("nan")),
        ("budget_output_mb", -1),
        ("budget_output_mb", float("inf")),
        ("budget_output_mb", "10"),
        ("budget_windows", 0),
    ],
)
def test_bad_budget_limits_are_refused_naming_the_argument(name, bad):
    from vt_lightning import VizTraceCallback

    with pytest.raises(ValueError, match=f"`{name}`"):
        VizTraceCallback(**{name: bad})


def test_every_budget_limit_can_be_lifted():
    from vt_lightning import VizTraceCallback

    options = VizTraceCallback(budget_windows=None, budget_output_mb=None, budget_time_share=None).options
    assert options.triggers.max_windows is None
    assert options.budget.budget_output_mb is None and options.budget.budget_time_share is None
