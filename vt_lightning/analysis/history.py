"""What a run keeps of its windows for the end-of-run table: the same size after 10 windows or
10,000 (the first, latest and slowest few rows, and a log-bucket histogram per column). Pure."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

FIRST_ROWS = 3  # the run's first windows (how it started)
LAST_ROWS = 3  # its latest (how it ends)
SLOWEST_ROWS = 3  # its slowest steps (what to open first)
MAX_TABLE_ROWS = FIRST_ROWS + SLOWEST_ROWS + 1 + LAST_ROWS + 2
BUCKET_RATIO = 1.01  # quantiles are exact to 1% (bucket width), whatever the number of windows


@dataclass(frozen=True)
class WindowRow:
    """One window's line of the end-of-run table: plain numbers and short strings."""

    index: int | None
    rank: int
    batches: str  # "12-14", or "–"
    step_ms: float | None
    parts: dict[str, float] = field(default_factory=dict)  # breakdown_ms (ms per step)
    gpu_busy: float | None = None  # percent; None without a GPU
    peak_mb: float | None = None
    top_user: str | None = None  # "train_step (3.1 ms)": the busiest user function
    run_dir: str = ""  # the window's run directory name

    @property
    def name(self) -> str:
        return str(self.index) + (f" r{self.rank}" if self.rank else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowRow:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def row_of(summary: Mapping[str, Any], run_dir: str = "") -> WindowRow:
    """The table's row of one window summary (analysis/schema.py)."""
    window = summary.get("window") or {}
    recorded = (summary.get("steps") or {}).get("recorded") or []
    gpu = summary.get("gpu")
    memory = summary.get("memory")
    return WindowRow(
        index=window.get("index"),
        rank=int(window.get("global_rank") or 0),
        batches=f"{recorded[0]}-{recorded[-1]}" if recorded else "–",
        step_ms=(summary.get("step_ms") or {}).get("mean"),
        parts={p: float(ms) for p, ms in (summary.get("breakdown_ms") or {}).items() if ms is not None},
        gpu_busy=gpu.get("busy_percent") if gpu else None,
        peak_mb=memory.get("peak_allocated_mb") if memory else None,
        top_user=_top_user_function(summary),
        run_dir=run_dir,
    )


def _top_user_function(summary: Mapping[str, Any]) -> str | None:
    for entry in (summary.get("top_python") or {}).get("by_inclusive") or []:
        if entry.get("origin") == "user":
            return f"{entry['function']} ({entry['inclusive_ms']:.1f} ms)"
    return None


class QuantileSketch:
    """Quantiles in bounded memory: counts per log-spaced bucket, growing with the range, not the count."""

    def __init__(self) -> None:
        self.count = 0
        self._zeros = 0
        self._buckets: dict[int, int] = {}

    def add(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            return
        self.count += 1
        if value == 0:
            self._zeros += 1
            return
        key = math.floor(math.log(value) / math.log(BUCKET_RATIO))
        self._buckets[key] = self._buckets.get(key, 0) + 1

    def quantile(self, q: float) -> float | None:
        """The value at quantile ``q`` (0..1), to within one bucket; None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = self._zeros
        if seen >= rank:
            return 0.0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen >= rank:
                return float(BUCKET_RATIO ** (key + 0.5))
        return None  # pragma: no cover - counts add up to self.count

    def __len__(self) -> int:
        return len(self._buckets) + 1


@dataclass(frozen=True)
class TableRow:
    """A row as printed: a window, a gap ("…" between first and latest), or an aggregate."""

    label: str
    row: WindowRow | None = None
    kind: str = "window"  # "window" | "gap" | "aggregate"
    marks: tuple[str, ...] = ()  # "slowest"


class RunHistory:
    def __init__(self) -> None:
        self.count = 0  # windows written in the run (deleted ones included)
        self.deleted = 0  # of them, removed from disk by ``keep_windows``
        self.first: list[WindowRow] = []
        self.last: deque[WindowRow] = deque(maxlen=LAST_ROWS)
        # the slowest between the first and the latest (a min-heap), entered on leaving ``last``
        self._slowest: list[tuple[float, int, WindowRow]] = []
        self.step = QuantileSketch()
        self.parts: dict[str, QuantileSketch] = {}  # one per breakdown part (a fixed set)
        self.gpu = QuantileSketch()
        self.peak = QuantileSketch()
        self.parts_seen: set[str] = set()
        self.with_gpu = False

    def add(self, row: WindowRow) -> None:
        ordinal = self.count
        self.count += 1
        if len(self.first) < FIRST_ROWS:
            self.first.append(row)
        else:
            if len(self.last) == LAST_ROWS:
                self._between(self.last[0], ordinal - LAST_ROWS)
            self.last.append(row)
        if row.step_ms is not None:
            self.step.add(row.step_ms)
        for part, ms in row.parts.items():
            self.parts.setdefault(part, QuantileSketch()).add(ms)
            if ms:
                self.parts_seen.add(part)
        if row.gpu_busy is not None:
            self.with_gpu = True
            self.gpu.add(row.gpu_busy)
        if row.peak_mb is not None:
            self.peak.add(row.peak_mb)

    def _between(self, row: WindowRow, ordinal: int) -> None:
        """``row`` is no longer among the latest: a candidate for the slowest in between."""
        item = (row.step_ms if row.step_ms is not None else -1.0, -ordinal, row)
        if len(self._slowest) < SLOWEST_ROWS:
            heapq.heappush(self._slowest, item)
        elif item[:2] > self._slowest[0][:2]:
            heapq.heapreplace(self._slowest, item)

    def slowest(self) -> list[WindowRow]:
        return [row for _, _, row in sorted(self._slowest, key=lambda item: item[:2], reverse=True)]

    def kept(self) -> int:
        """Python objects held, for tests: bounded whatever ``count`` is."""
        sketches = [self.step, self.gpu, self.peak, *self.parts.values()]
        return len(self.first) + len(self.last) + len(self._slowest) + sum(len(s) for s in sketches)

    def aggregate(self, q: float) -> WindowRow:
        """A row of the ``q`` quantile of each column over every window of the run."""
        gpu = self.gpu.quantile(q) if self.with_gpu else None
        parts = {p: v for p, s in self.parts.items() if (v := s.quantile(q)) is not None}
        return WindowRow(None, 0, "", self.step.quantile(q), parts, gpu, self.peak.quantile(q))

    def table(self) -> list[TableRow]:
        """First, slowest (marked), a gap row, latest, then the median and p90: ``MAX_TABLE_ROWS`` at most."""
        middle = sorted(self.slowest(), key=lambda r: r.index if r.index is not None else -1)
        rows = [TableRow(r.name, r) for r in self.first]
        rows += [TableRow(r.name, r, marks=("slowest",)) for r in middle]
        hidden = self.count - len(self.first) - len(self.last) - len(middle)
        if hidden > 0:
            rows.append(TableRow(f"… {hidden} more", kind="gap"))
        rows += [TableRow(r.name, r) for r in self.last]
        if self.count > 1:
            rows.append(TableRow("median", self.aggregate(0.5), kind="aggregate"))
            rows.append(TableRow("p90", self.aggregate(0.9), kind="aggregate"))
        return rows

    def latest_top_user(self, limit: int = 4) -> list[tuple[str, str]]:
        """(window, busiest user function) of the latest windows that have one, oldest first."""
        rows = [r for r in (*self.first, *self.last) if r.top_user]
        return [(r.name, str(r.top_user)) for r in rows[-limit:]]


def history_of(rows: Iterable[WindowRow]) -> RunHistory:
    history = RunHistory()
    for row in rows:
        history.add(row)
    return history
