"""File names VizTracer cannot take: found before the tracer meets one, so it never crashes on them.

A module whose file name holds a byte that is not UTF-8 (Python decodes it as a lone surrogate,
``caf\\udcff_module.py``) crashes VizTracer 1.1.1 with SIGSEGV at the first traced call of its code:
its C hook asks for the file name as UTF-8, gets NULL, and uses it (reproduced with VizTracer alone).
Such a name cannot be excluded either, as VizTracer's own file filter does the same conversion.

- Loaded before a window: no window records Python calls while it is loaded. ``unsafe_module_file``
  names it, and the window is skipped with a warning (``controller/windows.py``). The check reads
  ``sys.modules`` once per change of its size (a few thousand ``__file__`` strings, about a
  millisecond), not at every window.
- Imported during a window: ``ImportGuard``, first on ``sys.meta_path`` only while the window
  records, sees the module's spec before its code exists. Its callback stops the Python tracer
  (VizTracer's ``collecting`` flag is process-wide, so no thread's hook reads a file name after
  that), and the window is dropped (``UnsafeImport``); the import itself proceeds untouched.
- Compiled from a string, or run by a loader by hand (``spec_from_file_location`` +
  ``exec_module``: no finder is asked), during a window: ``CodeGuard`` wraps ``builtins.compile``
  and the ``get_code`` of ``importlib.machinery``'s two file loaders while a window records, and
  looks at each new code object's ``co_filename`` before anything can run it; the same callback,
  and the window is dropped (``UnsafeCode``). Such code is remembered (weakly, with the code nested
  in it), and later windows are skipped while any of it lives (``unsafe_code_alive``).
- In a DataLoader worker's traced fetch: the same guards (``TracingGuard``); the worker's tracing
  stops for good, with one warning of its own.
- A code object whose *name* is not UTF-8 (``code.replace(co_name=...)``) runs fine traced, but
  VizTracer's C dump crashes on it. Forked, the dump child dies and the window is dropped
  (``children.DumpChildFailed``); before a dump in the training process (``FORK_CAN_DEADLOCK``, a
  held window; a DataLoader worker's part) ``viztracer_layout.dump_in_process`` reads the ring
  buffer in place and drops the window (the worker's part) instead.
- A thread whose name is not UTF-8: VizTracer keeps every thread's name for the tracer's life and
  its dump crashes on it, forked or not. ``viztracer_layout.unsafe_thread_name`` reads those names before every dump
  (``PythonTracer``'s fork included), and the window is dropped instead, as every later one is.

Not covered, as only an audit hook would see it (and one can never be removed, so it would run for
the whole process): code compiled under such a name *before* any window (or given one by
``code.replace(co_filename=...)``), and run during one. That still ends the process inside
VizTracer (the report for upstream: docs/upstream.md).
"""

from __future__ import annotations
import __future__

import builtins
import gc
import operator
import os
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from typing import Any

_checked: tuple[int, str | None] = (-1, None)  # (len(sys.modules) when last read, what was found)


def unsafe_file_name(name: str) -> bool:
    """Whether ``name`` cannot be encoded as UTF-8 (it holds a lone surrogate)."""
    if name.isascii():
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unsafe_module_file() -> str | None:
    """``module (file)`` of a loaded module whose file name VizTracer cannot take, or None."""
    global _checked
    size = len(sys.modules)
    if size != _checked[0]:
        _checked = (size, _first_unsafe())
    return _checked[1]


def _first_unsafe() -> str | None:
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and unsafe_file_name(path):
            return f"{name!a} ({path!a})"
    return None


def skipped_message(unsafe: str, index: int) -> str:
    """The warning of a window skipped because ``unsafe`` (``module (file)``) is loaded."""
    return (
        f"vt_lightning: the loaded module {unsafe} has a file name that is not valid UTF-8, which "
        f"crashes VizTracer (SIGSEGV) at its first traced call; window {index} and every later "
        "one while it is loaded are skipped. Rename the file to UTF-8 to profile this run."
    )


class UnsafeImport(RuntimeError):
    """A module whose file name VizTracer cannot take was imported during window ``index``: Python
    tracing stopped before its code ran, and the window is dropped (the message says so)."""

    def __init__(self, unsafe: str, index: int) -> None:
        self.unsafe = unsafe
        super().__init__(
            f"vt_lightning: the module {unsafe}, imported during window {index}, has a file name that is "
            "not valid UTF-8, which crashes VizTracer (SIGSEGV) at its first traced call; Python tracing "
            f"stopped before its code ran, window {index} is dropped, and every later window while it is "
            "loaded is skipped. Rename the file to UTF-8 to profile this run."
        )


class ImportGuard:
    """A ``sys.meta_path`` finder, first in line while a window records: it asks the finders after it
    for the spec (as the import system would, so nothing is searched twice) and hands ``on_unsafe``
    the ``module (file)`` of one whose file name VizTracer cannot take, before the module's code is
    loaded. Finds nothing itself, raises nothing of its own, and in a forked child (or behind a
    legacy finder with no ``find_spec``) leaves the search to the import system."""

    def __init__(self, on_unsafe: Callable[[str], None]) -> None:
        self._on_unsafe = on_unsafe
        self._pid = os.getpid()

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if os.getpid() != self._pid:
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:  # a legacy finder: the import system's own search keeps its precedence
                return None
            spec = find(fullname, path, target)
            if spec is not None:
                file = _unsafe_file_of(spec)
                if file is not None:
                    self._on_unsafe(f"{fullname!a} ({file!a})")
                return spec
        return None


def _unsafe_file_of(spec: Any) -> str | None:
    """The file name of ``spec`` that VizTracer would meet as ``co_filename`` and cannot take, or None."""
    for attribute in ("origin", "cached"):
        try:
            name = getattr(spec, attribute, None)
        except Exception:  # ``cached`` is computed from the origin; a loader may refuse
            continue
        if isinstance(name, str) and unsafe_file_name(name):
            return name
    return None


class UnsafeCode(UnsafeImport):
    """Code whose file name VizTracer cannot take was compiled (or run by a loader by hand) during
    window ``index``: Python tracing stopped before it ran, and the window is dropped."""

    def __init__(self, subject: str, file: str, index: int) -> None:
        self.unsafe = f"{subject} ({file!a})"
        RuntimeError.__init__(
            self,
            f"vt_lightning: {subject} during window {index} has a file name that is not valid "
            f"UTF-8 ({file!a}), which crashes VizTracer (SIGSEGV) at its first traced call; Python tracing "
            f"stopped before that code ran, window {index} is dropped, and every later window is skipped "
            "while that code exists. Give it a UTF-8 file name to profile this run.",
        )


# Every code object met by ``CodeGuard`` under a file name VizTracer cannot take, with the code nested
# in it (a function's code outlives the module code that made it): later windows are skipped while
# any is alive. Weak: code that is gone cannot run.
_unsafe_code: weakref.WeakSet[types.CodeType] = weakref.WeakSet()
_collected = True  # the garbage collector ran since code was last added to ``_unsafe_code``
_guards: list[CodeGuard] = []  # installed, in this process
# The flags ``compile`` inherits from its caller's code (``from __future__ import ...``).
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag
_LOADERS = (SourceFileLoader, SourcelessFileLoader)


def unsafe_code_alive() -> str | None:
    """The file name (``ascii`` form) of live code ``CodeGuard`` found unsafe, or None. O(1) when none.

    A module's code is usually held by a reference cycle (its functions' globals are its dict), so
    once after such code is met, the garbage collector runs here before the answer: code nothing
    can reach any more is not counted."""
    global _collected
    if _unsafe_code and not _collected:
        _collected = True
        gc.collect()
    for code in list(_unsafe_code):
        return ascii(code.co_filename)
    return None


def unsafe_code_message(file: str, index: int) -> str:
    """The warning of a window skipped because code from the unsafe file name ``file`` still lives."""
    return (
        f"vt_lightning: code from the file name {file}, which is not valid UTF-8, was met during an "
        "earlier window and still exists; it crashes VizTracer (SIGSEGV) at its first traced call, so "
        f"window {index} and every later one while it exists are skipped. Give it a UTF-8 file name "
        "to profile this run."
    )


def _remember(code: types.CodeType) -> None:
    global _collected
    _collected = False
    _unsafe_code.add(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _remember(const)


def _met(code: Any, subject: str) -> None:
    """Hand an unsafe new code object to every guard of this process, before it can run."""
    if not isinstance(code, types.CodeType) or not unsafe_file_name(code.co_filename):
        return
    _remember(code)
    _notify(subject, code.co_filename)


def _notify(subject: str, file: str) -> None:
    pid = os.getpid()
    for guard in list(_guards):
        if guard._pid == pid:
            guard._on_unsafe(subject, file)


def _caller_future_flags() -> int:
    try:
        return sys._getframe(2).f_code.co_flags & _FUTURE_FLAGS
    except ValueError:  # called from C with no Python frame: ``compile`` inherits nothing either
        return 0


def _compile(
    source: Any, filename: Any, mode: str, flags: int = 0, dont_inherit: bool = False, optimize: int = -1, **kwargs: Any
) -> Any:
    """``builtins.compile`` while a window records: the same call, and its code checked.

    ``compile`` inherits ``__future__`` flags from the calling frame, which here would be this
    one: the caller's are merged in and inheritance turned off, so the code is compiled exactly as
    the caller's own ``compile`` would."""
    if not dont_inherit:
        inherited = _caller_future_flags()
        if inherited:
            flags = operator.index(flags) | inherited
        dont_inherit = True
    code = _next_compile(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    if _guards:
        _met(code, "code compiled")
    return code


_compile.__doc__ = builtins.compile.__doc__  # help(compile) during a window reads as always
_next_compile: Callable[..., Any] = builtins.compile  # what ``_compile`` calls (the builtin, or a wrapper found)
_loader_code: dict[type, tuple[bool, Any]] = {}  # loader class -> (had its own get_code, the original)


def _get_code_of(original: Any) -> Any:
    def get_code(self: Any, fullname: str) -> Any:
        """The loader's ``get_code`` while a window records (a module run by hand, not imported)."""
        subject = f"the module {fullname!a} run by its loader (not imported)"
        path = getattr(self, "path", None)
        if _guards and isinstance(path, str) and unsafe_file_name(path):
            _notify(subject, path)  # before its source is compiled (and named that way)
        code = original(self, fullname)
        if _guards:
            _met(code, subject)
        return code

    get_code.__wrapped__ = original  # type: ignore[attr-defined]
    return get_code


def _patch() -> None:
    global _next_compile
    if builtins.compile is not _compile:
        _next_compile = builtins.compile
        builtins.compile = _compile
    for loader in _LOADERS:
        if loader not in _loader_code:
            _loader_code[loader] = ("get_code" in loader.__dict__, loader.get_code)
            loader.get_code = _get_code_of(loader.get_code)  # type: ignore[method-assign]


def _unpatch() -> None:
    """Put back what ``_patch`` replaced. A wrapper another tool put over ours since stays (and
    ours inside it, which then only calls through): removing it would remove theirs."""
    if builtins.compile is _compile:
        builtins.compile = _next_compile
    for loader, (own, original) in list(_loader_code.items()):
        if getattr(loader.__dict__.get("get_code"), "__wrapped__", None) is original:
            if own:
                setattr(loader, "get_code", original)  # noqa: B010 - a class attribute put back
            else:
                delattr(loader, "get_code")
        del _loader_code[loader]


class CodeGuard:
    """``builtins.compile`` and the file loaders' ``get_code`` wrapped, only while installed: each
    code object they return under a file name VizTracer cannot take goes to ``on_unsafe(subject,
    file name)`` on the compiling thread, before anything can run it (and is remembered:
    ``unsafe_code_alive``). Behaves exactly like the originals otherwise, raises nothing of its
    own, and does nothing in a forked child."""

    def __init__(self, on_unsafe: Callable[[str, str], None]) -> None:
        self._on_unsafe = on_unsafe
        self._pid = os.getpid()

    def install(self) -> None:
        if self not in _guards:
            _guards.append(self)
        _patch()

    def remove(self) -> None:
        while self in _guards:
            _guards.remove(self)
        if not _guards:
            _unpatch()


def _forget_in_forked_child() -> None:
    """A process forked during a window (a DataLoader worker) has no window: nothing to guard."""
    if _guards:
        _guards.clear()
        _unpatch()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_forked_child)


class TracingGuard:
    """``ImportGuard`` and ``CodeGuard`` around a tracer run outside a ``ProfilingWindow``: a
    DataLoader worker's traced fetch (``recording/worker_side.py``), whose worker runs VizTracer itself.

    ``start(tracer)``: False (nothing started) once such a name was met in this process or while
    one is loaded; else the guards go in and the tracer starts, and the thread that meets such a
    name stops it before that code runs. ``stop(tracer)`` stops it, and the guards go whatever
    happens (``stop()``: only the guards); True once such a name was met (trace no more). One
    warning per process.
    """

    def __init__(self) -> None:
        self.met: str | None = None
        self._tracer: Any = None
        self._imports = ImportGuard(self._unsafe_import)
        self._code = CodeGuard(self._unsafe_code)

    def start(self, tracer: Any) -> bool:
        if self.met is None:
            module, code = unsafe_module_file(), unsafe_code_alive()
            if module is not None:
                self._met(f"the module {module}, loaded in this worker,")
            elif code is not None:
                self._met(f"code from {code}, alive in this worker,")
        if self.met is not None:
            return False
        self._tracer = tracer
        self._imports.install()  # before the tracer, so that nothing is imported unseen while it runs
        self._code.install()
        try:
            tracer.start()
        except BaseException:
            self.stop()
            raise
        return True

    def stop(self, tracer: Any = None) -> bool:
        self._tracer = None
        try:
            if tracer is not None:
                tracer.stop()
        finally:
            try:
                self._imports.remove()
            finally:
                self._code.remove()
        return self.met is not None

    def _unsafe_import(self, unsafe: str) -> None:
        self._met(f"the module {unsafe}, imported during a traced fetch,")

    def _unsafe_code(self, subject: str, file: str) -> None:
        self._met(f"{subject} ({file!a}) during a traced fetch")

    def _met(self, what: str) -> None:
        tracer = self._tracer
        if tracer is not None:
            try:
                tracer.stop()
            except Exception:  # pragma: no cover - PythonTracer.stop raises nothing of its own
                pass
        if self.met is None:
            self.met = what
            try:
                warnings.warn(
                    f"vt_lightning: DataLoader worker pid {os.getpid()}: {what} has a file name that is not "
                    "valid UTF-8, which crashes VizTracer (SIGSEGV) at its first traced call; this worker's "
                    "tracing stopped before that code ran and stays off for the rest of its life (its events "
                    "recorded before are kept). Give it a UTF-8 file name to profile its fetches.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            except Exception:  # warnings made errors (-W error): never raised into the import
                pass
