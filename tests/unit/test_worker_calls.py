"""``worker_calls`` refuses what it does not know, by name (issue 39; what a traced worker records:
tests/integration/test_worker_calls.py)."""

from __future__ import annotations

import pytest

from vt_lightning import VizTraceCallback


@pytest.mark.parametrize("value", ["some", None, True])
def test_worker_calls_rejects_what_it_does_not_know_by_name(value):
    with pytest.raises(ValueError, match="worker_calls"):
        VizTraceCallback(worker_calls=value)
