"""Every name the documents give exists. The documents: docs/*.md, README.md, CONTRIBUTING.md and
the package's docstrings. The names, each resolved against the package parsed with ``ast`` (nothing
here imports it) or against the repository's files:

* module paths: ``analysis/nest.py``, ``vt_lightning/export/pipeline.py``, ``controller/handoff``,
  and a name after one (``controller/handoff.finishes_at_end``) must be defined in that module;
* dotted code names in backticks whose first part is ours (the package, a subpackage, a module's
  own name, a class of the package): ``pipeline.finish_window``, ``WindowController.fail``,
  ``analysis.nest``, ``vt_lightning.cli.VizTraceLightningCLI``. Each later part must be defined
  where the one before it points: a module's top-level names and submodules, a class's methods,
  attributes and fields (its bases' too). A name whose parts are all keys the package writes
  (string literals in its source: ``steps.counted``, ``vt_lightning.nesting``) is a key of a file,
  not code. The first parts that are also another project's name (``lightning``, ``tensorboard``:
  whatever the package imports from outside) are left to their fully qualified spelling;
* ``from vt_lightning... import ...`` in the documents' code;
* the callback's options: ``VizTraceCallback(...)``'s keywords, ``--viztrace.<option>``,
  ``VT_LIGHTNING_<OPTION>``, docs/options.md's option tables, and the ``Args:`` of every docstring
  (each a parameter of the function it documents);
* file suffixes (``.summary.jsonc``, ``.memory_snapshot.pickle``, ``.pt.trace.json.gz`` and their
  kin): constants.py's;
* the repository's files: ``tests/...``, ``benchmarks/...``, ``docs/...``, ``examples/...``,
  ``ci/...`` and the documents' relative links.

A bare word (``finish_window``) is not checked: alone it cannot be told from an option, a key of a
file or another library's name. Write it with its module (``pipeline.finish_window``).

History is not checked where it is marked as history: docs/performance.md keeps the measurements
of past rounds, which name the code as it was when it was measured; those passages sit between
``<!-- history: ... -->`` and ``<!-- /history -->`` (nothing else is exempt; the markers must pair).
CHANGELOG.md is a record of changes and not one of the documents.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from support.paths import REPO

PACKAGE = "vt_lightning"
ROOT = REPO / PACKAGE

# Names written wrong on purpose, each with where and why; each must stay absent from the package.
DELIBERATELY_ABSENT = {
    "VT_LIGHTNING_ACTIV": "docs/cli.md quotes the error a misspelt variable gets",
}


# --------------------------------------------------------------------------------------------------
# The package, read with ast
# --------------------------------------------------------------------------------------------------


@dataclass
class Package:
    modules: dict[str, set[str]] = field(default_factory=dict)  # "analysis.nest" -> top-level names
    module_classes: dict[str, set[str]] = field(default_factory=dict)  # "controller.run" -> {"Run"}
    classes: dict[str, set[str]] = field(default_factory=dict)  # class name -> members, bases' included
    open_classes: set[str] = field(default_factory=set)  # classes with a base from outside the package
    literals: set[str] = field(default_factory=set)  # every string constant: the keys the package writes
    outside: set[str] = field(default_factory=set)  # top-level names the package imports from outside
    options: tuple[str, ...] = ()  # VizTraceCallback.__init__'s parameters
    suffixes: set[str] = field(default_factory=set)  # constants.py's file suffixes
    trace_pattern: re.Pattern[str] = re.compile("")  # constants.TRACE_PATTERN: the names the plugin reads
    stems: dict[str, list[str]] = field(default_factory=dict)  # "workers" -> analysis's and recording's


@cache
def parsed(root: Path = ROOT) -> tuple[tuple[Path, ast.Module], ...]:
    return tuple((path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(root.rglob("*.py")))


Definition = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def definitions(node: ast.AST) -> Iterator[Definition]:
    """The module, and every class and function in it (statements only: no expression holds one)."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        yield node
    for name in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, name, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler)):
                yield from definitions(child)


# Bases whose members a class does not need to list (they add none a document would name).
PLAIN_BASES = frozenset({"object", "Protocol", "Generic", "TypedDict", "NamedTuple", "Enum", "IntEnum", "str"})


def _top_level_names(body: list[ast.stmt]) -> Iterator[str]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from ((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            yield from _top_level_names(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level_names(handler.body)


def _exported(tree: ast.Module) -> Iterator[str]:
    """``__all__``'s names: a module may supply them through ``__getattr__`` (``vt_lightning.cli``)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            yield from (e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant))


def _read(node: ast.AST, module: str, cls: str | None, package: Package, own_bases: dict[str, list[str]]) -> None:
    """One pass over a module: its classes' members (``self.x = ...`` included), its string
    literals, what it imports from outside, and (in callback.py) the callback's parameters."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            package.classes.setdefault(child.name, set()).update(_top_level_names(child.body))
            own_bases.setdefault(child.name, []).extend(_base_name(b) for b in child.bases)
            _read(child, module, child.name, package, own_bases)
            continue
        if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store) and cls is not None:
            if isinstance(child.value, ast.Name) and child.value.id in ("self", "cls"):
                package.classes[cls].add(child.attr)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            package.literals.add(child.value)
        elif isinstance(child, ast.Import):
            package.outside |= {a.name.split(".")[0] for a in child.names} - {PACKAGE}
        elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
            package.outside |= {child.module.split(".")[0]} - {PACKAGE}
        elif isinstance(child, ast.FunctionDef) and child.name == "__init__" and module == "callback":
            package.options = tuple(a.arg for a in child.args.args[1:] + child.args.kwonlyargs)
        _read(child, module, cls, package, own_bases)


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""


def read_package(root: Path = ROOT) -> Package:
    package = Package()
    own_bases: dict[str, list[str]] = {}
    for path, tree in parsed(root):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        package.modules[module] = set(_top_level_names(tree.body)) | set(_exported(tree))
        package.module_classes[module] = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        _read(tree, module, None, package, own_bases)
    # A module is also an attribute of its package.
    for module in list(package.modules):
        if module:
            parent, _, stem = module.rpartition(".")
            package.modules.setdefault(parent, set()).add(stem)
            package.stems.setdefault(stem, []).append(module)

    def members(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out = set(package.classes.get(name, ()))
        for base in own_bases.get(name, ()):
            if base in package.classes and base not in seen:
                out |= members(base, seen | {name})
            elif base not in PLAIN_BASES:
                package.open_classes.add(name)
        return out

    package.classes = {name: members(name) for name in package.classes}
    constants = ast.parse((root / "constants.py").read_text(encoding="utf-8"))
    for node in constants.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if name.endswith("_SUFFIX") and isinstance(value, ast.Constant):
                package.suffixes.add(str(value.value))
            if name == "TRACE_PATTERN" and isinstance(value, ast.Call) and isinstance(value.args[0], ast.Constant):
                package.trace_pattern = re.compile(str(value.args[0].value))
    return package


@cache
def the_package() -> Package:
    return read_package()


# --------------------------------------------------------------------------------------------------
# The documents
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    where: str  # docs/cli.md, vt_lightning/export/pipeline.py
    text: str
    folder: Path | None = None  # for relative links: the document's folder (None: a docstring)


HISTORY_OPEN = re.compile(r"<!-- history\b[^>]*-->")
HISTORY = re.compile(r"<!-- history\b[^>]*-->.*?<!-- /history -->", re.S)


def without_history(where: str, text: str) -> str:
    """``text`` with its marked history blanked out (line numbers kept); unpaired markers fail."""
    opened, closed = len(HISTORY_OPEN.findall(text)), text.count("<!-- /history -->")
    assert opened == closed, f"{where}: {opened} '<!-- history ... -->' but {closed} '<!-- /history -->'"
    return HISTORY.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def documents(repo: Path = REPO) -> list[Text]:
    paths = [*sorted((repo / "docs").glob("*.md")), repo / "README.md", repo / "CONTRIBUTING.md"]
    out = []
    for path in paths:
        where = str(path.relative_to(repo))
        out.append(Text(where, without_history(where, path.read_text(encoding="utf-8")), path.parent))
    return out


def docstrings(root: Path = ROOT) -> list[Text]:
    out = []
    for path, tree in parsed(root):
        for node in definitions(tree):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(Text(f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 1)}", doc))
    return out


# --------------------------------------------------------------------------------------------------
# What a text names, and what of it does not exist
# --------------------------------------------------------------------------------------------------

MODULE_PATH = re.compile(
    r"(?<![\w/.-])(?:vt_lightning/)?"
    r"((?:analysis|export|recording|controller|cli|tensorboard)(?:/[a-z_]+)*|constants|options|callback|__main__)"
    r"(?:(/__init__)?\.py\b|(?<=[a-z_])\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?"
)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"``([^`\n]+)``|`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE_EXTENSIONS = frozenset({"py", "md", "json", "jsonc", "gz", "txt", "pickle", "png", "html", "yaml", "toml", "log"})
IMPORT = re.compile(r"^\s*from (vt_lightning(?:\.\w+)*) import \(?([\w, ]+)", re.M)
CALLBACK_CALL = re.compile(r"VizTraceCallback\(")
FLAG = re.compile(r"--viztrace\.(\w+)")
ENV = re.compile(r"\bVT_LIGHTNING_([A-Z][A-Z_]*[A-Z])\b")
SUFFIX = re.compile(
    r"(?<![\w])\.?((?:oom\.)?(?:summary|memory_snapshot|pt\.trace)\.(?:jsonc?|gz|md|pickle|pkl|txt|html|csv)(?:\.gz)?)\b"
)
REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|benchmarks|docs|examples|ci|\.ci)/[\w./-]*[\w])")
LINK = re.compile(r"\]\(([^)\s#:]+)(?:#[^)\s]*)?\)")
OPTION_TABLE = re.compile(r"^\| (?:option|`VizTraceCallback\(\.\.\.\)`) \|.*\n\|[-| :]+\|\n((?:\|.*\n?)+)", re.M)


def inline_spans(text: str) -> Iterator[str]:
    """What a text puts in backticks, outside fenced code blocks."""
    for match in INLINE.finditer(FENCE.sub("", text)):
        yield (match.group(1) or match.group(2)).strip()


def resolves(dotted: str, package: Package) -> bool | None:
    """True when ``dotted`` names code of the package or keys it writes, False when it starts as
    ours and goes nowhere, None when it is not ours to check."""
    parts = dotted.split(".")
    if parts[-1] in FILE_EXTENSIONS:
        return None  # a file name: ``vt_lightning.windows.txt``
    stems = package.stems
    if parts[0] == PACKAGE:
        starts = [("module", "")]
        parts = parts[1:]
    elif parts[0] in package.classes and parts[0] not in package.outside:
        starts = [("class", parts[0])]
        parts = parts[1:]
    elif parts[0] in stems and parts[0] not in package.outside:
        starts = [("module", module) for module in stems.get(parts[0], [])]
        parts = parts[1:]
    else:
        return None
    for kind, name in starts:
        if _walk(kind, name, parts, package):
            return True
    return all(part in package.literals for part in parts)  # a key of a file the package writes


def _walk(kind: str, name: str, parts: list[str], package: Package) -> bool:
    """Whether ``parts`` lead somewhere from the module or class ``name`` (``kind``)."""
    for i, part in enumerate(parts):
        if kind == "module":
            submodule = f"{name}.{part}" if name else part
            if submodule in package.modules:
                name = submodule
                continue
            if part not in package.modules.get(name, ()):
                # ``run.remote``: an instance named after its module, a member of a class defined there
                classes = package.module_classes.get(name, set())
                return i == 0 and any(part in package.classes.get(c, ()) for c in classes)
            if part in package.classes:
                kind, name = "class", part
                continue
            return True  # a function or a variable: what is below it is not read
        if part not in package.classes.get(name, ()):
            return name in package.open_classes and part not in package.classes  # a base's member
        if part in package.classes:
            name = part
            continue
        return True
    return True


@cache
def repository_file_names(repo: Path = REPO) -> frozenset[str]:
    """The names of the repository's own files (not its environments' or caches')."""
    names = set()
    for _, subfolders, files in os.walk(repo):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("build", "__pycache__")]
        names.update(files)
    return frozenset(names)


def _module_exists(path: str, package: Package) -> bool:
    return path.replace("/", ".") in package.modules


def _callback_keywords(text: str) -> Iterator[str]:
    for match in CALLBACK_CALL.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        arguments = text[match.end() : i - 1]
        inner = re.sub(r"\([^()]*\)|\[[^\[\]]*\]|\{[^{}]*\}", "", arguments)  # nested calls and lists
        yield from re.findall(r"(?:^|,)\s*(\w+)\s*=(?!=)", inner)


def table_options(text: str) -> Iterator[str]:
    """The names in the first column of the option tables (header ``| option |`` or
    ``| `VizTraceCallback(...)` |``)."""
    for table in OPTION_TABLE.finditer(text):
        for row in table.group(1).splitlines():
            yield from re.findall(r"`(\w+)`", row.split("|")[1])


def missing_names(text: Text, package: Package, repo: Path = REPO) -> list[str]:
    """Every name ``text`` gives that does not exist, as ``where: what``."""
    found = []
    body = text.text
    for match in MODULE_PATH.finditer(body):
        module, attribute = match.group(1).removesuffix("/__init__"), match.group(3)
        if "/" not in match.group(0).removesuffix(".py"):
            attribute = None  # ``analysis.get_temporal_breakdown``: a variable's, or checked below in backticks
        if not _module_exists(module, package):
            found.append(f"module {match.group(0)}")
        elif attribute and not _walk("module", module.replace("/", "."), attribute.split("."), package):
            found.append(f"name {match.group(0)}")
    stems = package.stems
    for span in inline_spans(body):
        candidate = re.sub(r"\(.*\)$", "", span)  # ``pipeline.finish_window(job)``: the name called
        if re.fullmatch(r"\w+\.py", span):  # ``pipeline.py``: a module of ours or a file of the repository
            shadowing = span[:-3] in package.outside  # ``orjson.py``: a stray file named like a package
            if not shadowing and span[:-3] not in stems and span not in repository_file_names(repo):
                found.append(f"file `{span}`")
        elif DOTTED.fullmatch(candidate) and resolves(candidate, package) is False:
            found.append(f"name `{span}`")
    for module, names in IMPORT.findall(body):
        path = module.split(".")[1:]
        if not _walk("module", "", path, package):
            found.append(f"module {module}")
            continue
        for name in filter(None, (n.strip() for n in names.split(","))):
            if not _walk("module", ".".join(path), [name], package):
                found.append(f"name {module}.{name}")
    options = set(package.options)
    flags = [flag for flag in FLAG.findall(body) if flag != "help"]  # ``--viztrace.help``: jsonargparse's
    variables = [name.lower() for name in ENV.findall(body) if f"VT_LIGHTNING_{name}" not in DELIBERATELY_ABSENT]
    for option in [*_callback_keywords(body), *flags, *variables, *table_options(body)]:
        if option not in options:
            found.append(f"option {option}")
    for match in SUFFIX.finditer(body):
        suffix = "." + match.group(1)
        if suffix not in package.suffixes and not package.trace_pattern.match("x" + suffix):
            found.append(f"suffix {suffix}")
    for match in REPO_PATH.finditer(body):
        if not (repo / match.group(1)).exists():
            found.append(f"file {match.group(1)}")
    if text.folder is not None:
        for target in LINK.findall(body):
            if not target.startswith(("http", "mailto")) and not (text.folder / target).exists():
                found.append(f"link {target}")
    return [f"{text.where}: {what}" for what in found]


def wrong_args(root: Path = ROOT) -> list[str]:
    """``Args:`` entries of docstrings that are not parameters of the function they document."""
    found = []
    for path, tree in parsed(root):
        for node in definitions(tree):
            if isinstance(node, ast.Module):
                continue
            doc = ast.get_docstring(node) or ""
            section = re.search(r"^Args:\n((?:[ \t]+.*\n?|\n)+)", doc + "\n", re.M)
            if not section:
                continue
            function = node
            if isinstance(node, ast.ClassDef):  # the class documents its __init__
                function = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = function.args
            params = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
            params |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a}
            indent = min(len(line) - len(line.lstrip()) for line in section.group(1).splitlines() if line.strip())
            for line in section.group(1).splitlines():
                entry = re.match(rf"^ {{{indent}}}\*{{0,2}}(\w+)(?: \([^)]*\))?:", line)
                if entry and entry.group(1) not in params:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: Args names {entry.group(1)}")
    return found


def all_missing(package: Package) -> list[str]:
    texts = documents() + docstrings()
    return sorted({line for text in texts for line in missing_names(text, package)}) + wrong_args()


def _unnumbered(line: str) -> str:
    return re.sub(r"^([^:]+\.py):\d+:", r"\1:", line)


def test_the_documents_and_docstrings_name_only_what_exists():
    found = {_unnumbered(line) for line in all_missing(the_package())}
    assert not found, "named but not there:\n" + "\n".join(sorted(found))


def test_every_option_is_in_the_option_tables():
    tables = set(table_options((REPO / "docs" / "options.md").read_text(encoding="utf-8")))
    assert set(the_package().options) - tables == set(), "options missing from docs/options.md"


def test_the_deliberately_wrong_names_are_still_wrong():
    package = the_package()
    for name in DELIBERATELY_ABSENT:
        assert name.removeprefix("VT_LIGHTNING_").lower() not in package.options, name


# --------------------------------------------------------------------------------------------------
# The check itself: what it reads, and a stale name planted in a copy of a real text
# --------------------------------------------------------------------------------------------------


def _architecture() -> Text:
    return next(text for text in documents() if text.where == "docs/architecture.md")


def planted(*lines: str) -> list[str]:
    """What the check reports for docs/architecture.md with ``lines`` added, beyond the real text."""
    real = _architecture()
    copy = Text(real.where, without_history(real.where, real.text + "\n" + "\n".join(lines) + "\n"), real.folder)
    return sorted(set(missing_names(copy, the_package())) - set(missing_names(real, the_package())))


def test_it_reads_the_package_and_the_documents():
    package = the_package()
    assert {"analysis.nest", "export.pipeline", "controller.controller", "cli", ""} <= set(package.modules)
    assert "finish_window" in package.modules["export.pipeline"]
    assert {"fail", "options"} <= package.classes["WindowController"]  # a method, an attribute
    assert "VizTraceLightningCLI" in package.modules["cli"]  # through __all__ and __getattr__
    assert {"skip_first", "worker_calls", "writer_timeout"} <= set(package.options)
    assert package.suffixes >= {".pt.trace.json.gz", ".summary.jsonc", ".summary.md", ".memory_snapshot.pickle"}
    wheres = {text.where for text in documents()}
    assert {"README.md", "CONTRIBUTING.md", "docs/architecture.md", "docs/performance.md"} <= wheres
    assert any(text.where.startswith("vt_lightning/export/pipeline.py:") for text in docstrings())


def test_names_that_exist_pass():
    assert (
        planted(
            "`pipeline.finish_window`, `WindowController.fail`, `analysis.nest`, `export.job.WindowJob`,",
            "`vt_lightning.cli.VizTraceLightningCLI`, `Calls.nest`, `run.remote`, `steps.counted`,",
            "`vt_lightning.nesting.cut_at_annotations`, `torch.compile`, `nest.py`, `examples/train.py`,",
            "analysis/verdicts/__init__.py, controller/handoff.finishes_at_end, `.summary.jsonc`, `x.pt.trace.json`,",
            "from vt_lightning.cli import VizTraceLightningCLI, callbacks_from_env",
            "VizTraceCallback(active=2, include_files=[a, b]) --viztrace.wait=1 VT_LIGHTNING_RANKS=0",
            "[options](options.md#budget) tests/unit/test_budget.py",
        )
        == []
    )


def test_a_planted_stale_name_fails_it():
    where = "docs/architecture.md: "
    cases = {
        "its sweep in `analysis/sweep.py`": "module analysis/sweep.py",
        "in vt_lightning/export/pipelines.py": "module vt_lightning/export/pipelines.py",
        "see controller/handoff.finishes_at_the_end": "name controller/handoff.finishes_at_the_end",
        "`pipeline.finish_windows`": "name `pipeline.finish_windows`",
        "`WindowController.fails()`": "name `WindowController.fails()`",
        "`analysis.sweep.nest`": "name `analysis.sweep.nest`",
        "`vt_lightning.analysis.sweep`": "name `vt_lightning.analysis.sweep`",
        "`sweep.py`": "file `sweep.py`",
        "from vt_lightning.cli import VizTraceCLI": "name vt_lightning.cli.VizTraceCLI",
        "VizTraceCallback(wait=1, actives=2)": "option actives",
        "--viztrace.actives=2": "option actives",
        "VT_LIGHTNING_ACTIVES=2": "option actives",
        "| option | default |\n|---|---|\n| `activ` | 3 |": "option activ",
        "the `.summary.json` beside it": "suffix .summary.json",
        "and h_0.0000000002.memory_snapshot.pkl": "suffix .memory_snapshot.pkl",
        "run tests/test_budget.py": "file tests/test_budget.py",
        "see [the options](option.md#budget)": "link option.md",
    }
    for line, report in cases.items():
        assert planted(line) == [where + report], line


def test_a_planted_stale_name_in_a_docstring_fails_it(tmp_path):
    source = (ROOT / "callback.py").read_text(encoding="utf-8")
    assert "        skip_first: batches to skip" in source
    (tmp_path / PACKAGE).mkdir()
    copy = source.replace("        skip_first: batches to skip", "        skip_firsts: batches to skip")
    copy = copy.replace('"""Trace your Python code', '"""Trace your Python code (``pipeline.finish_windows``)', 1)
    (tmp_path / PACKAGE / "callback.py").write_text(copy, encoding="utf-8")
    assert wrong_args(ROOT) == []
    line = copy[: copy.index("class VizTraceCallback(")].count("\n") + 1
    assert wrong_args(tmp_path / PACKAGE) == [f"{PACKAGE}/callback.py:{line}: Args names skip_firsts"]
    (text,) = [t for t in docstrings(tmp_path / PACKAGE) if "finish_windows" in t.text]
    assert missing_names(text, the_package()) == [f"{PACKAGE}/callback.py:{line}: name `pipeline.finish_windows`"]


def test_history_is_exempt_only_between_its_markers():
    stale = "`pipeline.finish_windows`"
    history = f"<!-- history: as measured then -->\n{stale}\n<!-- /history -->"
    assert planted(history) == []
    assert planted(history, stale) == ["docs/architecture.md: name `pipeline.finish_windows`"]
    with pytest.raises(AssertionError, match=re.escape("1 '<!-- history ... -->' but 0")):
        without_history("docs/x.md", f"<!-- history -->\n{stale}\n")
