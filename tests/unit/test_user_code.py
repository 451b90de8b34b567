"""The stages option names what it refuses (issue 12; the user's code in real runs:
tests/integration/test_user_code.py)."""

from __future__ import annotations

import pytest

from vt_lightning import VizTraceCallback


@pytest.mark.parametrize(
    "stages, message",
    [
        (["fit", "valdate"], r"`stages` names \['valdate'\]"),
        ("fit", "`stages` must be a non-empty list"),
        ([], "`stages` must be a non-empty list"),
        (["fit", "fit"], "`stages` lists a stage twice"),
    ],
)
def test_bad_stages_name_the_argument(stages, message):
    with pytest.raises(ValueError, match=message):
        VizTraceCallback(stages=stages)
