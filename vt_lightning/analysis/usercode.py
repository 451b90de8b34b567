"""Whose code is this? The one rule for "the user's code". Pure but for ``realpath``, cached.

A file is the user's unless it is the standard library's, an installed package's (or an imported
framework's), vt_lightning's, or a compiler's output (inductor's and Triton's caches, FX / dynamo
source in memory), whose ``forward`` would otherwise top the user's tables. A ``python -c``
command's code is in ``<string>`` with generated code (dataclasses', torch's): only the functions
the command defines are the user's (``command_functions``, carried in each window's metadata)."""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import sysconfig
from collections.abc import Container
from typing import Any

# vt_lightning's own directory (the package, not this subpackage), wherever it is installed.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_NAME = "vt_lightning"
GENERATED = "generated"  # code_origin's label for compiler output

_VIZTRACER_NAME = re.compile(r"^(?P<name>\S.*?) \((?P<file>.*):(?P<line>\d+)\)$")
_SITE_DIRS = ("site-packages", "dist-packages")
_STDLIB_DIRS = tuple(
    {os.path.realpath(p) for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}
)
# Compilers' default output directories by name, and the variables that move them (read each time).
_GENERATED_DIR = re.compile(r"/(torchinductor_[^/]*|\.triton/cache|triton_cache)/")
_GENERATED_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# FX and dynamo compile source held in memory: ``<eval_with_key>.3``, ``<fx_graph>``.
_GENERATED_PSEUDO_FILES = ("<eval_with_key>", "<fx", "<torch_dynamo", "<dynamo")
# The file name of the code `python - < train.py` runs: never a library's (<frozen ...>, <string>).
USER_PSEUDO_FILE = "<stdin>"
# The file name of a `python -c` command's code, and of code made with exec() (dataclass methods).
COMMAND_FILE = "<string>"
# Code objects an expression makes, as VizTracer names them (comprehensions have their own before 3.12).
_EXPRESSION_SCOPES = {
    ast.Lambda: "<lambda>",
    ast.ListComp: "<listcomp>",
    ast.SetComp: "<setcomp>",
    ast.DictComp: "<dictcomp>",
    ast.GeneratorExp: "<genexpr>",
}
# Frameworks whose directories are never the user's, even from a source checkout.
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "viztracer")
# Libraries of the model the user built from: ranked below the user's code, above the frameworks'.
MODEL_LIBRARIES = ("litgpt", "timm", "transformers")


def parse_function(name: str) -> tuple[str, str | None, int | None]:
    """``"Model.forward (/src/model.py:12)"`` -> ``("Model.forward", "/src/model.py", 12)``."""
    match = _VIZTRACER_NAME.match(name)
    if match is None:
        return name, None, None
    return match["name"], match["file"], int(match["line"])


def is_own_file(path: str) -> bool:
    """True for vt_lightning's own source files (its frames are never shown as the user's)."""
    return path.startswith(PACKAGE_ROOT + os.sep)


@functools.lru_cache(maxsize=65536)  # one answer per file: realpath costs a system call or more
def code_origin(path: str | None) -> tuple[str, str | None]:
    """``("user" | "stdlib" | "builtin" | "generated" | "vt_lightning", None)`` or ``("package", name)``."""
    if not path:
        return "builtin", None
    if is_generated(path):
        return GENERATED, None
    if path.startswith("<"):  # <stdin>: `python -`'s script; <string>: see function_origin
        return ("user" if path == USER_PSEUDO_FILE else "stdlib"), None
    norm = path.replace("\\", "/")
    for site in _SITE_DIRS:
        marker = f"/{site}/"
        if marker in norm:
            package = norm.split(marker, 1)[1].split("/", 1)[0]
            package = package.removesuffix(".py")
            return (PACKAGE_NAME, None) if package == PACKAGE_NAME else ("package", package)
    parts = norm.split("/")
    if PACKAGE_NAME in parts[:-1] and is_own_file(os.path.abspath(path)):  # this profiler, from a checkout
        return PACKAGE_NAME, None
    real = os.path.realpath(path)
    if any(real.startswith(d + os.sep) for d in _STDLIB_DIRS):
        return "stdlib", None
    return "user", None


def function_origin(name: str, command: Container[str] = ()) -> tuple[str, str | None]:
    """``code_origin`` of a call VizTracer named ``name``; one of ``command`` (the window's
    ``command_functions``) is the user's although its file, ``<string>``, is not."""
    return ("user", None) if name in command else code_origin(parse_function(name)[1])


def command_functions(source: str) -> list[str]:
    """The functions ``python -c source`` defines, named as VizTracer names their calls: qualified
    name (only the name on 3.10, which has no ``co_qualname``) and first line, a decorator's if any:
    ``"Model.training_step (<string>:12)"``. Pure: the training process reads ``source``."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):  # a class body too
                name, line = child.name, min([child.lineno, *(d.lineno for d in child.decorator_list)])
            elif isinstance(child, ast.expr) and type(child) in _EXPRESSION_SCOPES:
                name, line = _EXPRESSION_SCOPES[type(child)], child.lineno
            else:
                visit(child, prefix)
                continue
            qualname = prefix + name if sys.version_info >= (3, 11) else name
            found.append(f"{qualname} ({COMMAND_FILE}:{line})")
            visit(child, f"{prefix}{name}." if isinstance(child, ast.ClassDef) else f"{prefix}{name}.<locals>.")

    visit(ast.parse(source), "")
    return found


def is_user_file(path: Any) -> bool:
    """Whether ``path`` (a source file, or anything read from a file) is the user's code."""
    return isinstance(path, str) and code_origin(path)[0] == "user"


def is_generated(path: str) -> bool:
    """Code a compiler wrote: in its cache directories (default or set by their variables) or in memory."""
    if path.startswith("<"):
        return path.startswith(_GENERATED_PSEUDO_FILES)
    norm = path.replace("\\", "/")
    if _GENERATED_DIR.search(norm):
        return True
    roots = tuple(os.path.realpath(os.environ[k]) + os.sep for k in _GENERATED_ENV if os.environ.get(k))
    return bool(roots) and any(p.startswith(roots) for p in (os.path.abspath(path), os.path.realpath(path)))


def library_roots() -> tuple[str, ...]:
    """Directories of code that is not the user's (an editable install puts a framework anywhere)."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.update({os.path.abspath(path) + os.sep, os.path.realpath(path) + os.sep})
    roots.update(framework_dirs(*FRAMEWORKS))
    return tuple(sorted(roots))


def framework_dirs(*names: str) -> tuple[str, ...]:
    """Directories of the named frameworks already imported (the writer, without torch, finds none)."""
    files = [getattr(sys.modules.get(name), "__file__", None) for name in names]
    return tuple(os.path.dirname(os.path.abspath(file)) + os.sep for file in files if file)
