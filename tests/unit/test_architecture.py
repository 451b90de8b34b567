"""The package's shape, read from its source with ``ast`` (docs/architecture.md).

* Layers: every import (module level and inside functions; ``if TYPE_CHECKING:`` blocks are
  exempt, they never run) points down the layer list, never up; only ``__main__`` and the
  TensorBoard tab (``tensorboard/``, which shares ``cli/serve.py``) import ``cli``.
* No torch, Lightning or VizTracer in ``constants``, ``analysis/``, ``export/`` and
  ``tensorboard/`` (the writer process, the CLI and the TensorBoard server import them), nor at
  module level in the package's ``__init__``, which every import of a submodule runs.
* No import cycle, counting every import: module level, inside functions, and under
  ``if TYPE_CHECKING:`` (a cycle hidden in a function or a type hint is still two modules that
  cannot be understood, or moved, one without the other).
* No module reaches another module's ``_private`` names (attributes, functions, imports).
* One definition per name: no module assigns a name ``constants.py`` defines, nor writes one of
  its string values as a literal.
* docs/architecture.md's "where to add a verdict kind" and docs/verdicts.md's table of kinds match
  the verdict registry (analysis/verdicts/__init__.py); that every name the documents give exists
  is tests/unit/test_docs_names.py's.
* Fault boundaries: every broad ``except`` outside the places where our code meets the run carries
  its reason as a comment on its line.
* Rooms: no module over 600 lines (a sign that it holds two responsibilities: split it by
  responsibility, never by size); no ``Protocol`` that mirrors another class's state (the code
  that reads it belongs in that class, or in a room that owns its own state); ``VizTraceCallback``
  a plain ``Callback`` with at most 15 attributes of its own (its state lives in the controller).

Nothing here imports the package: a module that does not import yet is still checked.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from support.paths import REPO

PACKAGE = "vt_lightning"
ROOT = REPO / PACKAGE

# Layer of each top-level part of the package, and the layers it may import (its own included).
# The package's own ``__init__`` re-exports VizTraceCallback, so it sits on top with the callback.
LAYER_OF = {
    "constants": "constants",
    "analysis": "analysis",
    "export": "export",
    "recording": "recording",
    "options": "options",
    "controller": "controller",
    "callback": "callback",
    "cli": "cli",
    "tensorboard": "tensorboard",
    "__main__": "__main__",
    "": "package",  # vt_lightning/__init__.py
}
_BELOW_CALLBACK = {"constants", "analysis", "export", "recording", "options", "controller"}
MAY_IMPORT: dict[str, set[str]] = {
    "constants": {"constants"},
    "analysis": {"analysis", "constants"},
    "export": {"export", "analysis", "constants"},
    "recording": {"recording", "export", "analysis", "constants"},
    "options": {"options", "recording", "analysis", "constants"},
    "controller": {"controller", "options", "recording", "export", "analysis", "constants"},
    "callback": {"callback", *_BELOW_CALLBACK},
    "package": {"package", "callback", *_BELOW_CALLBACK},
    "cli": {"cli", "package", "callback", *_BELOW_CALLBACK},
    # The TensorBoard tab reads files like the CLI and shares its Perfetto server (cli/serve.py).
    "tensorboard": {"tensorboard", "cli", "export", "analysis", "constants"},
    "__main__": {"__main__", "cli", "package", "callback", *_BELOW_CALLBACK},
}
TORCH_FREE_LAYERS = ("constants", "analysis", "export", "tensorboard")
HEAVY = frozenset({"torch", "lightning", "pytorch_lightning", "lightning_fabric", "viztracer", "torch_tb_profiler"})

MAX_MODULE_LINES = 600
MAX_CALLBACK_ATTRIBUTES = 15
MIRRORED_ATTRIBUTES = 3  # a Protocol that names this many of one class's attributes borrows its state


# --------------------------------------------------------------------------------------------------
# Reading the source
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # absolute name as written (``vt_lightning.analysis.summary``, ``torch.nn``)
    line: int
    module_level: bool  # runs when the importing module is imported (not inside a def)
    type_checking: bool = False  # under ``if TYPE_CHECKING:`` (read by type checkers, never run)

    @property
    def top(self) -> str:
        return self.target.split(".", 1)[0]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def package_sources() -> dict[str, tuple[Path, str]]:
    """``{module name: (path, source)}`` for every module of the package."""
    return {module_name(p): (p, p.read_text(encoding="utf-8")) for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(module: str, source: str, *, is_package: bool = False, type_checking: bool = False) -> Iterator[Import]:
    """Every import statement of ``module`` (and ``importlib.import_module("...")`` with a constant
    name); those under ``if TYPE_CHECKING:`` only with ``type_checking``. ``from a import b``
    yields ``a.b``: the caller decides whether that is a module or a name in ``a``."""

    def visit(node: ast.AST, module_level: bool, hinted: bool = False) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            if type_checking:
                for child in node.body:
                    yield from visit(child, module_level, True)
            for child in node.orelse:
                yield from visit(child, module_level, hinted)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno, module_level, hinted)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module or ""
            for alias in node.names:
                target = base if alias.name == "*" else f"{base}.{alias.name}"
                yield Import(module, target, node.lineno, module_level, hinted)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(module, node.args[0].value, node.lineno, module_level, hinted)
        inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner, hinted)

    yield from visit(ast.parse(source), True)


def internal_target(target: str, modules: set[str]) -> str | None:
    """The package module an import reaches: the longest known module that ``target`` names or
    lies in (``vt_lightning.controller.WindowController`` -> ``vt_lightning.controller``)."""
    if target.split(".", 1)[0] != PACKAGE:
        return None
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return PACKAGE


def layer(module: str) -> str | None:
    rest = module[len(PACKAGE) + 1 :] if module != PACKAGE else ""
    return LAYER_OF.get(rest.split(".", 1)[0])


@cache
def all_imports(type_checking: bool = False) -> tuple[Import, ...]:
    out: list[Import] = []
    for module, (path, source) in package_sources().items():
        out.extend(imports_of(module, source, is_package=path.name == "__init__.py", type_checking=type_checking))
    return tuple(out)


def _where(imp: Import) -> str:
    return f"{package_sources()[imp.module][0].relative_to(ROOT.parent)}:{imp.line}"


# --------------------------------------------------------------------------------------------------
# The checker checks what it should
# --------------------------------------------------------------------------------------------------


def test_the_reader_resolves_relative_imports_and_skips_type_checking_blocks():
    source = """
from __future__ import annotations
import importlib
from typing import TYPE_CHECKING
import torch.nn
from . import sibling
from ..analysis import summary as s
if TYPE_CHECKING:
    from vt_lightning.callback import VizTraceCallback
else:
    import json
def later():
    from vt_lightning.cli import command
    importlib.import_module("lightning.pytorch")
"""
    found = {(i.target, i.module_level) for i in imports_of("vt_lightning.export.job", source)}
    assert ("torch.nn", True) in found
    assert ("vt_lightning.export.sibling", True) in found
    assert ("vt_lightning.analysis.summary", True) in found
    assert ("json", True) in found
    assert ("vt_lightning.cli.command", False) in found
    assert ("lightning.pytorch", False) in found
    assert not any("callback" in target for target, _ in found)
    hinted = {(i.target, i.type_checking) for i in imports_of("vt_lightning.export.job", source, type_checking=True)}
    assert ("vt_lightning.callback.VizTraceCallback", True) in hinted and ("json", False) in hinted
    modules = {"vt_lightning", "vt_lightning.controller", "vt_lightning.controller.run"}
    assert internal_target("vt_lightning.controller.WindowController", modules) == "vt_lightning.controller"
    assert internal_target("vt_lightning.controller.run", modules) == "vt_lightning.controller.run"
    assert internal_target("vt_lightning.__version__", modules) == "vt_lightning"
    assert internal_target("torch", modules) is None
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"a"}}) == [["a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# --------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------


def test_every_module_belongs_to_a_layer():
    assert package_sources(), f"no module found under {ROOT}"
    unknown = sorted(m for m in package_sources() if layer(m) is None)
    assert not unknown, f"modules in no layer (add them to LAYER_OF and docs/architecture.md): {unknown}"


def test_no_layer_imports_upward():
    modules = set(package_sources())
    bad = []
    for imp in all_imports():
        target = internal_target(imp.target, modules)
        if target is None:
            continue
        source_layer, target_layer = layer(imp.module), layer(target)
        if source_layer is None or target_layer is None:
            continue  # reported by test_every_module_belongs_to_a_layer
        if target_layer not in MAY_IMPORT[source_layer]:
            bad.append(f"{_where(imp)}: {source_layer} imports {target} ({target_layer})")
    assert not bad, "imports that reach up a layer (docs/architecture.md):\n" + "\n".join(bad)


def test_only_main_imports_the_cli():
    modules = set(package_sources())
    bad = [
        f"{_where(imp)}: {imp.module} imports {imp.target}"
        for imp in all_imports()
        if layer(imp.module) not in ("cli", "__main__", "tensorboard")
        and (target := internal_target(imp.target, modules)) is not None
        and layer(target) == "cli"
    ]
    assert not bad, "\n".join(bad)


def test_the_writer_side_never_imports_torch_lightning_or_viztracer():
    bad = [
        f"{_where(imp)}: {imp.module} imports {imp.target}"
        for imp in all_imports()
        if imp.top in HEAVY
        and (
            layer(imp.module) in TORCH_FREE_LAYERS
            # every ``import vt_lightning.x`` runs the package's __init__ first
            or (layer(imp.module) == "package" and imp.module_level)
        )
    ]
    assert not bad, "torch, Lightning or VizTracer where the writer process or the CLI would load them:\n" + "\n".join(
        bad
    )


# --------------------------------------------------------------------------------------------------
# Cycles
# --------------------------------------------------------------------------------------------------


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with a cycle (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return sorted(found)


def import_graph(imports: Iterator[Import] | tuple[Import, ...]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (every kind of import given)."""
    modules = set(package_sources())
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        target = internal_target(imp.target, modules)
        if target is not None and target != imp.module:
            graph[imp.module].add(target)
    return graph


def test_no_import_cycles_counting_function_level_and_type_checking_imports():
    cycles = find_cycles(import_graph(all_imports(type_checking=True)))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


HINTED_IMPORT = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {} import X\n"


def test_a_cycle_through_a_function_level_or_type_checking_import_is_found():
    """Two hidden cycles (through a function-level import, through a ``TYPE_CHECKING`` one),
    introduced on copies of the sources."""
    sources = dict(package_sources())
    summary = "vt_lightning.analysis.summary"
    verdicts = "vt_lightning.analysis.verdicts"
    windows, controller = "vt_lightning.controller.windows", "vt_lightning.controller.controller"
    extra = [
        *imports_of(verdicts, "def f():\n    from vt_lightning.analysis.summary import find_steps\n"),
        *imports_of(windows, HINTED_IMPORT.format("vt_lightning.controller.controller"), type_checking=True),
    ]
    cycles = find_cycles(import_graph((*all_imports(type_checking=True), *extra)))
    assert any(summary in c and verdicts in c for c in cycles), cycles
    assert any(windows in c and controller in c for c in cycles), cycles
    assert sources == package_sources()


# --------------------------------------------------------------------------------------------------
# Rooms
# --------------------------------------------------------------------------------------------------


def test_no_module_longer_than_600_lines():
    long = {
        str(path.relative_to(ROOT.parent)): n
        for path, source in package_sources().values()
        if (n := len(source.splitlines())) > MAX_MODULE_LINES
    }
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines (does one hold two responsibilities? split it by "
        f"responsibility, not by size): {long}"
    )


def _callback() -> tuple[str, ast.ClassDef]:
    _, source = package_sources()[f"{PACKAGE}.callback"]
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "VizTraceCallback"]
    assert len(classes) == 1, "vt_lightning/callback.py defines VizTraceCallback once"
    return source, classes[0]


def test_the_callback_subclasses_only_callback():
    _, cls = _callback()
    bases = [ast.unparse(b) for b in cls.bases]
    assert len(bases) == 1 and bases[0].rsplit(".", 1)[-1] == "Callback", bases
    assert not cls.keywords, [ast.unparse(k) for k in cls.keywords]


def self_attributes(cls: ast.ClassDef) -> set[str]:
    """Names assigned as ``self.<name>`` (plain, annotated, augmented, unpacked, walrus-free) or via
    ``setattr(self, "<name>", ...)`` anywhere in the class's methods."""
    names: set[str] = set()

    def targets(node: ast.expr) -> Iterator[ast.expr]:
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                yield from targets(element)
        elif isinstance(node, ast.Starred):
            yield from targets(node.value)
        else:
            yield node

    for node in ast.walk(cls):
        found: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            found = [t for target in node.targets for t in targets(target)]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            found = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            found = list(targets(node.target))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            found = [t for item in node.items if item.optional_vars for t in targets(item.optional_vars)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
        for target in found:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def test_self_attributes_are_counted_however_they_are_assigned():
    cls = ast.parse(
        "class C:\n"
        "    def f(self, other):\n"
        "        self.a = other.b = 1\n"
        "        self.c: int = 2\n"
        "        self.a += 1\n"
        "        self.d, (self.e, *self.f) = 1, (2, 3)\n"
        "        setattr(self, 'g', 4)\n"
        "        with open('x') as self.h:\n"
        "            pass\n"
        "        other.z = self.y\n"
    ).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert self_attributes(cls) == {"a", "c", "d", "e", "f", "g", "h"}


def test_the_callback_keeps_at_most_15_attributes():
    _, cls = _callback()
    names = self_attributes(cls)
    assert len(names) <= MAX_CALLBACK_ATTRIBUTES, (
        f"VizTraceCallback assigns {len(names)} distinct self attributes (at most {MAX_CALLBACK_ATTRIBUTES}): "
        f"{sorted(names)}"
    )


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(ast.unparse(base).rsplit(".", 1)[-1] == "Protocol" for base in cls.bases)


def mirrored_state(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """``Protocol (module) mirrors Class (module): names`` for each ``Protocol`` whose data
    attributes (annotated names in its body) include at least ``MIRRORED_ATTRIBUTES`` that one
    concrete class of the package assigns on ``self``: a room that borrows another's state."""
    protocols, concrete = [], []
    for module, (_, source) in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                (protocols if _is_protocol(node) else concrete).append((module, node))
    found = []
    for module, protocol in protocols:
        fields = {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for owner_module, cls in concrete:
            shared = fields & self_attributes(cls)
            if len(shared) >= MIRRORED_ATTRIBUTES:
                found.append(f"{protocol.name} ({module}) mirrors {cls.name} ({owner_module}): {sorted(shared)}")
    return sorted(found)


def test_no_protocol_mirrors_another_classs_state():
    found = mirrored_state(package_sources())
    assert not found, "protocols that borrow a class's state:\n" + "\n".join(found)


def test_a_reintroduced_state_mirror_is_found():
    sources = dict(package_sources())
    module = "vt_lightning.controller.windows"
    path, source = sources[module]
    mirror = "\nclass ClosingState(Protocol):\n    run: Any\n    spool: Any\n    writer: Any\n    options: Any\n"
    sources[module] = (path, source + mirror)
    assert any(line.startswith("ClosingState") and "WindowController" in line for line in mirrored_state(sources))


# --------------------------------------------------------------------------------------------------
# Fault boundaries
# --------------------------------------------------------------------------------------------------

# Not checked yet: the writer side (export/, whose boundary is the writer's job) and the VizTracer
# and DataLoader-worker modules of recording/.
REASONS_UNCHECKED: tuple[str, ...] = ()


def _is_broad(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(k is None or (isinstance(k, ast.Name) and k.id in ("Exception", "BaseException")) for k in kinds)


def broad_excepts_without_a_reason(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """``file:line`` of each ``except Exception`` / ``except BaseException`` / bare ``except``
    with no comment on its line. Faults are handled where our code meets the run (the hooks, the
    writer's job, the tab's routes, the command); any other broad catch says why it is there."""
    found = []
    for path, source in sources.values():
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(REASONS_UNCHECKED):
            continue
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ExceptHandler) and _is_broad(node) and "#" not in lines[node.lineno - 1]:
                found.append(f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(found)


def test_every_broad_except_says_why_it_is_there():
    found = broad_excepts_without_a_reason(package_sources())
    assert not found, "broad excepts with no reason on their line:\n" + "\n".join(found)


def test_a_broad_except_without_a_reason_is_found():
    sources = dict(package_sources())
    module = "vt_lightning.controller.windows"
    path, source = sources[module]
    sources[module] = (path, source + "\ndef f():\n    try:\n        pass\n    except BaseException:\n        pass\n")
    assert any(line.startswith("controller/windows.py:") for line in broad_excepts_without_a_reason(sources))


# --------------------------------------------------------------------------------------------------
# No private reach across modules
# --------------------------------------------------------------------------------------------------

# Private names of the standard library or a dependency that a package module also happens to define.
FOREIGN_PRIVATE = frozenset({"_exit"})


def _private_definitions(tree: ast.AST) -> set[str]:
    """The ``_names`` a module defines: functions, classes, module and class variables, and
    attributes it assigns on ``self`` / ``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_reaches(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """``module:line name`` for each use of another package module's ``_private`` name: an
    attribute (``tracer._ensure_tracer()``, ``callback._source = …``) that the using module does
    not define itself but another does, or a ``from … import _name`` of the package."""
    trees = {module: ast.parse(source) for module, (_, source) in sources.items()}
    defined = {module: _private_definitions(tree) for module, tree in trees.items()}
    elsewhere: dict[str, set[str]] = {}
    for module, names in defined.items():
        for name in names:
            elsewhere.setdefault(name, set()).add(module)
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                owners = elsewhere.get(node.attr, set()) - {module}
                if owners and node.attr not in defined[module] and node.attr not in FOREIGN_PRIVATE:
                    found.append(f"{module}:{node.lineno} .{node.attr} (defined in {', '.join(sorted(owners))})")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{module}:{node.lineno} import {alias.name} from {node.module}")
    return sorted(found)


def test_no_module_reaches_another_modules_private_names():
    found = private_reaches(package_sources())
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_a_reintroduced_private_reach_is_found():
    sources = dict(package_sources())
    path, source = sources["vt_lightning.recording.workers"]
    sources["vt_lightning.recording.workers"] = (path, source + "\ndef _f(tracer):\n    tracer._build_tracer()\n")
    assert any("._build_tracer" in line for line in private_reaches(sources))


# --------------------------------------------------------------------------------------------------
# One definition per name
# --------------------------------------------------------------------------------------------------


def _constants() -> dict[str, ast.expr]:
    tree = ast.parse((ROOT / "constants.py").read_text(encoding="utf-8"))
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            out.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_constants_module(value: ast.expr | None) -> bool:
    """``constants.X`` or ``vt_lightning.constants.X``."""
    if not isinstance(value, ast.Attribute):
        return False
    owner = value.value
    return (isinstance(owner, ast.Name) and owner.id == "constants") or (
        isinstance(owner, ast.Attribute) and owner.attr == "constants"
    )


def duplicated_constants(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """``module:line …`` for each assignment of a name ``constants.py`` defines, each alias of one
    (``MARKER_PREFIX = CLOCK_MARKER_PREFIX``: a second name to keep in step), and each string
    literal (f-string parts included, docstrings not) equal to one of its string values. The
    package's own name is exempt: it is also a logger's name, a metric prefix and a metadata key."""
    constants = _constants()
    values = {
        node.value: name
        for name, node in constants.items()
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != PACKAGE
    }
    found = []
    for module, (_, source) in sources.items():
        if module == f"{PACKAGE}.constants":
            continue
        tree = ast.parse(source)
        docstrings = _docstrings(tree)
        module_level = [node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))]
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in constants:
                    found.append(f"{module}:{node.lineno} assigns {target.id}")
            value = getattr(node, "value", None) if node in module_level else None
            aliased = value.id if isinstance(value, ast.Name) else getattr(value, "attr", None)
            if aliased in constants and (isinstance(value, ast.Name) or _is_constants_module(value)):
                found.append(f"{module}:{node.lineno} aliases {aliased} (use constants.{aliased} itself)")
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            if is_text and node.value in values:
                found.append(f"{module}:{node.lineno} writes {node.value!r} (constants.{values[node.value]})")
    return sorted(found)


def test_no_module_redefines_a_constant_or_writes_its_value():
    found = duplicated_constants(package_sources())
    assert not found, "defined in constants.py, import it from there:\n" + "\n".join(found)


def test_a_reintroduced_duplicate_constant_is_found():
    sources = dict(package_sources())
    path, source = sources["vt_lightning.export.layout"]
    copied = source + '\nTRACE_SUFFIX = ".pt.trace.json.gz"\nNAME = f"[pl][profile]{1}"\n'
    copied += "SUFFIX = MEMORY_SUFFIX\nPREFIX: str = constants.CLOCK_MARKER_PREFIX\n"
    sources["vt_lightning.export.layout"] = (path, copied)
    found = "\n".join(duplicated_constants(sources))
    assert "assigns TRACE_SUFFIX" in found and "constants.TRACE_SUFFIX" in found and "PL_PROFILE_PREFIX" in found
    assert "aliases MEMORY_SUFFIX" in found and "aliases CLOCK_MARKER_PREFIX" in found


# --------------------------------------------------------------------------------------------------
# The verdict docs match the registry
# --------------------------------------------------------------------------------------------------

DOCS = ROOT.parent / "docs"


def _verdict_registry() -> dict[str, str]:
    """kind -> the module of its rule, read from the family modules' ``RULES`` (no import)."""
    out = {}
    for path in sorted((ROOT / "analysis" / "verdicts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rule":
                kind = node.args[0]
                assert isinstance(kind, ast.Constant), f"{path}: a Rule's kind is a literal"
                out[str(kind.value)] = f"analysis/verdicts/{path.stem}.py"
    return out


def test_the_verdict_docs_match_the_registry():
    registry = _verdict_registry()
    assert "input_bound" in registry and "straggler" in registry and "recompile" in registry, registry
    table = (DOCS / "verdicts.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| `([\w/.]+)` \|", table, re.M))
    assert rows == registry, f"docs/verdicts.md's table of kinds differs from the registry: {rows} vs {registry}"
    architecture = (DOCS / "architecture.md").read_text(encoding="utf-8")
    section = architecture.split("- **a verdict kind**", 1)[1].split("\n- **", 1)[0]
    for needed in ("analysis/verdicts/__init__.py", "analysis/verdicts/base.py", "docs/verdicts.md"):
        assert needed in section, f"docs/architecture.md's 'a verdict kind' does not name {needed}"
    assert all(module in section or module.rsplit("/", 1)[-1] in section for module in set(registry.values()))


def test_the_verdict_docs_examples_name_the_lines_the_seeded_runs_have():
    """docs/verdicts.md quotes verdicts of ``tests/integration/test_verdict_runs.py``'s seeded runs: each
    ``test_verdict_runs.py:N (function)`` (or ``"function": ..., "line": N``) must be where that
    function is defined now, as a verdict would name it."""
    source = ROOT.parent / "tests" / "integration" / "test_verdict_runs.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            lines[node.name] = node.lineno
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    lines[f"{node.name}.{item.name}"] = item.lineno
    doc = (DOCS / "verdicts.md").read_text(encoding="utf-8")
    quoted = re.findall(r"test_verdict_runs\.py:(\d+) \(([\w.]+)\)", doc)
    quoted += [(n, f) for f, n in re.findall(r"`(\w[\w.]*)` \(test_verdict_runs\.py:(\d+),", doc)]
    quoted += [
        (n, f)
        for f, n in re.findall(r'"function": "([\w.]+)", "file": "[^"]*test_verdict_runs\.py", "line": (\d+)', doc)
    ]
    assert len(quoted) >= 5, quoted
    wrong = [
        f"{function}: the docs say line {line}, it is {lines.get(function)}"
        for line, function in quoted
        if lines.get(function) != int(line)
    ]
    assert not wrong, "docs/verdicts.md's example lines are stale:\n" + "\n".join(wrong)


def test_the_callbacks_console_lines_go_through_one_door():
    """``controller.messages.say`` escapes what a line carries (export/terminal.printable_lines):
    the training side prints through it, never through Lightning's ``rank_zero_info`` directly."""
    door = f"{PACKAGE}.controller.messages"
    direct = [
        name
        for name, (_, source) in package_sources().items()
        if name != door and layer(name) in ("controller", "recording", "callback") and "rank_zero_info(" in source
    ]
    assert direct == []
