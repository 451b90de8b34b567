"""The summary's JSON schema, as types: one definition for the writer, the CLI, ``diff`` and the
loggers. A change that renames or removes a key, or changes its meaning, bumps ``SCHEMA_VERSION``
(docs/files.md); readers must not trust files, so they still use ``.get``. A key added within a
version goes in a ``total=False`` base (``_StepsAdded``...): files written before it still read."""

from __future__ import annotations

from typing import Any, TypedDict

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


class _StepsAdded(TypedDict, total=False):
    bounds_us: dict[str, list[float]]  # step number -> [start, end] on the trace's timeline (µs, its ``ts``)
    trace_us: list[float] | None  # [first start, last end] of the trace's timed events


class Steps(_StepsAdded):
    recorded: list[int]
    counted: list[int]  # the first recorded step is left out when there are several (no fetch)
    ms: dict[str, float]  # step number (as a string: JSON keys) -> duration
    breakdown_source: str
    user_hooks: dict[str, str]  # the user's hook overrides that ran -> their breakdown part


class _TotalsAdded(TypedDict, total=False):
    below: list[str]  # summary.name_hash of each name under the threshold: "under the threshold", not "absent"


class Totals(_TotalsAdded):
    """Per-step self time of every function / op at or above ``threshold_ms``; the rest in one bucket."""

    threshold_ms: float
    ms: dict[str, float]
    other_ms: float
    other_count: int  # how many are in ``other_ms`` (0: ``ms`` lists every one)


class _StepMsAdded(TypedDict, total=False):
    min: float | None


class StepMs(_StepMsAdded):
    mean: float | None
    p50: float | None
    max: float | None


class _CallsAdded(TypedDict, total=False):
    calls_per_step: float  # ``calls`` / the counted steps


class PythonEntry(_CallsAdded):
    function: str
    file: str | None
    line: int | None
    origin: str  # "user", "package", "stdlib", "builtin", "generated" (a compiler's output) or "vt_lightning"
    package: str | None
    folded: int  # functions folded into this line (0: one function)
    calls: int  # over the counted steps
    self_ms: float
    inclusive_ms: float


class TopPython(TypedDict):
    by_self: list[PythonEntry]
    by_inclusive: list[PythonEntry]
    totals: Totals  # keyed "function (file:line)", C functions by name


class OpEntry(_CallsAdded):
    name: str
    calls: int  # over the counted steps
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


class LiveSite(TypedDict):
    """Where the allocations live at the peak were made: the innermost user frame, else the innermost
    Python frame, else the innermost op (CPU: a function's ``def`` line; CUDA: the allocating line)."""

    function: str
    file: str | None
    line: int | None
    origin: str  # "user" or "other"
    bytes: int
    allocations: int


class _MemoryAdded(TypedDict, total=False):
    peak_ts_us: float | None  # when the main device peaked, on the trace's timeline
    top_sites_at_peak: list[LiveSite]  # the main device's, largest first
    view: str  # the memory view side file's name, beside the summary


class Memory(_MemoryAdded):
    peak_allocated_mb: float | None
    peak_reserved_mb: float | None
    peak_allocated_bytes: int | None
    devices: dict[str, DeviceMemory]
    peak_source: str
    top_allocation_sites: list[AllocationSite]


class _WhereMs(TypedDict, total=False):
    ms: float  # this place's share of the evidence, ms per counted step
    share: float  # a callee's part (0-1) of the place listed before it (input_bound: the dataset's slowest callee)


class VerdictWhere(_WhereMs):
    """A place in the user's code (analysis/usercode.py): VizTracer's function name and first line."""

    function: str
    file: str | None
    line: int | None


class Verdict(TypedDict):
    """Why the step is slow (analysis/verdicts/; the rules in docs/verdicts.md)."""

    kind: str  # verdicts.KINDS (analysis/verdicts/__init__.py)
    where: list[VerdictWhere]  # the user's code, most time first (may be empty)
    evidence: dict[str, Any]  # the rule's numbers; ``share``: of the counted steps' time
    advice: str  # one line


class WorkerEntry(TypedDict):
    """One DataLoader worker process in a window."""

    worker: int  # its index in the DataLoader (``get_worker_info().id``)
    pid: int
    process: str  # its process name in the trace: "rank N · DataLoader worker K"
    batches: list[int]  # global batch indices it fetched while traced
    busy_ms: float  # the total of those fetches
    top_python: list[PythonEntry]  # its user functions by self time (ms over the window)


class Workers(TypedDict):
    """The train DataLoader's workers in a window (recording/workers.py)."""

    workers: list[WorkerEntry]
    top_python: list[PythonEntry]  # over all workers, by self time (ms over the window), user code first
    missing: list[str]  # workers that wrote no events (died, hung), one line each


class CompiledFunction(TypedDict):
    function: str | None
    file: str | None
    line: int | None
    compiles: int
    ms: float  # its compiles' time in the window


class GraphBreak(TypedDict, total=False):
    file: str
    line: int
    function: str | None
    reason: str | None  # None: seen only at run time (compiled before the window)
    compiles: int  # times dynamo logged it in the window
    calls: int  # calls of its resume function in the window (the break taken at run time)
    source: str  # "compile" (logged in the window) or "run" (its resume function ran)


class Recompile(TypedDict):
    function: str | None
    file: str | None
    line: int | None
    reason: str | None  # dynamo's guard failure, e.g. "tensor 'x' size mismatch at index 0..."
    compile_id: str | None


class CompileCounts(TypedDict):
    """What the process compiled in a stretch, from torch's own counters."""

    graphs: int  # FX graphs dynamo made
    compile_s: float | None  # dynamo's compile wall time (None: this torch does not keep it)
    recompiles: int  # compiles of an already compiled frame (a lower bound past dynamo's 64 records)
    graph_breaks: int  # graph breaks dynamo met while compiling


class CompiledGraph(TypedDict):
    """A compiled graph the window ran, named by the frame dynamo compiled (or the user's call around it)."""

    compile_id: str | None  # "F/N": frame F's compile N (N > 0: a recompile)
    function: str | None
    file: str | None
    line: int | None
    backward: bool
    hash: str | None  # inductor's CompiledFxGraph key (None: another backend)
    calls: int  # runs in the window


class _CompileAdded(TypedDict, total=False):
    """Keys added within schema 2 (absent in files written before them)."""

    before: CompileCounts | None  # from process start to the window's open (None: no counters)
    during: CompileCounts | None  # from the window's open to its close
    graphs: list[CompiledGraph]


class CompileSummary(_CompileAdded):
    """torch.compile in the window and before it (analysis/compile.py, docs/compile.md)."""

    compiles: int
    total_ms: float  # every compile in the window, recorded steps or not
    phases_ms: dict[str, float]  # dynamo, aot_autograd, inductor: each phase's own time
    in_steps_ms: float  # compile time inside the recorded steps
    steps_ms: float  # the recorded steps' time
    share: float | None  # in_steps_ms / steps_ms
    functions: list[CompiledFunction]
    graph_breaks: list[GraphBreak]
    recompiles: list[Recompile]
    notes: list[str]  # parts this torch could not provide
    torch: str | None


class SourceFile(TypedDict, total=False):
    """One file's recorded lines (export/source_lines.py), or why there are none (``error``)."""

    mtime_ns: int
    size: int
    lines: dict[str, str]  # line number (as a string) -> its text, as it was when the window was written
    error: str


class Sources(TypedDict):
    files: dict[str, SourceFile]  # keyed by the file as the summary names it
    truncated: bool  # the summary's budget of lines ran out: some files are missing


class Observer(TypedDict):
    traced_step_ms: float | None  # median of the window's counted steps
    untraced_step_ms: float | None  # median step (fetch + own time) of the run's untraced steps before it
    untraced_steps: int  # how many (warmup steps count: torch.profiler only prepares in them)
    ratio: float | None  # traced / untraced


class _SummaryAdded(TypedDict, total=False):
    """Keys added within schema 2 (absent in files written before them)."""

    compile: CompileSummary | None  # None: the run compiled nothing and no graph break ran in the window
    observer: Observer  # the cost of observing: the window's step time beside the run's untraced one

    verdicts: list[Verdict]  # largest share first; [] when no rule fired
    job: JobInfo  # rank 0 only, when every rank of a DDP job traced the window (docs/distributed.md)
    workers: Workers  # the train DataLoader's workers, when they were traced (analysis/workers.py)
    sources: Sources  # the lines around every place the summary names, as they were


class JobRank(TypedDict):
    rank: int
    host: str
    offset_us: float | None  # this rank's clock minus rank 0's (0 on rank 0's host)
    uncertainty_us: float | None  # half the best ping-pong round trip
    same_host: bool


class _StragglerAdded(TypedDict, total=False):
    explains_share: float  # excess_ms / others_wait_ms (capped at 1): the function's part of the wait
    unattributed_ms: float  # others_wait_ms - excess_ms: in no one user function (ops, data, scheduling)


class Straggler(_StragglerAdded):
    rank: int
    others_wait_ms: float  # the other ranks' mean wait for it, per step
    step_ms: float
    share_of_step: float
    function: str | None  # the user function with the largest excess over the other ranks
    file: str | None
    line: int | None
    excess_ms: float  # per step, on the training thread (the one that issues the collectives)


class SlowOp(TypedDict):
    """An op much slower on one rank than on another (straggler.slow_ops)."""

    name: str
    collective: bool  # time in a collective is waiting, not slow compute
    ms_per_step: dict[str, float]  # rank (as a string) -> self CPU ms per step
    slow_rank: int
    spread_ms: float
    text: str  # "aten::mm: 4.87 ms/step on rank 0, 0.51 on rank 1"


class _JobAdded(TypedDict, total=False):
    slow_ops: list[SlowOp]  # ops much slower on one rank, largest spread first
    steps_us: list[float] | None  # [first step start, last step end] of every rank, on the job file's timeline


class JobInfo(_JobAdded):
    """The window's job file (rank 0's summary only): ranks, clock offsets, straggler."""

    file: str  # relative to the window directory: job/job.<span>.json.gz
    world_size: int
    ranks: list[JobRank]
    max_exit_residual_us: float | None  # spread of the ranks' exits from one collective, after alignment
    straggler: Straggler | None  # None: balanced (below the thresholds of analysis/straggler.py)
    reduced_ranks: list[int]  # ranks kept with less detail (job file over its size budget)


class Summary(_SummaryAdded):
    """One window's ``<worker>.<span>.summary.jsonc``."""

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
