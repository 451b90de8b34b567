"""The "Lightning" view of torch-tb-profiler 0.4.3 during a window's active steps: ``[pl][module]``
ranges around each submodule's forward, ``[pl][profile]`` around Lightning's step stages (through a
recording profiler in ``trainer.profiler`` only where the user configured none); nothing stays after
``remove()``. The writer's side: ``analysis/lightning_view.py``.

Never a hook inside a compiled region: a compile while they are installed graph-breaks on
``record_function``, and the broken graphs outlive the hooks. So compiled modules are recorded from
the outside, their descendants skipped; a LightningModule compiled for Lightning gets no module hooks."""

from __future__ import annotations

import functools
import inspect
import threading
from collections import defaultdict
from typing import Any

# True while dynamo traces: a hook that returns at once costs a compiled region no graph break.
from lightning.pytorch.profilers import PassThroughProfiler, Profiler
from torch.compiler import is_compiling as _is_compiling

from vt_lightning.analysis.breakdown import HOOK_PARTS, is_breakdown_hook
from vt_lightning.analysis.lightning_view import is_main_stage, module_record_name, profile_record_name
from vt_lightning.analysis.usercode import framework_dirs
from vt_lightning.recording.torchtracer import profiler_range


def user_hook_names(pl_module: Any) -> dict[str, str]:
    """Each Lightning hook the module overrides, named as VizTracer names its calls -> the hook's name: the
    summary finds the user's own hooks whatever the profiler. Read once per run."""
    if pl_module is None:
        return {}
    try:
        from lightning.pytorch import LightningModule

        hooks = {n for n in (*dir(LightningModule), *HOOK_PARTS) if not n.startswith("_") and is_breakdown_hook(n)}
        lightning_dirs = framework_dirs("lightning", "pytorch_lightning", "lightning_fabric")
        names: dict[str, str] = {}
        for hook in sorted(hooks):
            code = _override_code(pl_module, hook)
            if code is not None and not code.co_filename.startswith(lightning_dirs):
                qualname = getattr(code, "co_qualname", code.co_name)  # 3.10: VizTracer records co_name
                names[f"{qualname} ({code.co_filename}:{code.co_firstlineno})"] = hook
        return names
    except Exception:  # pragma: no cover - an exotic module costs the breakdown its hooks, not the run
        return {}


def _override_code(pl_module: Any, hook: str) -> Any:
    """The code object that runs when Lightning calls ``hook`` (decorators unwrapped), or None."""
    function = pl_module.__dict__.get(hook)
    if function is None:
        for klass in type(pl_module).__mro__:
            if hook in klass.__dict__:
                function = klass.__dict__[hook]
                break
    function = getattr(function, "__func__", function)  # staticmethod, classmethod, bound method
    if not callable(function):
        return None
    try:
        function = inspect.unwrap(function)
    except ValueError:  # a __wrapped__ cycle
        return None
    return getattr(function, "__code__", None)


def _is_compiled_function(fn: Any) -> bool:
    return fn is not None and hasattr(fn, "_torchdynamo_orig_callable")


def _end_ranges(records: list[tuple[Any, Any]]) -> None:
    """End the ranges of ``(key, record)`` pairs still open at the window's end, innermost first."""
    for _, record in reversed(records):
        try:
            record.__exit__(None, None, None)
        except Exception:  # best effort at the window's end: one that fails keeps no other open
            pass


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
        _end_ranges(records)

    def summary(self) -> str:
        return ""


class LightningViewHooks:
    """``step_hooks`` for ``ProfilingWindow``; ``install()`` is idempotent, ``remove()`` repeatable."""

    def __init__(self, trainer: Any, pl_module: Any) -> None:
        self.trainer = trainer
        self.pl_module = pl_module
        self._handles: list[Any] = []
        self._original_profiler: Any = None
        self._profiler: Any = None
        self._open: dict[int, list[tuple[int, Any]]] = defaultdict(list)  # thread id -> open module ranges
        self._installed = False

    @property
    def hooked_modules(self) -> int:
        return len(self._handles) // 2

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        try:
            self._install_module_hooks()
            self._install_profiler()
        except BaseException:  # cleanup: a half install is removed; re-raised
            self.remove()
            raise

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
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

    def _module_plan(self) -> list[tuple[str, Any, Any]]:
        """(path, module to hook, module whose type names it), compiled regions left out."""
        root = self.pl_module
        if root is None or getattr(root, "_compiler_ctx", None) is not None:
            return []  # no module, or one compiled for Lightning
        if any(_is_compiled_function(root.__dict__.get(attr)) for attr in ("forward", "training_step")):
            return []
        from torch._dynamo.eval_frame import OptimizedModule

        plan: list[tuple[str, Any, Any]] = []
        skip_under: list[str] = []  # compiled regions
        for path, module in root.named_modules():
            if not path or any(path == p or path.startswith(p + ".") for p in skip_under):
                continue  # the LightningModule itself (as Lightning's profiler does), or compiled
            if getattr(module, "_compiled_call_impl", None) is not None:  # compiled in place
                skip_under.append(path)
                continue
            optimized = isinstance(module, OptimizedModule)
            plan.append((path, module, getattr(module, "_orig_mod", module) if optimized else module))
            if optimized or _is_compiled_function(module.__dict__.get("forward")):
                skip_under.append(path)  # recorded from the outside only
        return plan

    def _install_module_hooks(self) -> None:
        for path, module, named_as in self._module_plan():
            name = module_record_name(named_as, path)
            self._handles.append(
                module.register_forward_pre_hook(functools.partial(self._enter, name, id(module)), prepend=True)
            )
            self._handles.append(
                module.register_forward_hook(functools.partial(self._exit, id(module)), always_call=True)
            )

    def _enter(self, name: str, key: int, module: Any, args: Any) -> None:
        if _is_compiling():
            return
        record = profiler_range(name)
        record.__enter__()
        self._open[threading.get_ident()].append((key, record))

    def _exit(self, key: int, module: Any, args: Any, output: Any) -> None:
        if _is_compiling():
            return
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
            _end_ranges(stack)

    def _install_profiler(self) -> None:
        trainer = self.trainer
        if type(getattr(trainer, "profiler", None)) is not PassThroughProfiler:
            return  # a profiler the user configured is left alone: no [pl][profile] ranges
        self._original_profiler = trainer.profiler
        self._profiler = trainer.profiler = LightningViewProfiler()
