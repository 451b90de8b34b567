"""Decoding a raw dump whose strings a tracer wrote unescaped.

VizTracer's C ``dump`` (1.1.1) copies function and file names into its JSON as they are: a name
that holds a control character (ESC, BEL, CR, a newline: legal in a file name, and in a code
object's name) makes the whole dump invalid JSON, and a name that is not valid UTF-8 makes it
invalid UTF-8. ``loads`` parses the dump as it is, and only when that fails escapes what a JSON
string may not hold raw and parses it again: the names reach the trace escaped, the window is
written, and a valid dump pays nothing.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# One JSON string (a backslash escapes the next byte), in order from the start, so that whitespace
# between tokens (torch's indented JSON) is never taken for part of a string.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CONTROL = re.compile(rb"[\x00-\x1f]")
_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)  # a backslash and the byte it escapes
_ESCAPABLE = frozenset(b'"\\/bfnrtu')


def loads(data: bytes) -> Any:
    """``orjson.loads(data)``; on a decode error, once more after ``escape_raw_strings``. Raises
    the first error when the repaired text does not parse either."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        repaired = escape_raw_strings(data)
        if repaired == data:
            raise
        try:
            return orjson.loads(repaired)
        except orjson.JSONDecodeError:
            raise err from None


def escape_raw_strings(data: bytes) -> bytes:
    """``data`` with every raw control byte inside a JSON string written as its ``\\u00XX``
    escape, every backslash that starts no JSON escape doubled (VizTracer writes a function's
    name unescaped), and every byte sequence that is not UTF-8 replaced by U+FFFD. A raw ``"``
    in a function's name cannot be told from the string's end: such a dump stays invalid."""
    data = _STRING.sub(_escape_string, data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", "replace").encode("utf-8")
    return data


def _escape_string(match: re.Match[bytes]) -> bytes:
    text = match.group()
    if b"\\" in text:
        text = _ESCAPE.sub(_escape_backslash, text)
    if _CONTROL.search(text) is not None:
        text = _CONTROL.sub(lambda m: b"\\u%04x" % m.group()[0], text)
    return text


def _escape_backslash(match: re.Match[bytes]) -> bytes:
    escaped = match.group(1)
    return match.group() if escaped[0] in _ESCAPABLE else b"\\\\" + escaped
