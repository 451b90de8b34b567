"""Verdicts (analysis/verdicts.py) on small synthetic merged traces: each rule fires on its seeded
slowness and names the user's function, stays silent on a healthy window, and is tested at the
edges of its threshold. GPU-only kinds use small fakes of the kernel trace; one test marked
``cuda`` checks host_sync on a real GPU where there is one."""

from __future__ import annotations

import gc
import queue
from typing import Any

import pytest

from vt_lightning.analysis.compare import diff
from vt_lightning.analysis.summary import summarize
from vt_lightning.analysis.verdict_report import verdict_change_lines, verdict_line
from vt_lightning.analysis.verdicts.input import untraced_reading
from vt_lightning.constants import UNTRACED_WAIT_KEY
from vt_lightning.controller.data_wait import UNTRACED_STEPS_KEPT, UntracedWaits
from vt_lightning.controller.loggers import summary_scalars
from vt_lightning.export.reading import check_summary
from vt_lightning.export.report import render_markdown
from vt_lightning.recording.gc_watch import GcWatch

USER = "/src/train.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py"
LIGHTNING = "/venv/lib/python3.11/site-packages/lightning/pytorch/loops/fetchers.py"
PID, TID = 100, 100
STEP_US = 10_000.0
STEPS = 4  # the first is left out of every per-step number: 3 counted steps
# The untraced steps before the window waited too: in process, input_bound needs them to.
WAITED = {"steps": 2, "data_wait_ms": 6.0, "share": 0.4, "step_ms": 15.0}


def x(name: str, ts: float, dur: float, cat: str = "FEE", pid: Any = PID, tid: Any = TID, **args: Any) -> dict:
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def py(function: str, ts: float, dur: float, path: str = USER, line: int = 10, **kw: Any) -> dict:
    return x(f"{function} ({path}:{line})", ts, dur, **kw)


def window(per_step: Any, steps: int = STEPS, step_us: float = STEP_US, **top: Any) -> dict:
    """A merged trace of ``steps`` steps; ``per_step(t0)`` gives the events of the step at ``t0``."""
    events = []
    for n in range(steps):
        t0 = 1_000.0 + n * step_us
        events.append(x(f"ProfilerStep#{n}", t0, step_us, cat="user_annotation"))
        events += per_step(t0)
    return {**top, "vt_lightning": {"window": 0, UNTRACED_WAIT_KEY: WAITED}, "traceEvents": events}


def stage(action: str, ts: float, dur: float) -> dict:
    return x(f"[pl][profile][_TrainingEpochLoop].{action}", ts, dur, cat="user_annotation")


def kinds(trace: dict, snapshot: Any = None) -> list[str]:
    return [v["kind"] for v in summarize(trace, snapshot)["verdicts"]]


def only(trace: dict, kind: str, snapshot: Any = None) -> dict:
    (found,) = [v for v in summarize(trace, snapshot)["verdicts"] if v["kind"] == kind]
    return found


# --------------------------------------------------------------------------------------------------
# input_bound
# --------------------------------------------------------------------------------------------------


def fetching(wait_us: float, getitem_us: float | None = None) -> Any:
    def step(t0: float) -> list[dict]:
        events = [stage("train_dataloader_next", t0 + 10, wait_us), stage("training_step", t0 + 20 + wait_us, 500)]
        events.append(py("_MapDatasetFetcher.fetch", t0 + 15, wait_us - 10, path=TORCH, line=40))
        if getitem_us:
            events.append(py("Rows.__getitem__", t0 + 20, getitem_us, line=33))
            events.append(py("decode", t0 + 30, getitem_us / 2, line=50))  # called by __getitem__
        return events

    return step


def test_input_bound_names_the_dataset_getitem_and_then_its_slowest_callee() -> None:
    found = only(window(fetching(6_000, 5_000)), "input_bound")
    # The entry into user code first, then the user function under it that took the time, with its
    # share of the entry's time (decode: 2.5 of __getitem__'s 5 ms).
    assert found["where"] == [
        {"function": "Rows.__getitem__", "file": USER, "line": 33, "ms": 5.0},
        {"function": "decode", "file": USER, "line": 50, "ms": 2.5, "share": 0.5},
    ]
    assert found["evidence"]["share"] == pytest.approx(0.6)
    assert found["evidence"]["source"] == "main process"
    assert found["advice"].startswith("Fetch batches in parallel")


@pytest.mark.parametrize(("wait_us", "fires"), [(2_500, True), (2_400, False), (1_000, False)])
def test_input_bound_threshold_is_a_quarter_of_the_step(wait_us: float, fires: bool) -> None:
    assert ("input_bound" in kinds(window(fetching(wait_us, wait_us / 2)))) is fires


def test_input_bound_needs_a_millisecond_per_step() -> None:
    tiny_steps = window(fetching(600, 300), step_us=1_000)  # 60 % of a 1 ms step: too small to matter
    assert "input_bound" not in kinds(tiny_steps)


def test_one_slow_fetch_among_fast_ones_is_not_input_bound() -> None:
    """A healthy model on a loaded machine: the OS descheduled one fetch (9 ms), the others took
    0.3 ms. The mean (32 % of the step) passes the threshold, the typical step does not."""

    def step(t0: float) -> list[dict]:
        slow = round((t0 - 1_000.0) / STEP_US) == 2
        return fetching(9_000 if slow else 300)(t0)

    assert "input_bound" not in kinds(window(step))
    # Every step that slow is input bound, with the median in the evidence.
    found = only(window(fetching(9_000)), "input_bound")
    assert found["evidence"]["median_step_data_wait_ms"] == pytest.approx(9.0)


def test_input_bound_names_worker_code_when_the_main_thread_only_waits() -> None:
    def step(t0: float) -> list[dict]:
        return [
            stage("train_dataloader_next", t0 + 10, 7_000),
            py("Queue.get", t0 + 15, 6_900, path=queue.__file__, line=154),
            py("Rows.__getitem__", t0 + 100, 6_000, pid=200, tid=201),
            py("collate_rows", t0 + 6_200, 500, line=70, pid=200, tid=201),
        ]

    found = only(window(step), "input_bound")
    assert [w["function"] for w in found["where"]] == ["Rows.__getitem__", "collate_rows"]
    assert found["evidence"]["source"] == "worker processes"


@pytest.mark.parametrize(
    ("untraced", "fires"),
    [
        ({"steps": 8, "data_wait_ms": 0.3, "share": 0.05}, False),  # the loader alone barely waits
        ({"steps": 8, "data_wait_ms": 6.0, "share": 0.05}, False),  # long steps: a small share of them
        ({"steps": 8, "data_wait_ms": 0.9, "share": 0.5}, False),  # under a millisecond per step
        ({"steps": 8, "data_wait_ms": 6.0, "share": 0.4}, True),  # the untraced steps wait too
        ({"steps": 1, "data_wait_ms": 0.3, "share": 0.05}, False),  # one step (a warmup's) is a baseline
        ({"steps": 1, "data_wait_ms": 6.0, "share": 0.4}, True),
        (None, False),  # no untraced step before the window (or an older trace): the window never decides alone
        ({"steps": "?"}, False),
    ],
)
def test_input_bound_needs_the_untraced_steps_to_wait_too(untraced: Any, fires: bool) -> None:
    """Tracing an in-process fetch lengthens the window's wait; the steps no tracer recorded tell
    the loader's own wait (issue 39: a 3 ms step whose traced collate took 2 ms)."""
    trace = window(fetching(6_000, 5_000))
    trace["vt_lightning"][UNTRACED_WAIT_KEY] = untraced
    found = [v for v in summarize(trace)["verdicts"] if v["kind"] == "input_bound"]
    assert bool(found) is fires
    if found:
        assert found[0]["evidence"][UNTRACED_WAIT_KEY] == untraced


def test_with_workers_untraced_steps_that_did_not_wait_overrule_nothing() -> None:
    """Workers prefetch a buffer at each epoch's start: the untraced steps before a window may all
    have come from it (no wait) while the loader cannot keep up; the window's wait decides."""

    def step(t0: float) -> list[dict]:
        return [
            stage("train_dataloader_next", t0 + 10, 7_000),
            py("Queue.get", t0 + 15, 6_900, path=queue.__file__, line=154),
            py("Rows.__getitem__", t0 + 100, 6_000, pid=200, tid=201),
        ]

    trace = window(step)
    trace["vt_lightning"][UNTRACED_WAIT_KEY] = {"steps": 8, "data_wait_ms": 0.3, "share": 0.05}
    found = only(trace, "input_bound")
    assert found["evidence"]["source"] == "worker processes"


def test_the_untraced_reading_is_the_median_steps_wait_and_share() -> None:
    # One fetch the OS descheduled (20 ms) among 0.5 ms ones does not make the loader slow...
    waits = [0.0005, 0.020, 0.0005, 0.0005]
    # The step time beside it (fetch + own time) is the median step's too: 2 ms, not the 21.5 ms one.
    assert untraced_reading(waits, [0.0015] * 4) == {"steps": 4, "data_wait_ms": 0.5, "share": 0.25, "step_ms": 2.0}
    # ...while a loader that makes most steps wait does.
    assert untraced_reading([0.003, 0.003, 0.0], [0.001] * 3) == {
        "steps": 3,
        "data_wait_ms": 3.0,
        "share": 0.75,
        "step_ms": 4.0,
    }
    assert untraced_reading([], []) is None


def test_each_window_shows_its_traced_step_beside_the_untraced_one() -> None:
    summary = summarize(window(fetching(300)))
    assert summary["observer"] == {
        "traced_step_ms": summary["step_ms"]["p50"],
        "untraced_step_ms": WAITED["step_ms"],
        "untraced_steps": 2,
        "ratio": round(summary["step_ms"]["p50"] / WAITED["step_ms"], 2),
    }
    trace = window(fetching(300))
    del trace["vt_lightning"][UNTRACED_WAIT_KEY]  # no untraced step before the window (wait=0, warmup=0)
    assert summarize(trace)["observer"] == {
        "traced_step_ms": 10.0,
        "untraced_step_ms": None,
        "untraced_steps": 0,
        "ratio": None,
    }
    assert "traced 10.00 ms/step (no untraced step before this window)" in render_markdown(summarize(trace))


def test_the_untraced_meter_counts_only_steps_no_tracer_recorded() -> None:
    meter = UntracedWaits()
    ms = 0.001

    def step(start: float, own_ms: float = 0.0, end: float = 0.0, traced_wait: bool = False, traced: bool = False):
        meter.batch_start(start * ms, traced_wait)
        meter.resume((start + own_ms) * ms)  # after vt_lightning's own work (a window opening)
        meter.batch_end(end * ms, traced)
        meter.ended_at((end + (1 if traced else 0)) * ms)  # a window closing: 1 ms of our own

    step(1, end=4)  # the first batch: no wait before it is known
    step(5, own_ms=10, end=18)  # 1 ms wait, 3 ms busy: the 10 ms of opening a window is neither
    step(20, end=30, traced=True)  # a window (warmup=0) opened at its start: its 2 ms wait, the last 3 ms busy
    step(32, end=40, traced_wait=True, traced=True)  # a window was open during its wait: not counted
    step(42, end=45, traced_wait=True)  # (the window's last step, then its close)
    meter.not_a_step()  # validation ran: the interval is no fetch
    step(60, end=63)
    step(63.5, end=66.5)  # 0.5 ms wait, 3 ms busy
    assert meter.reading() == {"steps": 3, "data_wait_ms": 1.0, "share": round(1 / 4, 3), "step_ms": 4.0}
    for n in range(100):  # a long run keeps the last steps only
        step(100 + n * 2, end=101 + n * 2)
    assert meter.reading()["steps"] == UNTRACED_STEPS_KEPT


# --------------------------------------------------------------------------------------------------
# python_bound
# --------------------------------------------------------------------------------------------------


def busy_python(busy_us: float, blocking: bool = False, under_op: bool = False) -> Any:
    def step(t0: float) -> list[dict]:
        events = [
            stage("training_step", t0 + 100, busy_us + 1_000),
            py("Model.training_step", t0 + 110, busy_us + 900, line=20),
            py("spin", t0 + 120, busy_us, line=30),
            x("aten::linear", t0 + busy_us + 200, 500, cat="cpu_op"),
        ]
        if blocking:
            events.append(x("time.sleep", t0 + 121, busy_us - 2))
        else:
            events.append(x("time.perf_counter", t0 + 121, busy_us / 2))  # C calls made by the loop count
        if under_op:
            events.append(x("aten::mm", t0 + 119, busy_us + 2, cat="cpu_op"))
        return events

    return step


def test_python_bound_names_the_busy_function() -> None:
    found = only(window(busy_python(6_000)), "python_bound")
    assert found["where"][0]["function"] == "spin"
    assert found["where"][0]["ms"] == pytest.approx(6.0, abs=0.01)
    assert found["evidence"]["share"] >= 0.6


@pytest.mark.parametrize(("busy_us", "fires"), [(2_600, True), (2_500, False)])
def test_python_bound_threshold(busy_us: float, fires: bool) -> None:
    # spin's own time plus training_step's 0.4 ms outside its op: 3.0 ms = 30 % fires, 2.9 ms does not
    assert ("python_bound" in kinds(window(busy_python(busy_us)))) is fires


def test_python_under_a_torch_op_or_sleeping_is_not_python_bound() -> None:
    assert "python_bound" not in kinds(window(busy_python(6_000, under_op=True)))
    assert "python_bound" not in kinds(window(busy_python(6_000, blocking=True)))


def test_an_op_bound_window_settles_python_bound_without_building_a_timeline(monkeypatch) -> None:
    """The bound from spans alone (steps outside waits and ops) ends the rule where it cannot fire;
    where it can, the timeline still decides (the busy loop above)."""
    from vt_lightning.analysis.verdicts import window as verdicts

    built: list[int] = []
    real = verdicts.Timeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(verdicts, "Timeline", counted)
    assert "python_bound" not in kinds(window(busy_python(6_000, under_op=True), step_us=7_500))  # ops: 87 %
    assert built == []
    assert "python_bound" in kinds(window(busy_python(6_000)))
    assert built != []


def test_slow_fetch_is_input_bound_not_python_bound() -> None:
    assert kinds(window(fetching(6_000, 5_000))) == ["input_bound"]


def in_one_step(slow: Any, usual: Any, which: int = 2) -> Any:
    """``slow`` in the counted step ``which`` (steps from 0, the first not counted), ``usual`` elsewhere."""
    return lambda t0: (slow if round((t0 - 1_000.0) / STEP_US) == which else usual)(t0)


@pytest.mark.parametrize("steps", [3, 4, 5])  # 2, 3 and 4 counted steps
def test_a_verdict_needs_more_than_half_its_steps_to_show_it(steps: int) -> None:
    """One call preempted for 9 ms (a ``builtins.isinstance`` with 9 ms of self time, issue 50) carries
    the window's sum and mean past every threshold; it is one step, never most of them."""
    preempted = in_one_step(busy_python(9_000), busy_python(100))
    assert "python_bound" not in kinds(window(preempted, steps=steps))
    stalled = in_one_step(fetching(9_000, 8_000), fetching(300))  # one fetch descheduled
    assert "input_bound" not in kinds(window(stalled, steps=steps))
    collected = in_one_step(collecting(9_000), collecting(0))
    assert "gc" not in kinds(window(collected, steps=steps))
    # Most steps (all but one, of 3 or 4 counted) show it: the verdict stands, with each step's value.
    if steps > 3:
        found = only(window(in_one_step(busy_python(100), busy_python(6_000)), steps=steps), "python_bound")
        assert sorted(found["evidence"]["per_step_ms"])[1:] == pytest.approx([6.4] * (steps - 2), abs=0.1)
        found = only(window(in_one_step(fetching(300), fetching(6_000, 5_000)), steps=steps), "input_bound")
        assert sorted(found["evidence"]["per_step_ms"])[1:] == pytest.approx([6.0] * (steps - 2), abs=0.1)


def test_with_workers_a_step_is_as_many_steps_as_workers() -> None:
    """Two workers started together finish together: every other step waits for both batches, the
    next finds its batch ready. The steps are judged in pairs; in process, every other step is not most."""

    def step(t0: float, workers: bool = True) -> list[dict]:
        wait = 7_000 if round((t0 - 1_000.0) / STEP_US) % 2 else 100
        events = [stage("train_dataloader_next", t0 + 10, wait)]
        if not workers:
            return [*events, py("Rows.__getitem__", t0 + 15, wait - 10, line=33)]
        events.append(py("Queue.get", t0 + 15, wait - 10, path=queue.__file__, line=154))
        return events + [py("Rows.__getitem__", t0 + 100, 6_000, pid=pid, tid=pid + 1) for pid in (200, 300)]

    found = only(window(step, steps=5), "input_bound")  # counted steps 1-4 wait 7, 0.1, 7, 0.1 ms
    assert found["evidence"]["per_step_ms"] == pytest.approx([7.0, 0.1, 7.0, 0.1], abs=0.01)
    assert "input_bound" not in kinds(window(lambda t0: step(t0, workers=False), steps=5))


# --------------------------------------------------------------------------------------------------
# GPU kinds, on fakes of the kernel trace
# --------------------------------------------------------------------------------------------------


def kernel(name: str, ts: float, dur: float, correlation: int = 0) -> dict:
    return x(name, ts, dur, cat="kernel", pid=0, tid=7, correlation=correlation)


def syncing(idle_us: float, blocked: bool = True) -> Any:
    """Kernels run 0-4 ms; ``compute_metrics`` calls ``Tensor.item``, which blocks in
    cudaStreamSynchronize until they finish (or, ``blocked=False``, after they finished); the
    next kernel starts ``idle_us`` after it returns."""

    def step(t0: float) -> list[dict]:
        sync_start = t0 + (1_000 if blocked else 4_500)
        sync_end = max(t0 + 4_000, sync_start + 20)
        return [
            kernel("gemm", t0, 4_000),
            py("compute_metrics", sync_start - 50, sync_end - sync_start + 100, line=80),
            x("Tensor.item", sync_start - 10, sync_end - sync_start + 20),
            x("cudaStreamSynchronize", sync_start, sync_end - sync_start, cat="cuda_runtime"),
            kernel("gemm", sync_end + idle_us, min(STEP_US - 4_000 - idle_us, 10.0) + 1),
        ]

    return step


def test_host_sync_names_the_function_that_called_item() -> None:
    found = only(window(syncing(4_000)), "host_sync")
    assert found["where"][0]["function"] == "compute_metrics"
    assert found["where"][0]["line"] == 80
    assert found["evidence"]["calls"] == {"Tensor.item": 3}
    assert found["evidence"]["share"] == pytest.approx(0.4)


@pytest.mark.parametrize(("idle_us", "fires"), [(1_000, True), (900, False)])
def test_host_sync_threshold(idle_us: float, fires: bool) -> None:
    assert ("host_sync" in kinds(window(syncing(idle_us)))) is fires


def test_a_sync_that_did_not_wait_is_no_host_sync() -> None:
    assert "host_sync" not in kinds(window(syncing(4_000, blocked=False)))


def test_no_gpu_no_gpu_verdicts() -> None:
    assert kinds(window(busy_python(100))) == []


def busy_gpu(busy_us: float, comm_us: float = 0.0, overlapped: bool = False) -> Any:
    def step(t0: float) -> list[dict]:
        events = [
            kernel("gemm", t0, busy_us),
            py("Model.forward", t0 + busy_us, STEP_US - busy_us - 10, line=60),
        ]
        if comm_us:
            start = t0 if overlapped else t0 + busy_us
            events.append(kernel("ncclDevKernel_AllReduce_Sum_f32", start, comm_us))
        return events

    return step


@pytest.mark.parametrize(("busy_us", "fires"), [(4_900, True), (5_100, False)])
def test_gpu_idle_threshold_is_half_the_window(busy_us: float, fires: bool) -> None:
    found = [v for v in summarize(window(busy_gpu(busy_us)))["verdicts"] if v["kind"] == "gpu_idle"]
    assert bool(found) is fires
    if fires:
        assert found[0]["where"][0]["function"] == "Model.forward"


def test_comm_bound_counts_only_communication_not_hidden_by_compute() -> None:
    assert "comm_bound" in kinds(window(busy_gpu(6_000, comm_us=3_000)))
    assert "comm_bound" not in kinds(window(busy_gpu(6_000, comm_us=3_000, overlapped=True)))
    assert "comm_bound" not in kinds(window(busy_gpu(6_000, comm_us=1_900)))  # 19 %


# --------------------------------------------------------------------------------------------------
# gc and memory_pressure
# --------------------------------------------------------------------------------------------------


def collecting(pause_us: float) -> Any:
    def step(t0: float) -> list[dict]:
        return [
            py("make_batch_graph", t0 + 100, pause_us + 1_000, line=90),
            x("[gc] generation 2", t0 + 600, pause_us, collected=1000, uncollectable=0),
        ]

    return step


@pytest.mark.parametrize(("pause_us", "fires"), [(500, True), (490, False)])
def test_gc_threshold_is_five_percent(pause_us: float, fires: bool) -> None:
    found = [v for v in summarize(window(collecting(pause_us)))["verdicts"] if v["kind"] == "gc"]
    assert bool(found) is fires
    if fires:
        assert found[0]["where"][0]["function"] == "make_batch_graph"
        assert found[0]["evidence"]["by_generation"] == {"generation 2": 3}


def memory_events(reserved_mb: float) -> Any:
    def step(t0: float) -> list[dict]:
        args = {"Device Type": 1, "Device Id": 0, "Total Allocated": 2**20, "Total Reserved": int(reserved_mb * 2**20)}
        return [
            {"ph": "i", "name": "[memory]", "ts": t0 + 5, "pid": PID, "tid": TID, "args": args},
            kernel("gemm", t0, STEP_US - 10),
        ]

    return step


DEVICE = [{"id": 0, "name": "fake", "totalGlobalMem": 1000 * 2**20}]


@pytest.mark.parametrize(("reserved_mb", "fires"), [(900, True), (890, False)])
def test_memory_pressure_when_reserved_nears_the_device_total(reserved_mb: float, fires: bool) -> None:
    trace = window(memory_events(reserved_mb), deviceProperties=DEVICE)
    assert ("memory_pressure" in kinds(trace)) is fires


def test_memory_pressure_from_cuda_frees_inside_steps_names_the_caller() -> None:
    def step(t0: float) -> list[dict]:
        return [
            kernel("gemm", t0, STEP_US - 10),
            py("free_cache", t0 + 100, 300, line=99),
            x("cudaFree", t0 + 150, 200, cat="cuda_runtime"),
        ]

    found = only(window(step, deviceProperties=DEVICE), "memory_pressure")
    assert found["where"][0]["function"] == "free_cache"
    assert found["evidence"]["cuda_frees_per_step"] == 1.0
    snapshot = {"device_traces": [[{"action": "oom", "size": 0, "frames": []}]], "segments": []}
    assert "memory_pressure" in kinds(window(memory_events(10), deviceProperties=DEVICE), snapshot)


def test_healthy_window_gets_no_verdict() -> None:
    def step(t0: float) -> list[dict]:
        return [
            stage("train_dataloader_next", t0 + 10, 300),
            stage("training_step", t0 + 400, 8_000),
            py("Model.training_step", t0 + 410, 7_900, line=20),
            x("aten::linear", t0 + 500, 7_500, cat="cpu_op"),
            x("[gc] generation 0", t0 + 9_000, 50),
        ]

    assert summarize(window(step))["verdicts"] == []


# --------------------------------------------------------------------------------------------------
# Where verdicts show: schema, markdown, logger, diff, the gc recorder
# --------------------------------------------------------------------------------------------------


def test_verdicts_are_in_the_schema_and_older_summaries_still_read() -> None:
    summary = summarize(window(fetching(6_000, 5_000)))
    assert check_summary(summary, "new.json")["verdicts"][0]["kind"] == "input_bound"
    older = {k: v for k, v in summary.items() if k != "verdicts"}
    assert "verdicts" not in check_summary(older, "old.json")
    broken = {**summary, "verdicts": [{"kind": "gc"}]}
    with pytest.raises(Exception, match=r"verdicts\.0\.where: missing"):
        check_summary(broken, "bad.json")


def test_markdown_logger_and_console_line() -> None:
    summary = summarize(window(fetching(6_000, 5_000)))
    markdown = render_markdown(summary)
    assert "- `input_bound`, 60% of step time: `Rows.__getitem__` (train.py:33, 5.00 ms/step)" in markdown
    assert summary_scalars(summary)["vt_lightning/verdict/input_bound"] == pytest.approx(0.6)
    line = verdict_line(summary["verdicts"][0])
    assert line.startswith(f"input_bound (60% of step time) at {USER}:33 (Rows.__getitem__): Fetch")
    healthy = summarize(window(fetching(1_000)))
    assert "**Verdicts**: none" in render_markdown(healthy)
    assert not any(k.startswith("vt_lightning/verdict/") for k in summary_scalars(healthy))


def test_diff_says_which_verdicts_appeared_or_went_away() -> None:
    slow_input = summarize(window(fetching(6_000, 5_000)))
    slow_python = summarize(window(busy_python(6_000)))
    result = diff([slow_input], [slow_python])
    changes = {row["kind"]: row["change"] for row in result["verdicts"]}
    assert changes == {"input_bound": "went away", "python_bound": "appeared"}
    lines = verdict_change_lines(result["verdicts"])
    assert "  input_bound: went away (A: 60% in 1/1 windows; B: none of 1 windows)" in lines
    older = {k: v for k, v in slow_input.items() if k != "verdicts"}
    assert diff([older], [slow_python])["verdicts"] == []  # nothing known about A: no claim


def test_gc_watch_records_collections_on_its_clock_and_removes_its_hook() -> None:
    ticks = iter(range(0, 10_000_000, 7))
    watch = GcWatch(lambda: float(next(ticks)))
    watch.start()
    try:
        gc.collect()
    finally:
        watch.stop()
    assert watch._callback not in gc.callbacks
    gc.collect()  # after stop: not recorded
    data = watch.collect()
    (pause,) = [e for e in data["events"] if e["name"] == "[gc] generation 2"]
    assert pause["dur"] == 7.0 and pause["ph"] == "X"
    assert set(pause["args"]) == {"collected", "uncollectable"}


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_host_sync_on_a_real_kernel_trace(tmp_path: Any) -> None:
    """torch.profiler's own trace of ``.item()`` after a long matmul, then 5 ms of CPU work while
    the GPU idles; the ``compute_metrics`` range stands for the Python call VizTracer would record."""
    import time

    import orjson
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    a = torch.randn(4096, 4096, device="cuda")
    path = tmp_path / "t.json"
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1),  # ProfilerStep#N ranges
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(STEPS + 1):
            with record_function("compute_metrics"):
                (a @ a).sum().item()
            time.sleep(0.005)
            prof.step()
    trace = orjson.loads(path.read_bytes())
    for event in trace["traceEvents"]:
        if event.get("name") == "compute_metrics" and event.get("cat") == "user_annotation":
            event.update(cat="FEE", name=f"compute_metrics ({USER}:80)")
    found = only(trace, "host_sync")
    assert found["where"][0]["function"] == "compute_metrics"
    assert found["evidence"]["gpu_idle_after_sync_ms"] >= 4.0
