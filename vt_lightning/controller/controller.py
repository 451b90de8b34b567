"""The window controller: at a batch boundary, the plan's phase and ``analysis.lifecycle``'s actions."""

from __future__ import annotations

import dataclasses
import math
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from vt_lightning.analysis.filters import PythonFilter, module_hook_locations, path_prefixes
from vt_lightning.analysis.lifecycle import Action, Boundary, actions, phase_in
from vt_lightning.analysis.schedule import Phase, Window
from vt_lightning.analysis.sources import Planned, WindowPlan
from vt_lightning.analysis.usercode import library_roots
from vt_lightning.constants import UNTRACED_WAIT_KEY
from vt_lightning.controller import messages, side_recorders, windows
from vt_lightning.controller import run as runs
from vt_lightning.controller.budget import BudgetGuard
from vt_lightning.controller.data_wait import UntracedWaits
from vt_lightning.controller.handoff import BackgroundWriter, finishes_at_end
from vt_lightning.controller.inbox import Inbox, Outcomes
from vt_lightning.controller.messages import WarnOnce
from vt_lightning.controller.triggers import ArmedTriggers, agree, arm
from vt_lightning.export.atomic import remove_stale_temporaries
from vt_lightning.options import Options
from vt_lightning.recording import clock_sync
from vt_lightning.recording.children import reap_dump_children
from vt_lightning.recording.memory import is_cuda_oom
from vt_lightning.recording.pytracer import PythonTracer
from vt_lightning.recording.spool import Spool, spool_directory
from vt_lightning.recording.window import ProfilingWindow

_S, _E = Boundary.BATCH_START, Boundary.BATCH_END
_LIVE: weakref.WeakSet[WindowController] = weakref.WeakSet()  # controllers alive in this process (forks)


class WindowController:
    """Windows of one callback, across the runs (fit / validate / ...) it sees."""

    # The clock of the slow-step trigger and the trigger checks (tests inject a deterministic one).
    step_clock: Callable[[], int] = staticmethod(time.perf_counter_ns)

    def __init__(self, options: Options) -> None:
        self.options = options
        self.python: PythonTracer | None = None  # one per process and configuration (see pytracer)
        self.reset(None)
        _LIVE.add(self)  # a forked child forgets this controller's windows: ``_forget_in_forked_child``

    def reset(self, stage: str | None) -> None:
        """Forget the previous run, or in a forked child the parent's windows, with no wait, write or removal."""
        o = self.options
        self.stage = stage
        self.next_look: float = math.inf  # batches started up to here need no look (the hot path)
        self.run: runs.Run | None = None
        self.warn = WarnOnce()
        self.plan = WindowPlan(o.schedule, o.scheduled_windows, o.triggers.max_windows, o.triggers.trigger_cooldown)
        self.planned: Planned | None = None  # what the open window is (scheduled, or why triggered)
        self.window: ProfilingWindow | None = None
        self.phase = Phase.NONE  # of the open window at the last boundary
        self.writer: BackgroundWriter | None = None
        self.spool: Spool | None = None
        self.triggers: ArmedTriggers | None = None
        self.slow: Any = None  # the watch's SlowStep, read on every batch when armed
        self.next_check: float = math.inf  # with the slow-step trigger: batches up to here only read the clock
        self.untraced = UntracedWaits()  # the data wait of untraced steps, fed by the callback on every batch
        self.inbox = Inbox()
        self.budget = BudgetGuard(o.budget, self.warn)
        self.outcomes = Outcomes(self.warn, o.python.tracer_entries)
        self.python_filter: PythonFilter | None = None
        self.trainer: Callable[[], Any] = lambda: None
        self.triggered_runs: list[tuple[str, Any]] = []  # (run directory, Firing)
        self.windows_skipped = 0
        self.windows_recorded = 0
        self.batches_seen = 0
        self.eval_step = -1  # batch index within a validate / test / predict stage
        self.first = 0  # the run's first batch: a resumed fit, or a Trainer's second fit, starts past 0
        self.started: tuple[int, int] | None = None  # (perf_counter_ns, the batch before the stage's first)

    def setup(self, trainer: Any, pl_module: Any, stage: str, superseded_by: str | None) -> None:
        if stage not in self.options.stages:
            return
        self.reset(stage)
        try:
            self._start_run(trainer, pl_module, stage, superseded_by)
        except BaseException:  # cleanup: a setup cut short (a fault, a refusal, Ctrl-C) installs nothing; re-raised
            self.shutdown()
            raise

    def _start_run(self, trainer: Any, pl_module: Any, stage: str, superseded_by: str | None) -> None:
        o = self.options
        run = self.run = runs.read_run(trainer, stage, o.dirpath, o.spool_dir)  # collective: first, on every rank
        self.trainer = weakref.ref(trainer)
        enabled, rival = runs.should_record(run, o, trainer, superseded_by, self.warn)
        if superseded_by is not None:
            self.stage = None
            return
        agreement, group = agree(trainer, o.triggers, o.ranks, self.warn) if rival is None else (None, None)
        clock_sync.prepare(o.ranks, rival is None, self.warn)  # collective: the job file's clock exchange
        if not enabled:
            return
        self.python = self.python or PythonTracer(o.python)  # reused: see pytracer._TRACERS
        self.python_filter = _python_filter(o, pl_module)
        self.writer = BackgroundWriter(timeout=o.writer_timeout, on_problem=self.inbox.notice)
        # Leftovers of writers killed mid-write; on the writer thread, as a hung mount must not hang setup.
        self.writer.submit(remove_stale_temporaries, run.root)
        self.spool = spool_directory(o.spool_dir)
        self.outcomes.start(self.spool, self.writer.submit, o.keep_windows)  # the full table, retention
        self.budget.start(runs.any_rank(trainer) if o.ranks is None else bool)
        if agreement is not None:
            self.triggers = arm(
                trainer, o.triggers, agreement, group, run.output, run.cuda, self.warn, self.step_clock,
                runs.global_batch(trainer) + 1, self._look_now,
            )  # fmt: skip
            self.slow = self.triggers.watch.slow
        if stage != "fit":  # fit's first batch and length are known only at train start (train_start)
            self._schedule_from(0)
            self.writer.prestart(self.plan.next_boundary(0), 0, None, cpu_bound=runs.trains_on_cpu(run))
        side_recorders.start_run(o, run, self.spool, trainer, self.plan, self.warn)  # DataLoader workers (workers.py)

    def train_start(self, trainer: Any) -> None:
        """Lightning restored a resumed fit's loops after ``on_fit_start``: the schedule counts from this
        fit's first batch now (as torch.profiler's from its own start), and the writer starts ahead of
        a first window within the run (``prestart``)."""
        if self.writer is not None and self.stage == "fit" and self.run is not None:
            first = self.first = runs.batches_started(trainer)
            schedule = self.options.schedule
            self.plan.schedule = dataclasses.replace(schedule, skip_first=schedule.skip_first + first)
            self.budget.budget.first_batch = first
            self.started = (time.perf_counter_ns(), first - 1)
            self._schedule_from(first)
            cpu_bound = runs.trains_on_cpu(self.run)
            end = runs.fit_end_batch(trainer)
            self.writer.prestart(self.plan.next_boundary(first), first - 1, end, cpu_bound=cpu_bound)

    def end_stage(self, stage: str, batches: int | None = None) -> None:
        """A stage ran out of batches (or fit ended): close what is open, wait for the writer."""
        if stage != self.stage:
            return
        self.batches_seen = batches if batches is not None else self.eval_step + 1
        self.finalize(runs.END_REASONS[stage])

    def finalize(self, reason: str, partial: bool = False) -> None:
        """Close the open window, then (whatever its close raised) wait for the writer and read its answers."""
        try:
            if self.window is not None:
                self._close(reason, partial, ending=True)
        finally:
            if self.writer is not None and not self.writer.drain():
                self.warn("writer-stuck-end", messages.writer_unfinished(self.options.writer_timeout, self._root()))
            self._read_inbox(log=True)

    def exception(self, exception: BaseException) -> None:
        """Lightning does not call teardown after on_exception: finish everything here."""
        try:
            if is_cuda_oom(exception) and self.window is not None and self.run is not None:
                windows.dump_oom(self.options, self.run, self.window, self.planned, self.warn)
            self.finalize(f"{type(exception).__name__} during the window", partial=True)
        finally:
            self.shutdown()

    def teardown(self, stage: str) -> None:
        if stage != self.stage:
            return
        try:
            self.finalize(runs.END_REASONS[stage])
            if self.writer is not None and not self.windows_recorded:  # enabled, and nothing to show
                messages.nothing_recorded(self.options, self.stage, self._span(), self.windows_skipped)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        writer, self.writer = self.writer, None
        try:  # a signal's exception on the way (Ctrl-C while the writer stops) still releases the run
            if writer is not None:
                if not writer.close():
                    self.warn("writer-stuck-end", messages.writer_unfinished(self.options.writer_timeout, self._root()))
                self._read_inbox(log=False)
                self.outcomes.skipped = self.windows_skipped
                messages.end_of_run(self._root(), self.outcomes, self.triggered_runs, self.stage, self._span())
        finally:
            side_recorders.end_run(self.trainer())
            reap_dump_children()  # of windows interrupted between their dump and their hand-off
            if self.spool is not None:
                self.spool.remove()
            if self.triggers is not None:
                self.triggers.disarm()  # kept for inspection until the next run
            self.spool, self.slow, self.stage = None, None, None
            self.next_look = self.next_check = math.inf

    def train_batch_start(self, trainer: Any, ready: int) -> None:
        """Past the callback's one-comparison gate (``ready``: batches started, this one included)."""
        slow = self.slow
        if slow is not None and slow.steady() and ready <= self.next_check:
            return
        self.batch_start(runs.global_batch(trainer))

    def eval_batch_start(self, stage: str) -> None:
        if stage == self.stage:
            self.eval_step += 1  # batches of this stage, across its dataloaders, from 0
            if self.eval_step == 0:
                self.started = (time.perf_counter_ns(), -1)
            if self.eval_step >= self.next_look:
                self.batch_start(self.eval_step)

    def batch_start(self, step: int) -> None:
        if self.inbox.outstanding or self.outcomes.unlogged:
            self._read_inbox(log=self.window is None)  # never log inside a window: it would be traced
        self._advance(step)

    def batch_end(self, step: int) -> None:
        window = self.window
        if window is None:
            return
        if self.slow is not None:
            self.slow.skip_next()  # a batch of a window is no baseline step, nor is the close after it
        self._run(_E, self.phase, phase_in(window.window, step + 1), step)

    def eval_batch_end(self, stage: str) -> None:
        if stage == self.stage:
            self.batch_end(self.eval_step)

    def not_a_step(self) -> None:
        """The interval to the next batch start is no training step (epoch edge, validation)."""
        self.untraced.not_a_step()
        if self.slow is not None:
            self.slow.skip_next()

    def range(self, kind: str, begin: bool) -> None:
        """``[pl][profile]<kind>`` around work inside a training window (validation)."""
        window = self.window
        if self.stage != "fit" or window is None or (begin and not window.active):
            return
        window.begin_range(kind) if begin else window.end_range(kind)

    def _advance(self, step: int) -> None:
        if self.window is not None:
            self._run(_S, self.phase, phase_in(self.window.window, step), step)
        if self.triggers is not None:
            self.triggers.ask(step, self.plan, self.options, self.warn)
        if self.window is not None:
            return
        if step < self.plan.busy_until:  # a window that began here (and was skipped or failed) holds it
            self._schedule_from(self.plan.busy_until)
            return
        planned = self.plan.next_window(step)
        if planned is None or step < planned.window.warmup_start:
            self._quiet_until(planned.window.warmup_start if planned is not None else math.inf)
            return
        if not self.budget.begin(self.plan, planned):  # spent: the plan is closed, said once
            self._quiet_until(math.inf)
            return
        target = dataclasses.replace(planned.window, index=planned.number)
        self.planned = planned
        self._run(_S, Phase.NONE, phase_in(target, step), step, target)

    def _run(
        self, boundary: Boundary, previous: Phase, current: Phase, step: int, target: Window | None = None
    ) -> None:
        for action in actions(boundary, previous, current):
            if action is Action.OPEN:
                assert target is not None and self.run is not None and self.python is not None and self.writer
                self.budget.opened()  # a window's cost: from here to its hand-off (or its skip)
                self.window = windows.open_window(
                    target, self.options, self.run, self.python, self.writer, self.trainer(), self.warn
                )
                if self.window is None:
                    self._skip(target)
                    return
                self.window.warmup()  # kept before: an interruption from here on finds it and closes it
                self._quiet_until(step)  # every batch of the window needs a look
            elif action is Action.BEGIN_STEP:
                assert self.window is not None
                self.window.step_begin(step)
                self.batches_seen = step + 1
            elif action is Action.END_STEP:
                assert self.window is not None
                self.window.step_end(step)
            elif action is Action.CLOSE:
                self._close()
                return
        self.phase = current

    def _close(self, reason: str | None = None, partial: bool = False, ending: bool = False) -> None:
        window, self.window, self.phase = self.window, None, Phase.NONE
        if window is None:
            return
        try:
            self._hand_off(window, reason, partial, ending)
        except BaseException:  # cleanup: interrupted or failed anywhere, no tracer, hook or patch stays; re-raised
            window.abort()
            raise
        finally:
            self.budget.closed(window)

    def _hand_off(self, window: ProfilingWindow, reason: str | None, partial: bool, ending: bool) -> None:
        """Close the window's recording into the spool and give its job to the writer. A window the
        stage's end closed is held and finished once it stopped (``drain``), as is one closing within
        ``FINISH_AT_END_WITHIN_S`` of it on CPU, unless a writer process runs already."""
        assert self.run is not None and self.spool is not None and self.writer is not None
        target, planned = window.window, self.planned
        trigger = planned.trigger if planned is not None else None
        self._schedule_from(target.end)
        incomplete = len(window.steps) < len(target.active_steps)
        if incomplete:
            why = reason or "the window was closed early"
            messages.warn_cut_window(self.warn, self.stage, target, window.steps, why, self.windows_recorded)
        destination = windows.destination(
            self.options, self.run, window, planned, partial or incomplete, reason, self.trainer(), self.python_filter
        )
        destination.metadata[UNTRACED_WAIT_KEY] = self.untraced.reading()  # input_bound reads it
        if trigger is not None:
            self.triggered_runs.append((destination.run_dir.name, trigger))
            del self.triggered_runs[: -messages.TRIGGERED_SHOWN]  # the latest are named at the end
        started = self.writer.process_started
        at_end = not started if ending else finishes_at_end(runs.trains_on_cpu(self.run), started, *self._remaining())
        closed = window.close(self.spool, destination, hold_dump=at_end)  # held: even VizTracer's dump waits
        if closed is None:
            return
        self.windows_recorded += 1
        self.inbox.expect(self.writer.hand_off(closed, at_end=at_end))
        self._quiet_until(self.next_look)  # look at the next batch start for the answer

    def _remaining(self) -> tuple[int | None, float | None]:
        """Batches left to the stage's known end, and its mean batch so far in seconds (None: unknown)."""
        trainer = self.trainer()
        if trainer is None or self.started is None or self.stage is None:
            return None, None
        if self.stage == "fit":
            end, now = runs.fit_end_batch(trainer), runs.global_batch(trainer)
        else:
            end, now = runs.stage_batches(trainer, self.stage), self.eval_step
        started_ns, before = self.started
        done = now - before
        if end is None or done <= 0:
            return None, None
        return end - now - 1, (time.perf_counter_ns() - started_ns) / 1e9 / done

    def fail(self, err: Exception, hook: str) -> None:
        """A hook's fault boundary caught ``err``: drop the open window, uninstalled, and warn once per kind."""
        window, self.window, self.phase = self.window, None, Phase.NONE
        if window is not None:
            self._skip(window.window)
            window.abort()
        self.warn(*messages.fault(err, hook))

    def _skip(self, target: Window) -> None:
        self.budget.closed()
        self.windows_skipped += 1
        self._schedule_from(target.end)

    def _look_now(self) -> None:
        """From the signal handler: in one process, look at the very next batch."""
        if self.triggers is not None and self.triggers.request_now():
            self._quiet_until(-1)

    def _schedule_from(self, step: int) -> None:
        """Quiet until the warmup of the first window not over by ``step`` (or the next trigger check)."""
        self._quiet_until(self.plan.next_boundary(step))

    def _quiet_until(self, boundary: float) -> None:
        """Batches before ``boundary`` need no look (but the slow step's clock read); with answers owed, all do."""
        if self.triggers is not None:
            boundary = min(boundary, self.triggers.watch.next_check)
        if self.inbox.outstanding or self.outcomes.unlogged:
            boundary = -1
        if self.slow is not None:
            self.next_look, self.next_check = -1, boundary
        else:
            self.next_look = boundary

    def _read_inbox(self, log: bool) -> None:
        answers = self.inbox.take_all()
        self.budget.received(answers)
        self.outcomes.receive(answers)
        trainer = self.trainer()
        if log and self.outcomes.unlogged and trainer is not None:
            self.outcomes.log_summaries(trainer.loggers)

    def _span(self) -> tuple[int, int]:
        """The run's batches: its first, and how many it started (a fit's are global batch numbers)."""
        return self.first, max(self.batches_seen - self.first, 0)

    def _root(self) -> Any:
        return self.run.output if self.run is not None else None


def _python_filter(options: Options, pl_module: Any) -> PythonFilter:
    import viztracer  # noqa: F401  (imported now so its directory counts as library code)

    c = options.python
    return PythonFilter(
        include=path_prefixes(c.include_files) if c.include_files is not None else None,
        exclude=path_prefixes(c.exclude_files) if c.exclude_files is not None else None,
        max_depth=c.max_stack_depth,
        hook_locations=module_hook_locations(pl_module),
        library=library_roots(),
    )


def _forget_in_forked_child() -> None:
    """Only the process that started a window finishes it: a forked child (a DataLoader worker, a "fork"
    target) forgets the parent's, with no wait, write or removal (the tracers stop themselves)."""
    for controller in list(_LIVE):
        try:
            triggers = controller.triggers
            if triggers is not None and triggers.watch.signal is not None:
                triggers.watch.signal.restore()  # the child's copy of our handler; the parent keeps its own
            controller.reset(None)
        except BaseException:  # at a fork, in the child: the user's fork must never fail for our sake (Ctrl-C too)
            pass


os.register_at_fork(after_in_child=_forget_in_forked_child)
