"""The run budget (issue 22: 9) on a real Trainer: past a limit no window opens and one warning names
the limit and its option; an ordinary schedule never meets it (the arithmetic:
tests/unit/test_budget.py)."""

from __future__ import annotations


# ---------------------------------------------------------------------------- with a real Trainer
def _fit(tmp_path, steps: int, **kwargs):
    import warnings

    from conftest import MarkerModel, loader, make_trainer

    from vt_lightning import VizTraceCallback

    cb = VizTraceCallback(**kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = MarkerModel()
        make_trainer(tmp_path, [cb], max_steps=steps).fit(model, loader(n=4 * steps))
    said = [str(w.message) for w in caught if "vt_lightning:" in str(w.message)]
    return cb, model, said


def test_one_batch_windows_at_every_batch_stop_at_the_time_share_with_one_warning(tmp_path, monkeypatch):
    # Before: 300 one-batch windows over 300 batches ran 65x slower, with no warning.
    monkeypatch.setattr("vt_lightning.options.BUDGET_GRACE_SECONDS", 0.5)  # the default is 3 s
    cb, model, said = _fit(tmp_path, 60, wait=0, warmup=0, active=1, repeat=0)
    assert model.train_batches == list(range(60))  # training goes on
    budget = [m for m in said if "run budget reached" in m]
    assert len(budget) == 1 and "`budget_time_share`" in budget[0] and "budget_time_share=0.1" in budget[0], said
    assert 1 <= len(cb.results) < 30, len(cb.results)


def test_the_bytes_limit_stops_windows_once_the_writer_reports_them(tmp_path):
    cb, model, said = _fit(tmp_path, 40, wait=1, warmup=0, active=1, repeat=0, budget_output_mb=0.001)
    assert model.train_batches == list(range(40))
    budget = [m for m in said if "run budget reached" in m]
    assert len(budget) == 1 and "`budget_output_mb`" in budget[0], said
    assert 1 <= len(cb.results) < 20  # windows open until the first answer is read, then none


def test_budget_windows_stops_the_schedule_with_one_warning_naming_where(tmp_path):
    cb, _, said = _fit(tmp_path, 20, wait=1, warmup=0, active=1, repeat=0, budget_windows=2)
    assert [r.trace_path.parent.name.split("-")[0] for r in cb.results] == ["window_000", "window_001"]
    (limit,) = [m for m in said if "budget_windows" in m]
    assert "budget_windows=2 reached with window 1" in limit and "from batch 5 on" in limit


def test_an_ordinary_schedule_never_meets_the_budget(tmp_path):
    cb, _, said = _fit(tmp_path, 12)
    assert len(cb.results) == 1
    assert not [m for m in said if "budget" in m or "budget_windows" in m], said
