"""Reading files back without trusting them (the ``vt-lightning`` command, the TensorBoard tab):
regular files only (``stat`` before an ``O_NONBLOCK`` open, ``fstat`` after: never blocked on a
FIFO), bounded reads charged to one ``MemoryBudget`` before parsing (a gzip bomb is refused after at
most the budget), summaries schema-checked field by field (one message naming file and field), and
remote roots the same way through fsspec. Caps: docs/cli.md."""

from __future__ import annotations

import gzip
import math
import os
import stat
import types
import typing
import zlib
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import IO, Any, cast

import orjson

from vt_lightning.analysis.schema import SCHEMA_VERSION, Summary
from vt_lightning.export.job import URL, Location, UnusableURL, locate, url_filesystem
from vt_lightning.export.terminal import printable

MIB = 1 << 20
CHUNK_BYTES = MIB
DEFAULT_MEMORY_BUDGET = 640 * MIB  # all parsing of one command: peak RSS stays under 1 GB (tests)
SUMMARY_MAX_BYTES = 16 * MIB  # a .summary.jsonc is about 10 KB; this is a file size
VIEW_MAX_INFLATED_BYTES = 1024 * MIB  # browser viewers go blank above ~300-500 MB of JSON (viewing.md)


class SummaryNotFound(Exception):
    """Nothing to read where the user pointed; the message is one line for the console."""


class UnreadableFile(SummaryNotFound):
    """One file is not what its name says; with several files, the command skips it and warns."""


def locate_target(target: str | os.PathLike[str]) -> Location:
    """Where a command's argument points, by the callback's rule for its output root (``job.locate``);
    a URL whose filesystem cannot be had here is one line naming it."""
    try:
        return locate(target)
    except UnusableURL as err:
        raise SummaryNotFound(_cannot_read(err.url, err.cause)) from None


def _cannot_read(url: str, err: Exception) -> str:
    return (
        f"{url}: cannot read this URL here ({type(err).__name__}: {err}); install what its filesystem "
        "needs (s3fs for s3://, gcsfs for gs://, adlfs for az://)"
    )


def _filesystem(url: str) -> tuple[Any, str]:
    """``job.url_filesystem``; a filesystem that cannot be had is one line naming the URL."""
    try:
        return url_filesystem(url)
    except UnusableURL as err:
        raise SummaryNotFound(_cannot_read(url, err.cause)) from None


def list_files(place: Location, suffixes: tuple[str, ...]) -> list[tuple[Location, float]] | None:
    """(file, mtime or 0) of every file under ``place`` whose name ends with one of ``suffixes``, in name
    order; None when ``place`` is a file; SummaryNotFound when nothing is there."""
    if isinstance(place, URL):
        return _remote_files(place, suffixes)
    if not place.exists():
        raise SummaryNotFound(f"{place}: no such file or directory")
    if not place.is_dir():
        return None
    return [(path, _mtime(path)) for path in sorted(place.rglob("*")) if path.name.endswith(suffixes)]


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:  # a dangling link: refused when read
        return 0.0


def _remote_files(url: URL, suffixes: tuple[str, ...]) -> list[tuple[Location, float]] | None:
    fs, root = _filesystem(url)
    root = root.rstrip("/")
    try:
        info = fs.info(root)
    except FileNotFoundError:
        raise SummaryNotFound(f"{url}: no such file or directory") from None
    except Exception as err:  # a store that refuses us: credentials, permissions, network
        raise SummaryNotFound(f"{url}: cannot read it ({type(err).__name__}: {err})") from None
    if info.get("type") != "directory":
        return None
    found: list[tuple[Location, float]] = []
    for path, details in sorted(fs.find(root, detail=True).items()):
        if "://" in path:  # a filesystem whose listings keep the protocol
            path = _filesystem(path)[1]
        relative = path[len(root) :].lstrip("/")
        if details.get("type", "file") == "file" and relative.endswith(suffixes):
            found.append((url / relative, _modified(details)))
    return found


def _modified(info: dict[str, Any]) -> float:
    """A store's modification time, whatever it calls it (0 when it keeps none)."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        timestamp = getattr(value, "timestamp", None)  # a datetime
        if callable(timestamp):
            return float(timestamp())
    return 0.0


def _open_remote(url: URL) -> IO[bytes]:
    """A remote file opened if the store calls it a file; anything else is an ``UnreadableFile``."""
    fs = _filesystem(url)[0]
    try:
        if fs.info(url).get("type") == "file":
            return cast(IO[bytes], fs.open(url, "rb", block_size=CHUNK_BYTES))
    except Exception as err:  # a store's own errors (network, credentials, permissions): one message
        raise UnreadableFile(f"{url}: cannot open it ({type(err).__name__}: {err})") from None
    raise UnreadableFile(f"{url}: not a file; vt-lightning reads only files")


def _not_regular(path: str | os.PathLike[str], mode: int) -> UnreadableFile:
    kind = "not a regular file"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            kind = name
    return UnreadableFile(f"{path}: {kind}, not a regular file; vt-lightning reads only regular files")


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Follows symlinks, never opens: safe on a FIFO. A URL: what its store calls a file."""
    if isinstance(path, URL):
        try:
            return bool(_filesystem(path)[0].isfile(path))
        except Exception:  # a store's own errors (network, credentials): not a file we can read
            return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` if it is a regular file; anything else is an ``UnreadableFile``, before it could block."""
    if isinstance(path, URL):
        return _open_remote(path)
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise UnreadableFile(f"{path}: cannot open it ({getattr(err, 'strerror', None) or err})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # replaced between stat and open
        os.close(fd)
        raise _not_regular(path, mode)
    return os.fdopen(fd, "rb")


def _chunks(path: Path | URL) -> Iterator[bytes]:
    """The file's bytes in chunks of at most ``CHUNK_BYTES``, inflated if it is gzip (by name)."""
    with open_regular(path) as raw:
        stream: IO[bytes] = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if path.name.endswith(".gz") else raw
        try:
            while chunk := stream.read(CHUNK_BYTES):
                yield chunk
        except EOFError:
            raise UnreadableFile(f"{path}: not readable (truncated gzip: it ends before the end of its data)") from None
        except (OSError, zlib.error) as err:  # BadGzipFile is an OSError
            raise UnreadableFile(f"{path}: not readable ({type(err).__name__}: {err})") from None
        finally:
            stream.close()


def _first_byte_is_brace(chunk: bytes) -> bool:
    return chunk.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"")


def check_trace_stream(path: Path | URL, max_inflated: int = VIEW_MAX_INFLATED_BYTES) -> int:
    """Read the whole trace as a stream, keeping nothing: is it complete gzip (if named .gz), a JSON
    object by its first byte, and at most ``max_inflated`` bytes inflated? Returns that size."""
    total = 0
    for chunk in _chunks(path):
        if total == 0 and not _first_byte_is_brace(chunk):
            raise UnreadableFile(f"{path}: not a trace (its content is not a JSON object)")
        total += len(chunk)
        if total > max_inflated:
            raise UnreadableFile(
                f"{path}: refused, it inflates to more than {max_inflated // MIB} MiB of JSON, "
                "more than a browser trace viewer loads"
            )
    if total == 0:
        raise UnreadableFile(f"{path}: empty file")
    return total


def download(url: URL, directory: Path, max_bytes: int = VIEW_MAX_INFLATED_BYTES) -> Path:
    """A remote file streamed into ``directory`` under its own name, refused past ``max_bytes``."""
    target = directory / url.name
    written = 0
    with open_regular(url) as source, open(target, "xb") as out:
        while chunk := source.read(CHUNK_BYTES):
            written += len(chunk)
            if written > max_bytes:
                raise UnreadableFile(f"{url}: refused, larger than {max_bytes // MIB} MiB")
            out.write(chunk)
    return target


def parsed_size_bound(data: bytes | bytearray) -> int:
    """An upper bound, in bytes, of what ``orjson.loads(data)`` allocates: per object, list and
    value from the bytes that open them, plus the strings (4 bytes a character unless all ASCII);
    above every shape tried (tests/system/test_cli_hostile.py)."""
    return _containers_and_values(data) + (1 if _narrow(data) else 4) * len(data)


def _containers_and_values(data: bytes | bytearray) -> int:
    return 200 * data.count(b"{") + 100 * data.count(b"[") + 90 * data.count(b",") + 60 * data.count(b":")


def _narrow(data: bytes | bytearray) -> bool:
    """No character that makes a string wider than 1 byte a character (a ``\\u`` escape may)."""
    return data.isascii() and b"\\u" not in data and not data.endswith(b"\\")


class MemoryBudget:
    """What one command may hold of parsed files, charged before each parse."""

    def __init__(self, limit_bytes: int = DEFAULT_MEMORY_BUDGET) -> None:
        self.limit = limit_bytes
        self.used = 0

    def require(self, path: Path | URL, need: int, read: int) -> None:
        """``need``: bytes the file takes once parsed, by what ``read`` bytes of it show so far."""
        if self.used + need > self.limit:
            spent = f" ({self.used // MIB} MiB already taken by earlier files)" if self.used else ""
            raise UnreadableFile(
                f"{path}: refused after reading {read / MIB:.0f} MiB of it: parsing it would take more than the "
                f"{self.limit // MIB} MiB memory budget{spent}; raise it with --max-memory-mb"
            )

    def charge(self, amount: int) -> None:
        self.used += amount


def read_json(path: Path | URL, budget: MemoryBudget, max_bytes: int | None = None) -> tuple[Any, int]:
    """Parse ``path`` (gzip-inflated as a stream if named .gz), refusing it as soon as its bytes
    plus their parsed size would pass the budget. Returns (value, its parsed size bound)."""
    buffer = bytearray()
    containers_and_values, narrow, bound = 0, True, 0
    for chunk in _chunks(path):
        if not buffer and not _first_byte_is_brace(chunk):
            raise UnreadableFile(f"{path}: not a vt_lightning file (its content is not a JSON object)")
        buffer += chunk
        if max_bytes is not None and len(buffer) > max_bytes:
            raise UnreadableFile(f"{path}: refused, larger than {max_bytes // MIB} MiB")
        # parsed_size_bound(buffer), chunk by chunk: one wide character widens every string, so
        # once one is seen all bytes count 4 (an escape cut at a chunk's edge counts as wide).
        containers_and_values += _containers_and_values(chunk)
        narrow = narrow and _narrow(chunk)
        bound = containers_and_values + (1 if narrow else 4) * len(buffer)
        budget.require(path, len(buffer) + bound, len(buffer))
    try:
        value = orjson.loads(buffer)
    except orjson.JSONDecodeError as err:
        raise UnreadableFile(f"{path}: not valid JSON ({err})") from None
    return value, bound


@cache
def _fields(typed_dict: type) -> dict[str, Any]:
    return typing.get_type_hints(typed_dict)


def _describe(expected: Any) -> str:
    if expected is type(None):
        return "null"
    if typing.is_typeddict(expected):
        return "an object"
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(expected))
    return {
        list: "a list",
        dict: "an object",
        float: "a number",
        int: "an integer",
        str: "a string",
        bool: "true or false",
    }.get(origin or expected, str(expected))


def _got(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = orjson.dumps(value[:40]).decode()
        if len(value) > 40:
            shown = shown[:-1] + '..."'
        return f"the string {printable(shown)}"
    return "a list" if isinstance(value, list) else "an object"


def _matches_scalar(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is type(None):
        return value is None
    return isinstance(value, expected)


def schema_problems(value: Any, expected: Any, field: str, described: str | None = None) -> Iterator[str]:
    """Each way ``value`` differs from the schema type ``expected``, as ``field: what``. Keys the
    schema does not know are allowed (a newer writer's); only the schema's depth is walked.
    ``described``: how to name the expected type when the value is the wrong kind altogether."""
    origin = typing.get_origin(expected)
    if expected is Any:
        return

    def wrong() -> str:  # built only when it is reported
        return f"{field}: expected {described or _describe(expected)}, got {_got(value)}"

    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(expected)
        if value is None and type(None) in arms:
            return
        others = [arm for arm in arms if arm is not type(None)]
        if len(others) == 1:
            yield from schema_problems(value, others[0], field, _describe(expected))
        elif all(list(schema_problems(value, arm, field)) for arm in arms):
            yield wrong()
        return
    if typing.is_typeddict(expected):
        if not isinstance(value, dict):
            yield wrong()
            return
        prefix = f"{field}." if field else ""
        for key, inner in _fields(expected).items():  # in the schema's order
            if key in value:
                yield from schema_problems(value[key], inner, prefix + key)
            elif key in expected.__required_keys__:
                yield f"{prefix}{key}: missing"
        return
    if origin in (list, dict):
        if not isinstance(value, origin):
            yield wrong()
            return
        item = typing.get_args(expected)[-1]  # list[item], dict[str, item]
        entries: Iterable[tuple[Any, Any]] = enumerate(value) if origin is list else value.items()
        for key, element in entries:
            yield from schema_problems(element, item, f"{field}.{key}")
        return
    if not _matches_scalar(value, expected):
        yield wrong() + (" (not finite)" if expected is float and isinstance(value, float) else "")


def check_summary(data: Any, source: str) -> Summary:
    """``data`` as a Summary, else an UnreadableFile naming ``source`` and the first field that differs."""
    if not isinstance(data, dict) or "schema" not in data:
        raise UnreadableFile(f"{source}: not a vt_lightning summary (no 'schema' field)")
    schema = data["schema"]
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        raise UnreadableFile(
            f"{source}: written by a newer vt_lightning (summary schema {schema}; this version reads "
            f"{SCHEMA_VERSION}): upgrade vt_lightning to read it"
        )
    problems = list(schema_problems(data, Summary, ""))
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise UnreadableFile(f"{source}: field {problems[0]}{more}")
    return cast(Summary, data)


def read_summary(path: str | os.PathLike[str], budget: MemoryBudget | None = None) -> Summary:
    """One ``.summary.jsonc``, bounded and schema-checked, with ``_path`` (where it was read) added."""
    budget = budget or MemoryBudget()
    data, size = read_json(path if isinstance(path, URL) else Path(path), budget, max_bytes=SUMMARY_MAX_BYTES)
    summary = check_summary(data, str(path))
    budget.charge(size)  # kept for the whole command
    cast(dict[str, Any], summary)["_path"] = str(path)
    return summary


def read_trace(path: Path | URL, budget: MemoryBudget) -> dict[str, Any]:
    """A whole trace, parsed within the budget (not charged: the caller keeps only its summary)."""
    data, _ = read_json(path, budget)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UnreadableFile(f"{path}: not a trace (no traceEvents list)")
    return cast(dict[str, Any], data)
