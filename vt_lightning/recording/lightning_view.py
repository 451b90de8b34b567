"""The "Lightning" view of torch-tb-profiler 0.4.3: what to record during a window, and how to write it.

Two halves:

* ``LightningViewHooks(trainer, pl_module)``: the window's ``step_hooks`` (``install()`` at the first
  active step, ``remove()`` at window end). While installed it records
  ``[pl][module]<module type>: <module path>`` around each submodule's forward (forward pre/post
  hooks) and ``[pl][profile]<action>`` around Lightning's step stages (``run_training_batch``,
  ``[LightningModule]X.training_step``, ``[Strategy]X.backward``, ``optimizer_step``, ``zero_grad``,
  ``train_dataloader_next``...), by swapping ``trainer.profiler`` for a tiny recording profiler when
  the user did not configure one. Nothing is left behind after ``remove()``: no hook, no profiler.

* ``apply_lightning_view(trace)``: pure post-processing of one trace dict. torch exports
  ``record_function`` ranges with ``cat: "user_annotation"`` but the plugin only builds the view
  from ``cpu_op`` events, and only when the top-level ``"Framework": "pytorch-lightning"`` is set.

Plugin facts this module is built around (torch_tb_profiler/profiler/{trace,data,event_parser,
module_op,run_generator,run}.py):

* ``PLModuleEvent`` strips ``[pl][module]`` and splits at the first ``": "``: the type before it is
  informational, the module path after it is the key. The module tree is built from the PATHS
  alone (parent = path up to the last dot, only if the parent itself has an event), so a child of a
  container that is never called (``nn.ModuleList``, ``nn.ModuleDict``) becomes a root.
* Setting ``Framework`` makes the plugin drop every ``python_function`` event, so torch's own Module
  view (``with_modules``) disappears; we therefore set it only when at least one module event is kept.
* Every ``[pl][module]`` name found in the events must also be reachable as a node in the operator
  tree, else ``module_op._process_module_statistics`` raises ``KeyError`` and the WHOLE worker fails
  to load (Overview and Trace included). A node is lost when its range partially overlaps another
  range of the same thread. ``apply_lightning_view`` replays the plugin's tree building and leaves
  such events as ``user_annotation`` (the plugin ignores those), so a bad range can never kill a file.
* The view's timeline (``/tree``) reads ``next(iter(pl_tid2tree.values()))``, the ``[pl][profile]``
  ranges of the first thread: with none it raises ``StopIteration`` (HTTP 500, empty chart). When the
  trace has module events but no ``[pl][profile]`` event we add one per ``ProfilerStep#N``.
* ``gpu_user_annotation`` events (the GPU-side mirror of a ``record_function``) must stay as they are.

torch.compile (measured on torch 2.13, dynamo ``skip_nnmodule_hook_guards=True``):

* hooks added to modules inside an already compiled region are silently NOT called (no events, no
  recompile, no cost);
* but if dynamo compiles (or recompiles, e.g. on a new batch shape) while such hooks are installed,
  it graph-breaks on ``record_function`` (its ranges are dropped anyway) and the broken graphs stay
  in use after the hooks are removed: a lasting slowdown.

So we never hook inside a compiled region: an ``OptimizedModule`` (``torch.compile(module)``) and a
module whose instance ``forward`` is compiled are recorded from the outside (their pre/post hooks run
eagerly) and their descendants are skipped; a module compiled in place (``module.compile()``, whose
``_call_impl`` is compiled) is skipped with its descendants; a LightningModule compiled for
Lightning (``trainer.fit(torch.compile(model))``: ``_compiler_ctx`` set, ``forward`` and
``training_step`` compiled) gets no module hooks at all. What was skipped is in ``hooks.skipped``.
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

PL_MODULE_PREFIX = "[pl][module]"

# Lightning's main step stages; every other profiled action (each callback hook, each module hook)
# would add a range per batch for little insight, at a measurable cost in active steps.
MAIN_STAGES = frozenset(
    {
        "run_training_batch",
        "training_step",
        "backward",
        "optimizer_step",
        "optimizer_zero_grad",
        "zero_grad",
        "train_dataloader_next",
        "validation_step",
        "run_optimization",
        "test_step",
        "predict_step",
    }
)


_RANGE_TYPE: Any = None


def profiler_range(name: str) -> Any:
    """A torch.profiler range: torch's C ``_RecordFunctionFast`` (~0.7 µs, written as ``cpu_op``)
    where it exists, else ``record_function`` (~6 µs, written as ``user_annotation``).

    Runs around every submodule forward of an active step: the type is looked up once.
    """
    global _RANGE_TYPE
    if _RANGE_TYPE is None:
        try:
            from torch._C._profiler import _RecordFunctionFast as range_type
        except ImportError:  # pragma: no cover - torch < 2.2
            from torch.autograd.profiler import record_function as range_type
        _RANGE_TYPE = range_type
    return _RANGE_TYPE(name)


def is_main_stage(action_name: str) -> bool:
    """``[Strategy]DDPStrategy.backward`` -> True; ``[Callback]X.on_train_batch_end`` -> False."""
    if action_name.startswith("[Callback]"):
        return False
    return action_name.rsplit(".", 1)[-1] in MAIN_STAGES


PL_PROFILE_PREFIX = "[pl][profile]"
FRAMEWORK_KEY = "Framework"
FRAMEWORK_VALUE = "pytorch-lightning"
CPU_OP = "cpu_op"
USER_ANNOTATION = "user_annotation"

# Categories whose X events the plugin puts in its per-thread operator list (besides ours).
_TREE_CATEGORIES = frozenset({"cpu_op", "operator", "python"})
_COMM_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)


# --------------------------------------------------------------------------------------------------
# Naming
# --------------------------------------------------------------------------------------------------


def module_record_name(module: Any, path: str) -> str:
    """``[pl][module]<module>.<Type>: <path>`` — the form Lightning's own profiler writes."""
    cls = type(module)
    return f"{PL_MODULE_PREFIX}{cls.__module__}.{cls.__name__}: {path}"


def profile_record_name(action_name: str) -> str:
    return f"{PL_PROFILE_PREFIX}{action_name}"


# --------------------------------------------------------------------------------------------------
# Recording: the window's step hooks
# --------------------------------------------------------------------------------------------------


def _is_compiled_function(fn: Any) -> bool:
    return fn is not None and hasattr(fn, "_torchdynamo_orig_callable")


def _optimized_module_type() -> type | None:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except Exception:  # pragma: no cover - torch without dynamo
        return None
    return OptimizedModule


def _stage_profiler_class() -> type:
    from lightning.pytorch.profilers import Profiler

    class LightningViewProfiler(Profiler):
        """Records ``[pl][profile]<action>`` ranges; installed only while a window is active."""

        def __init__(self) -> None:
            super().__init__()
            self._open: list[tuple[str, Any]] = []
            self._lock = threading.Lock()

        def start(self, action_name: str) -> None:
            if not is_main_stage(action_name):  # per-hook ranges cost ~0.5 ms a step; keep the stages
                return
            record = profiler_range(profile_record_name(action_name))
            record.__enter__()
            with self._lock:
                self._open.append((action_name, record))

        def stop(self, action_name: str) -> None:
            # Actions started on the profiler we replaced end there (Profiler.profile keeps its own
            # ``self``); a stop for an action we never started is simply ignored.
            with self._lock:
                for i in range(len(self._open) - 1, -1, -1):
                    if self._open[i][0] == action_name:
                        _, record = self._open.pop(i)
                        break
                else:
                    return
            record.__exit__(None, None, None)

        def close_all(self) -> None:
            """End every open range, innermost first (window end inside a Lightning hook)."""
            with self._lock:
                records, self._open = self._open, []
            for _, record in reversed(records):
                try:
                    record.__exit__(None, None, None)
                except Exception:
                    pass

        def summary(self) -> str:
            return ""

    return LightningViewProfiler


class LightningViewHooks:
    """``step_hooks`` for ``ProfilingWindow``: module ranges and Lightning stage ranges.

    ``install()`` is idempotent; ``remove()`` always removes everything and is safe to call twice
    (or without ``install()``). Nothing of this object is active between ``remove()`` and the next
    ``install()``.
    """

    def __init__(
        self,
        trainer: Any,
        pl_module: Any,
        record_modules: bool = True,
        record_stages: bool = True,
    ) -> None:
        self.trainer = trainer
        self.pl_module = pl_module
        self.record_modules = record_modules
        self.record_stages = record_stages
        self.skipped: list[str] = []  # module paths not hooked (compiled regions), with the reason
        self.stage_note: str | None = None  # why [pl][profile] ranges were not recorded, if so
        self._handles: list[Any] = []
        self._original_profiler: Any = None
        self._profiler: Any = None
        self._open: dict[int, list[tuple[int, Any]]] = defaultdict(list)  # thread id -> open module ranges
        self._installed = False

    # -- public protocol ----------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def hooked_modules(self) -> int:
        return len(self._handles) // 2

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        try:
            if self.record_modules:
                self._install_module_hooks()
            if self.record_stages:
                self._install_profiler()
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._close_module_ranges()
        profiler, self._profiler = self._profiler, None
        original, self._original_profiler = self._original_profiler, None
        if profiler is not None:
            try:
                if getattr(self.trainer, "profiler", None) is profiler:
                    self.trainer.profiler = original
            finally:
                profiler.close_all()
        self._installed = False

    # -- modules --------------------------------------------------------------------------------------
    def _module_plan(self) -> list[tuple[str, Any, Any]]:
        """(path, module to hook, module whose type names it), skipping compiled regions."""
        root = self.pl_module
        if root is None:
            return []
        if getattr(root, "_compiler_ctx", None) is not None or any(
            _is_compiled_function(root.__dict__.get(attr)) for attr in ("forward", "training_step")
        ):
            self.skipped.append("<all>: the LightningModule is compiled (torch.compile)")
            return []
        optimized = _optimized_module_type()
        plan: list[tuple[str, Any, Any]] = []
        skip_under: list[str] = []
        for path, module in root.named_modules():
            if not path:
                continue  # the LightningModule itself, as Lightning's profiler does
            if any(path == p or path.startswith(p + ".") for p in skip_under):
                continue
            if getattr(module, "_compiled_call_impl", None) is not None:
                self.skipped.append(f"{path}: compiled in place (module.compile())")
                skip_under.append(path)
                continue
            if optimized is not None and isinstance(module, optimized):
                plan.append((path, module, getattr(module, "_orig_mod", module)))
                skip_under.append(path)
                self.skipped.append(f"{path}.*: inside torch.compile")
                continue
            plan.append((path, module, module))
            if _is_compiled_function(module.__dict__.get("forward")):
                skip_under.append(path)
                self.skipped.append(f"{path}.*: forward is compiled")
        return plan

    def _install_module_hooks(self) -> None:
        self.skipped = []
        for path, module, named_as in self._module_plan():
            name = module_record_name(named_as, path)
            self._handles.append(
                module.register_forward_pre_hook(functools.partial(self._enter, name, id(module)), prepend=True)
            )
            self._handles.append(
                module.register_forward_hook(functools.partial(self._exit, id(module)), always_call=True)
            )

    def _enter(self, name: str, key: int, module: Any, args: Any) -> None:
        record = profiler_range(name)
        record.__enter__()
        self._open[threading.get_ident()].append((key, record))

    def _exit(self, key: int, module: Any, args: Any, output: Any) -> None:
        stack = self._open.get(threading.get_ident())
        if not stack:
            return
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == key:
                # always_call=True: runs even when forward raised, so ranges never stay open
                closing = stack[i:]
                del stack[i:]
                for _, record in reversed(closing):
                    record.__exit__(None, None, None)
                return

    def _close_module_ranges(self) -> None:
        open_ranges, self._open = self._open, defaultdict(list)
        for stack in open_ranges.values():
            for _, record in reversed(stack):
                try:
                    record.__exit__(None, None, None)
                except Exception:
                    pass

    # -- Lightning stages ----------------------------------------------------------------------------
    def _install_profiler(self) -> None:
        self.stage_note = None
        trainer = self.trainer
        if trainer is None or not hasattr(trainer, "profiler"):
            self.stage_note = "no trainer profiler attribute"
            return
        from lightning.pytorch.profilers import PassThroughProfiler

        current = trainer.profiler
        if type(current) is not PassThroughProfiler:
            # A profiler the user configured: leave it alone (no [pl][profile] ranges).
            self.stage_note = f"trainer.profiler is {type(current).__name__}, left alone"
            return
        self._profiler = _stage_profiler_class()()
        self._original_profiler = current
        trainer.profiler = self._profiler


# --------------------------------------------------------------------------------------------------
# Writing: the pure rewrite
# --------------------------------------------------------------------------------------------------


def _is_pl_candidate(event: dict[str, Any], prefix: str) -> bool:
    if event.get("ph") != "X":
        return False
    name = event.get("name")
    if not isinstance(name, str) or not name.startswith(prefix):
        return False
    return event.get("cat") in (USER_ANNOTATION, CPU_OP)


def _tid_key(tid: Any) -> Any:
    try:
        return int(tid)
    except (TypeError, ValueError):
        return tid


def _in_plugin_tree(event: dict[str, Any]) -> bool:
    """Would the plugin (Lightning mode) put this X event in its per-thread operator list?"""
    if event.get("ph") != "X":
        return False
    cat = event.get("cat")
    if not isinstance(cat, str):
        return False
    cat = cat.lower()
    name = event.get("name")
    if cat in _TREE_CATEGORIES:
        return not (isinstance(name, str) and name.startswith(PL_PROFILE_PREFIX))
    if cat == USER_ANNOTATION:
        return isinstance(name, str) and (name.startswith("ProfilerStep#") or name in _COMM_NAMES)
    return False


def _rejected_module_events(tree_events: list[dict[str, Any]], modules: set[int]) -> set[int]:
    """Replay the plugin's per-thread tree building; ids of module events that lose a node."""
    bad: set[int] = set()
    by_tid: dict[Any, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    # the plugin sorts all events by ts (stable), then each thread by (start, -end) (stable)
    for event in sorted(tree_events, key=lambda e: e["ts"]):
        start = float(event["ts"])
        by_tid[_tid_key(event.get("tid"))].append((start, start + float(event.get("dur", 0) or 0), event))
    for tid, items in by_tid.items():
        if not any(id(e) in modules for _, _, e in items):
            continue
        items.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[float, float, dict[str, Any]]] = [(float("-inf"), float("inf"), {})]
        for item in items:
            start, end, event = item
            while True:
                tail = stack[-1]
                if start < tail[1]:
                    if end <= tail[1]:
                        stack.append(item)
                    else:  # partial overlap: the plugin logs an error and drops `event`
                        if id(event) in modules:
                            bad.add(id(event))
                        elif id(tail[2]) in modules:
                            bad.add(id(tail[2]))
                    break
                stack.pop()
    return bad


def apply_lightning_view(trace: dict[str, Any]) -> dict[str, int]:
    """Make torch-tb-profiler offer the "Lightning" view for this trace; mutates ``trace``.

    Rewrites ``[pl][module]`` / ``[pl][profile]`` ``user_annotation`` X events to ``cpu_op``, except
    module ranges the plugin could not place in its operator tree (those stay ``user_annotation`` and
    are ignored by it), adds one ``[pl][profile]ProfilerStep#N`` per step when there is no stage
    range, and sets ``"Framework": "pytorch-lightning"`` before ``traceEvents`` (which stays last).
    Does nothing when no module range survives (the view would be empty and ``Framework`` would hide
    torch's Module view). Returns counts, also stored in ``trace["vt_lightning"]["lightning_view"]``
    when that metadata dict exists.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        events = []
    modules = [e for e in events if isinstance(e, dict) and _is_pl_candidate(e, PL_MODULE_PREFIX)]
    stages = [e for e in events if isinstance(e, dict) and _is_pl_candidate(e, PL_PROFILE_PREFIX)]
    summary = {"modules": 0, "stages": 0, "demoted": 0, "synthesized_stages": 0, "framework": 0}

    kept = {id(e) for e in modules}
    if kept:
        tree_events = [e for e in events if isinstance(e, dict) and "ts" in e and (id(e) in kept or _in_plugin_tree(e))]
        for _ in range(16):
            bad = _rejected_module_events(tree_events, kept)
            if not bad:
                break
            kept -= bad
            tree_events = [e for e in tree_events if id(e) not in bad]
        else:
            kept = set()  # pathological: give up on the view rather than risk the file
    summary["demoted"] = len(modules) - len(kept)

    if kept:
        for event in modules:
            if id(event) in kept:
                event["cat"] = CPU_OP
            else:
                event["cat"] = USER_ANNOTATION
        for event in stages:
            event["cat"] = CPU_OP
        if not stages:
            steps = [
                e
                for e in events
                if isinstance(e, dict)
                and e.get("ph") == "X"
                and isinstance(e.get("name"), str)
                and e["name"].startswith("ProfilerStep#")
            ]
            synthesized = [
                {
                    "ph": "X",
                    "cat": CPU_OP,
                    "name": profile_record_name(e["name"]),
                    "pid": e.get("pid"),
                    "tid": e.get("tid"),
                    "ts": e.get("ts"),
                    "dur": e.get("dur", 0),
                    "args": {"vt_lightning": "step range added for the Lightning view"},
                }
                for e in steps
            ]
            events.extend(synthesized)
            summary["synthesized_stages"] = len(synthesized)
        summary["modules"] = len(kept)
        summary["stages"] = len(stages)
        summary["framework"] = 1
        body = trace.pop("traceEvents", events)
        trace[FRAMEWORK_KEY] = FRAMEWORK_VALUE
        trace["traceEvents"] = body

    meta = trace.get("vt_lightning")
    if isinstance(meta, dict):
        meta["lightning_view"] = dict(summary)
        if "traceEvents" in trace:  # keep traceEvents last
            trace["traceEvents"] = trace.pop("traceEvents")
    return summary


def lightning_view_names(events: Iterable[dict[str, Any]]) -> list[str]:
    """Module paths of the ``[pl][module]`` events the plugin will read (``cat == cpu_op``)."""
    out = []
    for e in events:
        name = e.get("name")
        if e.get("cat") == CPU_OP and isinstance(name, str) and name.startswith(PL_MODULE_PREFIX):
            rest = name[len(PL_MODULE_PREFIX) :]
            out.append(rest[rest.find(": ") + 2 :])
    return out
