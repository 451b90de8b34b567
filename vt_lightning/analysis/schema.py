"""The summary's JSON schema, as types: one definition read by the writer (which computes it), the
CLI and ``diff`` (which read it back) and the logger code (which logs its scalars).

``summary.json`` carries ``"schema": SCHEMA_VERSION``; a change that renames or removes a key, or
changes its meaning, bumps it. Keys documented in docs/files.md. Readers must not trust files (they
may be older, newer or hand-edited), so these types describe what the writer writes, and readers
still use ``.get``.

Versions: 1, the per-step tables (``top_python``, ``top_ops``) per recorded step and only their top
lists; 2, every per-step number over the same steps (``covers``), ``totals`` beside the top lists,
and the user's hook overrides and validation / test / predict as breakdown parts.
"""

from __future__ import annotations

from typing import TypedDict

SCHEMA_VERSION = 2


class WindowInfo(TypedDict, total=False):
    index: int | None
    worker: str | None
    span: str | None
    global_rank: int | None
    log_step: int | None
    partial: bool
    overflow: bool
    device: str  # "cuda" or "cpu"
    trace: str  # the trace file's name, set by the writer


class Covers(TypedDict):
    steps: list[int]  # the steps every per-step number covers (= steps.counted)
    keys: list[str]  # the summary keys that cover them


class Steps(TypedDict):
    recorded: list[int]
    counted: list[int]  # the first recorded step is left out when there are several (no fetch)
    ms: dict[str, float]  # step number (as a string: JSON keys) -> duration
    breakdown_source: str
    user_hooks: dict[str, str]  # the user's hook overrides that ran -> their breakdown part


class Totals(TypedDict):
    """Per-step self time of every function / op at or above ``threshold_ms``; the rest in one bucket."""

    threshold_ms: float
    ms: dict[str, float]
    other_ms: float
    other_count: int  # how many are in ``other_ms`` (0: ``ms`` lists every one)


class StepMs(TypedDict):
    mean: float | None
    p50: float | None
    max: float | None


class PythonEntry(TypedDict):
    function: str
    file: str | None
    line: int | None
    origin: str  # "user", "package", "stdlib", "builtin" or "vt_lightning"
    package: str | None
    folded: int  # functions folded into this line (0: one function)
    calls: int
    self_ms: float
    inclusive_ms: float


class TopPython(TypedDict):
    by_self: list[PythonEntry]
    by_inclusive: list[PythonEntry]
    totals: Totals  # keyed "function (file:line)", C functions by name


class OpEntry(TypedDict):
    name: str
    calls: int
    self_cpu_ms: float
    cpu_ms: float


class KernelsByOp(TypedDict):
    name: str  # the op that launched them
    kernels: int
    kernel_ms: float


class KernelEntry(TypedDict):
    name: str
    calls: int
    kernel_ms: float


class TopOps(TypedDict, total=False):
    by_cpu: list[OpEntry]
    totals: Totals  # self CPU time, keyed by op name
    by_kernel: list[KernelsByOp]  # on CUDA only
    kernels: list[KernelEntry]  # on CUDA only


class IdleGap(TypedDict):
    start_us: float
    ms: float
    python: str | None
    user_python: str | None


class Gpu(TypedDict):
    devices: list[str]
    busy_percent: float
    kernel_ms: float
    wall_ms: float
    idle_gaps: list[IdleGap]


class DeviceMemory(TypedDict, total=False):
    peak_allocated_mb: float
    peak_reserved_mb: float


class AllocationSite(TypedDict):
    site: str
    allocations: int
    mb: float


class Memory(TypedDict):
    peak_allocated_mb: float | None
    peak_reserved_mb: float | None
    peak_allocated_bytes: int | None
    devices: dict[str, DeviceMemory]
    peak_source: str
    top_allocation_sites: list[AllocationSite]


class Summary(TypedDict):
    """One window's ``<worker>.<span>.summary.json``."""

    schema: int
    window: WindowInfo
    covers: Covers
    steps: Steps
    step_ms: StepMs
    breakdown_ms: dict[str, float]  # breakdown.BREAKDOWN_PARTS (+ EXTRA_PARTS with time) -> ms per counted step
    top_python: TopPython
    top_ops: TopOps
    gpu: Gpu | None
    memory: Memory | None
