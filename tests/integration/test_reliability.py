"""The profiler never harms training, never leaves a broken file or a hook behind (issue 8), on a
real Trainer."""

from __future__ import annotations

import errno
import signal
import sys
import threading
import warnings

import lightning as L
import pytest
import torch
from conftest import MarkerModel, load_trace, loader, make_trainer, marker_steps, trace_files
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler

import vt_lightning.controller.handoff as background
import vt_lightning.export.pipeline as finish
from vt_lightning import VizTraceCallback
from vt_lightning.export.layout import TRACE_PATTERN


def assert_clean(model: torch.nn.Module | None = None) -> None:
    """No profile hook, no torch profiler, no module hook is left behind."""
    assert sys.getprofile() is None
    assert threading.getprofile() is None
    if sys.version_info >= (3, 12):  # VizTracer's hook there; sys.getprofile() never shows it
        assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is None
    assert not torch.autograd.profiler._is_profiler_enabled
    if model is not None:
        for module in model.modules():
            assert not module._forward_hooks and not module._forward_pre_hooks, module


def no_partial_files(root) -> None:
    for path in root.rglob("*"):
        assert not (path.name.endswith(".tmp") and TRACE_PATTERN.match(path.name)), path


class Boom(RuntimeError):
    pass


class FailsAt(MarkerModel):
    def __init__(self, at: int, exc: BaseException) -> None:
        super().__init__()
        self.at, self.exc = at, exc

    def training_step(self, batch, batch_idx):
        if self.trainer.fit_loop.total_batch_idx == self.at:
            raise self.exc
        return super().training_step(batch, batch_idx)


def test_exception_in_a_window_propagates_and_leaves_a_complete_partial_window(tmp_path):
    model = FailsAt(3, Boom("user bug"))
    trainer = make_trainer(tmp_path, [VizTraceCallback(wait=1, warmup=1, active=3)], max_steps=10)
    with pytest.raises(Boom, match="user bug"):
        trainer.fit(model, loader())
    assert_clean(model)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    (path,) = trace_files(tmp_path)
    meta = load_trace(path)["vt_lightning"]
    assert meta["partial"] is True and "Boom" in meta["partial_reason"]
    assert meta["steps"] == [2, 3]
    no_partial_files(tmp_path)


def test_keyboard_interrupt_in_a_window(tmp_path):
    model = FailsAt(2, KeyboardInterrupt())
    trainer = make_trainer(tmp_path, [VizTraceCallback(wait=0, warmup=1, active=3)], max_steps=10)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning turns Ctrl+C into a graceful exit(1)
            trainer.fit(model, loader())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_clean(model)
    (path,) = trace_files(tmp_path)
    assert load_trace(path)["vt_lightning"]["partial"] is True
    no_partial_files(tmp_path)


def test_should_stop_inside_a_window_writes_the_steps_it_got(tmp_path):
    class StopsAt(MarkerModel):
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.total_batch_idx == 3:
                self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

    model = StopsAt()
    make_trainer(tmp_path, [VizTraceCallback(wait=1, warmup=1, active=4)], max_steps=20).fit(model, loader())
    (path,) = trace_files(tmp_path)
    meta = load_trace(path)["vt_lightning"]
    assert meta["steps"] == [2, 3] and meta["partial"] is True
    assert_clean(model)


def test_an_epoch_end_inside_a_window_does_not_cut_it(tmp_path):
    # 4 batches per epoch; the window records batches 3, 4, 5 across the epoch boundary.
    cb = VizTraceCallback(wait=2, warmup=1, active=3)
    make_trainer(tmp_path, [cb], max_epochs=3, max_steps=-1).fit(MarkerModel(), loader(n=16))
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    assert trace["vt_lightning"]["steps"] == [3, 4, 5] and trace["vt_lightning"]["partial"] is False
    assert marker_steps(trace) == {3, 4, 5}


def test_ranks_beyond_the_world_size_are_refused_at_setup(tmp_path):
    trainer = make_trainer(tmp_path, [VizTraceCallback(ranks=[3])], max_steps=2)
    with pytest.raises(ValueError, match=r"`ranks`.*world_size=1"):
        trainer.fit(MarkerModel(), loader())


def test_a_file_where_the_directory_should_be(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=3, dirpath=str(blocker / "traces"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=6).fit(MarkerModel(), loader())
    problems = [w for w in caught if "could not write" in str(w.message)]
    assert len(problems) == 1  # one warning per problem, not one per window
    assert "blocker" in str(problems[0].message)
    assert blocker.read_text() == "not a directory"
    assert_clean()


def test_disk_full_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "USE_WRITER_PROCESS", False)  # inject the fault in this process
    real_write = finish.atomic_write

    def full_disk(path, data, **kwargs):
        def half_then_fail(f):
            f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        real_write(path, half_then_fail, **kwargs)

    monkeypatch.setattr(finish, "atomic_write", full_disk)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = MarkerModel()
        make_trainer(tmp_path, [cb], max_steps=4).fit(model, loader())
    assert model.train_batches == [0, 1, 2, 3]  # training completed
    assert len([w for w in caught if "No space left" in str(w.message)]) == 1
    assert not trace_files(tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


class UserProfiler(Callback):
    """A user's own torch.profiler running through the whole fit."""

    def on_train_start(self, trainer, pl_module):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()

    def on_train_end(self, trainer, pl_module):
        self.prof.__exit__(None, None, None)


def test_a_users_torch_profiler_is_left_alone(tmp_path):
    user = UserProfiler()
    cb = VizTraceCallback(wait=0, warmup=1, active=1, repeat=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [user, cb], max_steps=6).fit(MarkerModel(), loader())
    assert len([w for w in caught if "already recording" in str(w.message)]) == 1
    assert not trace_files(tmp_path)
    user.prof.export_chrome_trace(str(tmp_path / "user.json"))  # the user's trace is intact
    assert (tmp_path / "user.json").stat().st_size > 0
    assert_clean()


@pytest.mark.parametrize("profiler", ["pytorch", "advanced"])
def test_lightning_profilers_disable_the_callback_with_a_warning(tmp_path, profiler):
    cb = VizTraceCallback(wait=0, warmup=0, active=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=3, profiler=profiler).fit(MarkerModel(), loader())
    assert len([w for w in caught if "Trainer(profiler=...)" in str(w.message)]) == 1
    assert not trace_files(tmp_path)


def test_a_foreign_profile_hook_skips_windows_and_survives(tmp_path):
    calls = []

    def other_tool(frame, event, arg):
        calls.append(event)

    class WithHook(Callback):
        def on_train_start(self, trainer, pl_module):
            sys.setprofile(other_tool)

        def on_train_end(self, trainer, pl_module):
            self.still_set = sys.getprofile() is other_tool
            sys.setprofile(None)

    hook = WithHook()
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [hook, cb], max_steps=4).fit(MarkerModel(), loader())
    assert hook.still_set and calls
    assert len([w for w in caught if "sys.setprofile" in str(w.message)]) == 1
    assert not trace_files(tmp_path)


def test_viztracer_already_running_is_detected(tmp_path):
    from viztracer import VizTracer

    cb = VizTraceCallback(wait=0, warmup=0, active=1)
    outer = VizTracer(verbose=0, tracer_entries=100_000)
    outer.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_trainer(tmp_path, [cb], max_steps=2).fit(MarkerModel(), loader())
        assert outer.enable
    finally:
        outer.stop()
        outer.clear()
        threading.setprofile(None)  # VizTracer itself never takes its thread hook back
        import builtins
        import gc

        builtins.__dict__.pop("__viz_tracer__", None)
        del outer
        gc.collect()  # deallocated now: a VizTracer resets threading.setprofile when it goes
    # One warning about the running VizTracer (on 3.12.0-3.12.4 another names the interpreter bug).
    assert len([w for w in caught if "VizTracer" in str(w.message) and "122029" not in str(w.message)]) == 1
    assert not trace_files(tmp_path)


def test_fit_twice_then_validate_follows_the_global_batch_count(tmp_path):
    cb = VizTraceCallback(wait=1, warmup=0, active=1, repeat=0)
    model = MarkerModel()
    trainer = make_trainer(tmp_path, [cb], max_steps=4, limit_val_batches=2)
    trainer.fit(model, loader(), loader(n=8))
    trainer.fit_loop.epoch_loop.max_steps = 8
    trainer.fit(model, loader(), loader(n=8))
    trainer.validate(model, loader(n=8))
    steps = sorted(s for p in trace_files(tmp_path) for s in load_trace(p)["vt_lightning"]["steps"])
    assert steps == [1, 3, 5, 7]
    assert_clean(model)


def _steps(root) -> dict[str, list[int]]:
    return {p.parent.name: load_trace(p)["vt_lightning"]["steps"] for p in trace_files(root)}


@pytest.mark.parametrize("every_n_train_steps", [None, 10], ids=["at an epoch end", "mid-epoch"])
def test_a_resumed_fit_profiles_its_own_first_batches_and_the_table_keeps_both_fits(tmp_path, every_n_train_steps):
    """A requeued job resumes from its checkpoint: the schedule counts from the resumed fit's first
    batch (as torch.profiler's from its own start), the window keeps its global batch numbers, and
    ``vt_lightning.windows.txt`` keeps the first fit's section beside the resumed fit's."""
    ckpt = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=every_n_train_steps
    )
    stop = dict(max_steps=every_n_train_steps or -1, max_epochs=1)
    first = make_trainer(tmp_path, [VizTraceCallback(), ckpt], enable_checkpointing=True, logger=False, **stop)
    first.fit(MarkerModel(), loader(n=160))  # 40 batches per epoch
    assert _steps(tmp_path) == {"window_000-batches_2-4": [2, 3, 4]}
    start = every_n_train_steps or 40

    resumed = make_trainer(tmp_path, [VizTraceCallback()], max_steps=-1, max_epochs=2, logger=False)
    resumed.fit(MarkerModel(), loader(n=160), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    name = f"window_000-batches_{start + 2}-{start + 4}"
    assert _steps(tmp_path) == {"window_000-batches_2-4": [2, 3, 4], name: [start + 2, start + 3, start + 4]}
    table = (tmp_path / "vt_lightning.windows.txt").read_text().splitlines()
    titles = [line for line in table if line.startswith("vt_lightning: ")]
    assert [t.split(" (")[0] for t in titles] == ["vt_lightning: fit 1", "vt_lightning: fit 2"], table
    assert f"batches 0-{start - 1})" in titles[0] and f"batches {start}-79)" in titles[1], titles
    rows = [line.split("\t") for line in table if line.startswith("0\t")]
    assert [(row[1], row[-1]) for row in rows] == [
        ("2-4", "window_000-batches_2-4"),
        (f"{start + 2}-{start + 4}", name),
    ]


def test_a_resumed_fit_too_short_for_a_window_says_what_it_ran(tmp_path, caplog):
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    make_trainer(tmp_path, [ckpt], max_steps=-1, max_epochs=1, enable_checkpointing=True).fit(
        MarkerModel(), loader(n=160)
    )
    with caplog.at_level("INFO", logger="lightning.pytorch.utilities.rank_zero"):
        make_trainer(tmp_path, [VizTraceCallback()], max_steps=41).fit(
            MarkerModel(), loader(n=160), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
        )
    said = [r.getMessage() for r in caplog.records if "no window was recorded" in r.getMessage()]
    assert said == [
        "vt_lightning: no window was recorded: fit ran 1 training batch(es) from global batch 40 (the schedule "
        "counts from each fit's first batch), and the first window's warmup starts at its batch 1 (skip_first=0, "
        "wait=1). Lower `skip_first` / `wait`, or run more batches."
    ]


def test_a_huge_window_warns_with_numbers_and_remedies(tmp_path, monkeypatch):
    import vt_lightning.controller.inbox as inbox

    monkeypatch.setattr(inbox, "BROWSER_LIMIT_BYTES", 1000)
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=3).fit(MarkerModel(), loader())
    big = [str(w.message) for w in caught if "MB of JSON" in str(w.message)]
    assert len(big) == 1 and "min_duration" in big[0] and "active" in big[0]


def test_compiled_model_traces_without_recompiling(tmp_path):
    import torch._dynamo

    torch._dynamo.reset()

    class Compiled(MarkerModel):
        def __init__(self):
            super().__init__()
            self.net = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), backend="eager")

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.layer(self.net(x)).pow(2).mean()

    model = Compiled()
    model.net(torch.randn(4, 8))  # compile before any window
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=1)
    make_trainer(tmp_path, [cb], max_steps=6).fit(model, loader())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_before
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    assert trace["vt_lightning"]["steps"] == [2, 3]
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])
    assert_clean(model)
