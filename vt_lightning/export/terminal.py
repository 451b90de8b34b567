"""Text from files made safe for a terminal: a name read from a trace or a summary may hold ANSI escape
sequences, carriage returns or bidi overrides, and ``rich.markup.escape`` escapes only rich's own
markup. So everything printed goes through ``printable`` or ``json_for_terminal`` first."""

from __future__ import annotations

import unicodedata

# Bidi embedding, override and isolate controls ("Trojan Source"): they reorder what follows.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ELLIPSIS = "\u2026"


def _unsafe(char: str) -> bool:
    # Cc: C0 controls (ESC, CR, BEL, ...), DEL and C1 controls (CSI, OSC, ...); Cs: lone surrogates
    # (undecodable bytes in a file name), which would make the write itself fail.
    return unicodedata.category(char) in ("Cc", "Cs") or char in _BIDI_CONTROLS


def printable(text: object, limit: int | None = None) -> str:
    """``text`` with every control character escaped, cut to ``limit`` characters (an ellipsis marks it)."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 0)] + _ELLIPSIS
    if text.isprintable():  # the common case, in C
        return text
    return "".join(repr(char)[1:-1] if _unsafe(char) else char for char in text)


def printable_lines(text: str) -> str:
    """``printable`` per line: keeps the line breaks of a multi-line report, escapes the rest."""
    return "\n".join(printable(line) for line in text.split("\n"))


# JSON already escapes C0 controls inside strings; DEL, C1 and bidi controls it passes through.
# They can only occur inside JSON strings, where a \\u escape means the same character.
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0), *map(ord, _BIDI_CONTROLS))}


def json_for_terminal(encoded: bytes) -> str:
    """orjson's output with the control characters it leaves raw as ``\\uXXXX``: the same JSON value."""
    return encoded.decode("utf-8").translate(_JSON_ESCAPES)
