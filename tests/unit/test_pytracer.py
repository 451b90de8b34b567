"""PythonTracer's warning about the interpreters with CPython's profiling bug (the tracer itself:
tests/integration/test_pytracer.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "version, affected",
    [
        ((3, 12, 0), True),
        ((3, 12, 3), True),
        ((3, 12, 4), True),
        ((3, 12, 5), False),
        ((3, 11, 7), False),
        ((3, 13, 0), False),
    ],
)
def test_the_versions_with_the_profiling_bug_are_named(version, affected):
    from vt_lightning.recording.pytracer import interpreter_warning

    message = interpreter_warning(version)
    assert (message is not None) == affected
    if affected:
        assert ".".join(map(str, version)) in message and "122029" in message and "3.12.5" in message
