"""The one way back from the writer, read on the training thread, where Lightning's loggers are safe."""

from __future__ import annotations

import logging
import queue
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from vt_lightning.analysis.history import RunHistory, row_of
from vt_lightning.constants import BROWSER_LIMIT_BYTES, LOGGER_NAME
from vt_lightning.controller.loggers import log_summary
from vt_lightning.controller.messages import Warn, job_written, print_verdicts
from vt_lightning.controller.retention import Retention
from vt_lightning.controller.windows_table import WindowsTable
from vt_lightning.export.job import WindowResult
from vt_lightning.export.terminal import printable

log = logging.getLogger(LOGGER_NAME)

RESULTS_KEPT = 16  # newest WindowResults kept (``VizTraceCallback.results``); the rest: ``history``
UNLOGGED_KEPT = 64  # summaries waiting for a batch outside any window to reach the loggers
VERDICT_WINDOWS = 5  # windows whose verdicts are printed; later ones are in their summary files


@dataclass(frozen=True)
class Notice:
    """A problem to report once (key: what makes two notices the same problem)."""

    key: str
    message: str


@dataclass(frozen=True)
class Dropped:
    """A window the writer could not write; ``notice`` is None when it was reported already."""

    notice: Notice | None


Outcome = WindowResult | Dropped | Notice


class Inbox:
    """Thread-safe in, training thread out; ``outstanding``: windows handed off and not answered."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.outstanding = 0

    def expect(self, answer: Future[Outcome]) -> None:
        """At hand-off: exactly one outcome arrives for ``answer`` (``Dropped(None)``: abandoned, said)."""
        self.outstanding += 1
        answer.add_done_callback(self._answered)

    def _answered(self, answer: Future[Outcome]) -> None:
        if answer.cancelled() or answer.exception() is not None:
            self._queue.put(Dropped(None))
        else:
            self._queue.put(answer.result())

    def notice(self, key: str, message: str) -> None:
        """From any thread: the writer's ``on_problem``."""
        self._queue.put(Notice(key, message))

    def arrived(self) -> int:
        """Answers waiting to be read (approximate while the writer adds more)."""
        return self._queue.qsize()

    def take_all(self) -> list[Outcome]:
        """On the training thread: everything that arrived, in order."""
        out: list[Outcome] = []
        while not self._queue.empty():  # polled every batch while answers are owed: no exception
            outcome = self._queue.get_nowait()  # the one reader: never empty here
            if not isinstance(outcome, Notice):
                self.outstanding -= 1
            out.append(outcome)
        return out


class Outcomes:
    """What the training thread keeps of the writer's answers, bounded however long the run."""

    def __init__(self, warn: Warn, tracer_entries: int) -> None:
        self.warn = warn
        self.tracer_entries = tracer_entries
        self.results: deque[WindowResult] = deque(maxlen=RESULTS_KEPT)
        self.history = RunHistory()
        # Summaries wait for a batch start outside any window; past UNLOGGED_KEPT the oldest are not logged.
        self.unlogged: deque[WindowResult] = deque(maxlen=UNLOGGED_KEPT)
        self.table: WindowsTable | None = None  # every row, on disk (set at setup)
        self.retention: Retention | None = None  # deletes windows past ``keep_windows``
        self._verdicts_shown = 0
        self.dropped = 0  # windows the writer answered for without writing them (each kind warned once)
        self.skipped = 0  # windows skipped at their start (set by the controller at the end of a run)

    def not_written(self) -> str | None:
        """The end of a run's line for the windows it did not write; None when it wrote them all."""
        if not (self.dropped or self.skipped):
            return None
        parts = [
            *([f"{self.skipped} skipped at their start"] if self.skipped else []),
            *([f"{self.dropped} dropped by the writer"] if self.dropped else []),
        ]
        return f"{self.dropped + self.skipped} window(s) not written: {', '.join(parts)} (the warnings above say why)"

    def start(self, spool: Any, submit: Callable[..., Any], keep_windows: int | None) -> None:
        """At setup, once the run has a spool and a writer (whose thread deletes old windows)."""
        self.table = WindowsTable(spool)
        self.retention = Retention(keep_windows, submit)

    def receive(self, outcomes: Sequence[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Notice):
                self.warn(outcome.key, outcome.message)
            elif isinstance(outcome, Dropped):
                self.dropped += 1
                if outcome.notice is not None:
                    self.warn(outcome.notice.key, outcome.notice.message)
            else:
                self._written(outcome)

    def _written(self, result: WindowResult) -> None:
        self.results.append(result)
        if result.summary is not None:
            row = row_of(result.summary, run_dir=result.trace_path.parent.name)
            self.history.add(row)
            if self.table is not None:
                self.table.append(row)
        else:
            self.history.count += 1
        if self.retention is not None:
            self.history.deleted += self.retention.finished(result, self.results)
        name = result.trace_path.name
        for note in result.notes:
            self.warn(f"note:{note.split('(')[0]}", f"vt_lightning: {name}: {note}")
        if result.overflow:
            self.warn(
                "overflow",
                f"vt_lightning: VizTracer's ring buffer (tracer_entries={self.tracer_entries}) "
                f"overflowed in {name}; only the window's last events were kept. "
                f"Set `tracer_entries` to about {result.suggested_tracer_entries or 'twice the current value'} "
                "(estimated from this window's event rate), or record fewer calls with `min_duration` / "
                "`ignore_c_function=True` (`include_files` / `exclude_files` / `max_stack_depth` shrink "
                "the written file, not the ring buffer).",
            )
        if result.json_bytes > BROWSER_LIMIT_BYTES:
            self.warn(
                "large",
                f"vt_lightning: {name} holds {result.json_bytes / 2**20:.0f} MB of JSON; "
                "browser trace viewers go blank above ~300 MB. Lower `active`, or set `min_duration`, "
                "`max_stack_depth`, `include_files` or `ignore_c_function=True`.",
            )
        log.info("vt_lightning: wrote %s", printable(result.trace_path))
        if result.job is not None:  # rank 0: the window's job file and its straggler, one line
            job_written(result.trace_path, result.job)
        if result.summary is not None:
            if len(self.unlogged) == UNLOGGED_KEPT:
                self.warn(
                    "unlogged",
                    "vt_lightning: windows follow each other with no batch outside a window, where "
                    "summaries go to the Trainer's loggers; the oldest waiting summaries are not logged "
                    "(their summary files are written). Raise `wait` to leave batches between windows.",
                )
            self.unlogged.append(result)

    def log_summaries(self, loggers: Sequence[Any]) -> None:
        """On the training thread, never inside a window (the logger's calls would be traced)."""
        pending, self.unlogged = self.unlogged, deque(maxlen=UNLOGGED_KEPT)
        for result in pending:
            if result.summary is None:  # only results with a summary are pending
                continue
            self._print_verdicts(result.summary)
            try:
                log_summary(loggers, result.summary, result.summary_markdown)
            except Exception as err:  # a logger of the user's refused our scalars: said once, the files are written
                self.warn(
                    f"logger:{type(err).__name__}",
                    f"vt_lightning: could not log a window summary to the Trainer's loggers "
                    f"({type(err).__name__}: {err}); the summary files are written anyway.",
                )

    def _print_verdicts(self, summary: Any) -> None:
        """The first windows' lines and verdicts on the console; a long run's later ones stay in their files."""
        self._verdicts_shown += 1
        if self._verdicts_shown <= VERDICT_WINDOWS:
            print_verdicts(summary)
        if self._verdicts_shown == VERDICT_WINDOWS:
            self.warn(
                "verdicts-bounded",
                f"vt_lightning: window lines and verdicts are printed for the first {VERDICT_WINDOWS} windows; "
                "later windows' are in their summary files (`vt-lightning summary <log dir>`).",
            )
