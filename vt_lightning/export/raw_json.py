"""Decoding a raw dump whose strings a tracer wrote unescaped: VizTracer's C ``dump`` copies names as
they are, so a control character makes it invalid JSON and a name that is not UTF-8 invalid UTF-8.
``loads`` repairs and parses again only when parsing fails (a valid dump pays nothing); ``readable``
writes a lone surrogate as U+FFFD, as ``loads`` reads such bytes."""

from __future__ import annotations

import re
from typing import Any

import orjson

# One JSON string (a backslash escapes the next byte), in order from the start, so that whitespace
# between tokens (torch's indented JSON) is never taken for part of a string.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CONTROL = re.compile(rb"[\x00-\x1f]")
# Control bytes that are not JSON whitespace: valid nowhere raw, so escaped wherever they are found.
_NOT_WHITESPACE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)  # a backslash and the byte it escapes
_ESCAPABLE = frozenset(b'"\\/bfnrtu')
# Escapes in order from a string's start: a surrogate pair (kept), a lone surrogate (group 1), or
# any other escape (kept), so that an escaped backslash is never read as starting a ``\u``.
_SURROGATE_ESCAPE = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(u[dD][89a-fA-F][0-9a-fA-F]{2})|.)", re.DOTALL
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(data: bytes) -> Any:
    """``orjson.loads(data)``; on a decode error, again after each repair in turn, cheapest first; raises
    the first error when no repair helps."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        error = err
    for repair in (escape_unambiguous, escape_raw_strings, escape_lone_surrogates):
        repaired = repair(data)
        if repaired == data:
            continue
        data = repaired
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    raise error


def escape_unambiguous(data: bytes) -> bytes:
    """``data`` with every control byte but JSON whitespace ``\\u00XX``-escaped (valid nowhere raw) and
    every byte sequence that is not UTF-8 replaced by U+FFFD, at C speed."""
    data = _NOT_WHITESPACE.sub(_escape_byte, data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", "replace").encode("utf-8")
    return data


def escape_raw_strings(data: bytes) -> bytes:
    """``escape_unambiguous``, and in every string a raw CR, newline or tab escaped and a stray backslash
    doubled (Python per string: ~10x the parse). A raw ``"`` in a name cannot be told from the end."""
    return _STRING.sub(_escape_string, escape_unambiguous(data))


def _escape_byte(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % match.group()[0]


def _escape_string(match: re.Match[bytes]) -> bytes:
    text = match.group()
    if b"\\" in text:
        text = _ESCAPE.sub(_escape_backslash, text)
    if _CONTROL.search(text) is not None:
        text = _CONTROL.sub(_escape_byte, text)
    return text


def _escape_backslash(match: re.Match[bytes]) -> bytes:
    escaped = match.group(1)
    return match.group() if escaped[0] in _ESCAPABLE else b"\\\\" + escaped


def readable(text: str) -> str:
    """``text`` with each lone surrogate (a name Python decoded from bytes that are not UTF-8) as U+FFFD."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def escape_lone_surrogates(data: bytes) -> bytes:
    """``data`` with every ``\\uD800``-``\\uDFFF`` escape that is not half of a pair written as
    ``\\ufffd`` (orjson refuses a lone one: "invalid high surrogate"); pairs are kept."""
    if b"\\u" not in data:
        return data
    return _STRING.sub(_escape_surrogates_in, data)


def _escape_surrogates_in(match: re.Match[bytes]) -> bytes:
    text = match.group()
    return _SURROGATE_ESCAPE.sub(_lone_surrogate, text) if b"\\u" in text else text


def _lone_surrogate(match: re.Match[bytes]) -> bytes:
    return match.group() if match.group(1) is None else b"\\ufffd"
