"""The straggler (analysis/straggler.py), the job merge (analysis/job_merge.py) and rank 0's job
file (export/job_file.py) on synthetic traces: who arrives last, how long the others wait, which
user function took the extra time."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.analysis.job_merge import (
    PID_STRIDE,
    aligned_events,
    merge_job,
    ranks_to_reduce,
    slowest_and_fastest,
)
from vt_lightning.analysis.straggler import analyze_straggler, slow_ops, user_segments
from vt_lightning.export.job import WindowJob
from vt_lightning.export.job_file import build_job, read_clock, write_job_file

USER = "/home/me/project/train.py"
LIB = "/usr/lib/python3.11/site-packages/torch/nn/module.py"
SPAN = "0000000002"


def x(name: str, ts: float, dur: float, cat: str = "FEE", tid: int = 1, pid: int = 100) -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid}


def rank_events(late_ms: float, steps: int = 3, step_us: float = 50_000.0, pid: int = 100) -> list[dict[str, Any]]:
    """Per step: training_step (user) calling a library forward, then (on the late rank) ``slow``,
    then an all-reduce on gloo's thread that ends when the latest rank arrives."""
    events = []
    for n in range(steps):
        t = n * step_us
        events.append(x(f"ProfilerStep#{n + 2}", t, step_us - 10, cat="user_annotation", pid=pid))
        work = 10_000.0
        events.append(x(f"training_step ({USER}:10)", t + 100, work + late_ms * 1000, pid=pid))
        events.append(x(f"Module.forward ({LIB}:5)", t + 200, work - 500, pid=pid))
        if late_ms:
            events.append(x(f"slow ({USER}:42)", t + 100 + work - 200, late_ms * 1000, pid=pid))
            events.append(x("time.sleep", t + 100 + work - 100, late_ms * 1000 - 200, pid=pid))
        arrival = t + 100 + work + late_ms * 1000 + 50
        events.append(x("gloo:all_reduce", arrival, 0.0, cat="user_annotation", tid=7, pid=pid))
        events.append(x("c10d::allreduce_", arrival - 20, 10.0, cat="cpu_op", pid=pid))
    return events


def finish_collectives(ranks: dict[int, list[dict[str, Any]]]) -> None:
    """Every rank leaves each all-reduce when the last one has arrived."""
    per_rank = {r: [e for e in ev if e["name"] == "gloo:all_reduce"] for r, ev in ranks.items()}
    for k in range(len(per_rank[0])):
        last = max(per_rank[r][k]["ts"] for r in per_rank)
        for r in per_rank:
            per_rank[r][k]["dur"] = last - per_rank[r][k]["ts"] + 30.0


def test_the_late_rank_and_its_function_are_named() -> None:
    ranks = {0: rank_events(0.0), 1: rank_events(30.0, pid=200), 2: rank_events(0.0, pid=300)}
    finish_collectives(ranks)
    result = analyze_straggler(ranks)
    assert result["family"] == "gloo:" and result["collectives"] == 3  # the c10d op is not counted twice
    straggler = result["straggler"]
    assert straggler is not None and straggler["rank"] == 1
    assert straggler["others_wait_ms"] == pytest.approx(30.0, abs=0.5)
    assert (straggler["function"], straggler["file"], straggler["line"]) == ("slow", USER, 42)
    assert straggler["excess_ms"] == pytest.approx(30.0, abs=0.5)
    assert straggler["late_in_steps"] == straggler["steps"] == 3
    assert [s["late_rank"] for s in result["steps"]] == [1, 1, 1]
    waits = {w["rank"]: w["wait_ms"] for w in result["wait_ms_per_step"]}
    assert waits[0] == pytest.approx(30.0, abs=0.5) and waits[1] == pytest.approx(0.0, abs=0.01)
    assert slowest_and_fastest(result["wait_ms_per_step"]) == [1, 2]  # waits least / most (ties: higher rank)


def test_a_balanced_run_names_no_straggler() -> None:
    """Ranks that take turns arriving last by microseconds stay below both thresholds."""
    ranks = {0: rank_events(0.0), 1: rank_events(0.0, pid=200)}
    for i, event in enumerate(e for e in ranks[1] if e["name"] == "gloo:all_reduce"):
        event["ts"] += 40.0 if i % 2 else -40.0
    finish_collectives(ranks)
    result = analyze_straggler(ranks)
    assert result["straggler"] is None
    assert result["candidate"]["others_wait_ms"] < 1.0


def test_ranks_taking_turns_at_being_late_name_no_straggler() -> None:
    """Scheduling noise on a loaded machine: rank 0 is 6 ms late in one step, rank 1 7 ms in the
    next. Each waits about as long as it makes the other wait: the net wait is below 1 ms."""
    ranks = {0: rank_events(0.0), 1: rank_events(0.0, pid=200)}
    collectives = {r: [e for e in ev if e["name"] == "gloo:all_reduce"] for r, ev in ranks.items()}
    collectives[0][0]["ts"] += 6_000.0
    collectives[1][1]["ts"] += 7_000.0
    finish_collectives(ranks)
    result = analyze_straggler(ranks)
    assert [s["late_rank"] for s in result["steps"]][:2] == [0, 1]
    assert result["straggler"] is None
    assert result["candidate"]["others_wait_ms"] > 2.0  # a plain "others wait" threshold would have named it


@pytest.mark.parametrize(("late_ms", "named"), [(0.8, False), (2.0, False), (6.0, True)])
def test_thresholds_are_relative_and_absolute(late_ms: float, named: bool) -> None:
    """Named only if the others wait >= 10% of the step (50 ms here: 5 ms) and >= 1 ms."""
    ranks = {0: rank_events(0.0), 1: rank_events(late_ms, pid=200)}
    finish_collectives(ranks)
    assert (analyze_straggler(ranks)["straggler"] is not None) is named


def test_no_common_collective_and_one_rank() -> None:
    assert analyze_straggler({0: rank_events(0.0)})["straggler"] is None
    ranks = {
        0: [x("ProfilerStep#1", 0, 10, cat="user_annotation")],
        1: [x("ProfilerStep#1", 0, 10, cat="user_annotation")],
    }
    assert analyze_straggler(ranks)["family"] is None


def test_library_time_counts_for_the_user_function_that_called_it() -> None:
    events = [
        x(f"outer ({USER}:1)", 0, 100),
        x(f"lib ({LIB}:3)", 10, 50),  # -> outer
        x(f"inner ({USER}:7)", 20, 20),  # user code inside a library call: its own
        x("builtins.len", 25, 5),  # -> inner
    ]
    totals: dict[str, float] = {}
    for start, end, label in user_segments(events):
        totals[label] = totals.get(label, 0.0) + end - start
    assert totals == {f"outer ({USER}:1)": pytest.approx(80.0), f"inner ({USER}:7)": pytest.approx(20.0)}


def _trace(rank: int, pid: int, base_ns: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    worker = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid + 1,
            "tid": 0,
            "args": {"name": f"rank {rank} · DataLoader worker 0"},
        }
    ]
    return {
        "baseTimeNanoseconds": base_ns,
        "vt_lightning": {"pid": pid, "global_rank": rank},
        "traceEvents": [*meta, *worker, *events, x("fetch (/w.py:1)", 5.0, 1.0, pid=pid + 1)],
    }


def test_the_job_merge_renumbers_pids_and_shifts_time() -> None:
    """Same pid on two hosts: never one process. Rank 1's base is 2 s later and its clock 20 ms
    ahead: its events move by +2 s - 20 ms. Flow ids stay unique per rank."""
    ev0 = [x("a", 100.0, 10.0, pid=4242), {"ph": "s", "id": 7, "pid": 4242, "tid": 1, "ts": 100.0, "name": "f"}]
    ev1 = [x("a", 100.0, 10.0, pid=4242), {"ph": "s", "id": 7, "pid": 4242, "tid": 1, "ts": 100.0, "name": "f"}]
    traces = {0: _trace(0, 4242, 10**18, ev0), 1: _trace(1, 4242, 10**18 + 2 * 10**9, ev1)}
    job = merge_job(traces, {0: 0.0, 1: 20_000.0}, {"why": "test"})
    assert list(job)[-1] == "traceEvents" and job["baseTimeNanoseconds"] == 10**18
    names = {e["pid"]: e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "process_name"}
    assert names == {
        1: "rank 0 · main process",
        2: "rank 0 · DataLoader worker 0",
        PID_STRIDE + 1: "rank 1 · main process",
        PID_STRIDE + 2: "rank 1 · DataLoader worker 0",
    }
    sorts = {e["pid"]: e["args"]["sort_index"] for e in job["traceEvents"] if e.get("name") == "process_sort_index"}
    assert sorts == {1: 1, 2: 2, PID_STRIDE + 1: 1001, PID_STRIDE + 2: 1002}
    a = {e["pid"]: e["ts"] for e in job["traceEvents"] if e.get("name") == "a"}
    assert a == {1: 100.0, PID_STRIDE + 1: pytest.approx(100.0 + 2_000_000.0 - 20_000.0)}
    flows = sorted(e["id"] for e in job["traceEvents"] if e.get("ph") == "s")
    assert len(set(flows)) == 2
    aligned = aligned_events(traces, {1: 20_000.0})
    assert [e["ts"] for e in aligned[1] if e["name"] == "a"] == [pytest.approx(1_980_100.0)]


def test_past_the_budget_only_the_slowest_and_fastest_keep_full_detail() -> None:
    assert ranks_to_reduce({0: 10, 1: 10, 2: 10}, [0, 2], budget_bytes=100) == []
    assert ranks_to_reduce({0: 60, 1: 60, 2: 60, 3: 60}, [1, 3], budget_bytes=100) == [0, 2]
    events = [x("ProfilerStep#2", 0, 100, cat="user_annotation"), x("gloo:all_reduce", 50, 10, cat="user_annotation")]
    events += [x(f"f{i} ({USER}:{i})", i, 1.0 + i) for i in range(80)]
    job = merge_job({0: _trace(0, 100, 0, events), 1: _trace(1, 100, 0, list(events))}, {}, {}, reduce_ranks=[1])
    kept = [e for e in job["traceEvents"] if e.get("pid") == PID_STRIDE + 1 and e.get("ph") == "X"]
    assert {"ProfilerStep#2", "gloo:all_reduce"} <= {e["name"] for e in kept}
    assert len([e for e in kept if e["cat"] == "FEE"]) == 50  # the top functions
    assert job["vt_lightning_job"]["reduced_ranks"] == [1]
    assert job["vt_lightning_job"]["left_out_events"] == {"rank 1": 30 + 1}  # 30 small functions, the worker's fetch


def _window_job(run_dir: Path, extras: dict[str, Any]) -> WindowJob:
    pair = ClockPair(0.0, 0, 0.0)
    return WindowJob(run_dir, f"h_0.{SPAN}.pt.trace.json.gz", run_dir / "t", None, pair, pair, None, {}, extras=extras)


def test_without_a_shared_log_dir_rank_0_says_so_once_and_writes_no_job_file(tmp_path: Path) -> None:
    """Rank 1 runs on another host (its host id differs) and its file never shows up: one note,
    no job file, and the next window does not wait for that host again."""
    run_dir = tmp_path / "version_0" / "window_000-batches_2-4"
    run_dir.mkdir(parents=True)
    extras = {"clock_sync": {"world_size": 2, "samples": {}, "host_ids": {"0": 1, "1": 2}, "job_wait_s": 0.5}}
    merged = _trace(0, 100, 0, [])
    merged["vt_lightning"].update(span=SPAN, world_size=2, host="a")
    started = time.monotonic()
    info, notes = write_job_file(_window_job(run_dir, extras), run_dir, merged, 100)
    assert info is None and len(notes) == 1 and "not shared between hosts" in notes[0]
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    info, notes = write_job_file(_window_job(run_dir, extras), run_dir, merged, 100)
    assert info is None and "not shared" in notes[0] and time.monotonic() - started < 0.4
    assert "`vt-lightning job <this log dir> <each other node's log dir>`" in notes[0]
    kept = orjson.loads((run_dir / "job" / f"job.{SPAN}.clock.json").read_bytes())  # for `vt-lightning job`
    assert [p.name for p in (run_dir / "job").iterdir()] == [f"job.{SPAN}.clock.json"]
    assert kept == extras["clock_sync"]


def test_the_job_of_node_local_dirs_is_built_from_each_nodes_window_and_the_kept_clock(tmp_path: Path) -> None:
    """``vt-lightning job``: rank 0's window (with its kept clock exchange) on one node, rank 1's on
    another host 1 ms ahead: one job file, rank 1 shifted by the measured offset."""
    nodes = {r: tmp_path / f"node{r}" / "window_000-batches_2-4" for r in (0, 1)}
    ranks = {0: rank_events(0.0), 1: rank_events(30.0, pid=200)}
    finish_collectives(ranks)
    for rank, host in ((0, "a"), (1, "b")):
        trace = _trace(rank, 100 * (rank + 1), 10**18, ranks[rank])
        trace["vt_lightning"].update(span=SPAN, world_size=2, host=host)
        nodes[rank].mkdir(parents=True)
        (nodes[rank] / f"{host}_{rank}.{SPAN}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
    samples = {"1": [[0, 1_000_500, 1_001_500, 2_000]]}  # ns: rank 1's clock 1 ms ahead, 1 µs round trip
    clock = nodes[0] / "job" / f"job.{SPAN}.clock.json"
    clock.parent.mkdir()
    clock.write_bytes(orjson.dumps({"world_size": 2, "samples": samples, "host_ids": {"0": 1, "1": 2}}))
    sync, span = read_clock(clock)
    assert span == SPAN
    info, notes = build_job(sync, span, [nodes[0], nodes[1]], nodes[0])
    assert notes == [] and info is not None
    assert [(r["host"], r["offset_us"], r["uncertainty_us"]) for r in info["ranks"]] == [
        ("a", 0.0, 0.0),
        ("b", 1000.0, 0.5),
    ]
    assert (nodes[0] / "job" / f"job.{SPAN}.json.gz").is_file()
    info, notes = build_job(sync, span, [nodes[0]], nodes[0])  # a node's directory not given: which ranks are missing
    assert info is None and "no trace of rank(s) [1]" in notes[0]


def test_rank_0_merges_the_files_it_finds(tmp_path: Path) -> None:
    run_dir = tmp_path / "window_000-batches_2-4"
    run_dir.mkdir()
    ranks = {0: rank_events(0.0), 1: rank_events(30.0, pid=200)}
    finish_collectives(ranks)
    merged = _trace(0, 100, 10**18, ranks[0])
    merged["vt_lightning"].update(span=SPAN, world_size=2, host="a")
    other = _trace(1, 200, 10**18, ranks[1])
    other["vt_lightning"].update(host="a")
    (run_dir / f"h_1.{SPAN}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(other)))
    samples = {"1": [[0, 1_000, 2_000, 3_000]]}
    extras = {"clock_sync": {"world_size": 2, "samples": samples, "host_ids": {"0": 1, "1": 1}, "job_wait_s": 5}}
    info, notes = write_job_file(_window_job(run_dir, extras), run_dir, merged, 100)
    assert notes == [] and info is not None
    assert info["straggler"]["straggler"]["rank"] == 1 and info["ranks"][1]["offset_us"] == 0.0
    assert info["ranks"][1]["uncertainty_us"] == 1.0  # one host: 0, bounded by half the 2 µs round trip
    assert info["steps_us"] == [0.0, 3 * 50_000.0 - 10]  # both ranks' steps (one clock), where a viewer opens
    job = orjson.loads(gzip.decompress((run_dir / "job" / f"job.{SPAN}.json.gz").read_bytes()))
    names = {e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "process_name"}
    assert names >= {"rank 0 · main process", "rank 1 · main process"}
    assert orjson.loads((run_dir / "job" / f"job.{SPAN}.ranks.json").read_bytes())["world_size"] == 2


def test_a_workers_time_off_the_critical_path_is_not_the_stragglers_and_the_share_adds_up() -> None:
    """Rank 1 is late by 30 ms of ``slow`` on its training thread; its two DataLoader workers spend
    40 ms per step each in ``__getitem__`` in parallel. Only the training thread counts, so the
    named function explains at most the others' wait (research: +19.5 ms/step named against a
    10.6 ms/step wait, before)."""
    ranks = {0: rank_events(0.0), 1: rank_events(30.0, pid=200)}
    for worker in (201, 202):
        for n in range(3):
            ranks[1].append(x(f"Rows.__getitem__ ({USER}:77)", n * 50_000.0 + 50, 40_000.0, pid=worker, tid=worker))
    finish_collectives(ranks)
    straggler = analyze_straggler(ranks)["straggler"]
    assert straggler["function"] == "slow" and straggler["excess_ms"] == pytest.approx(30.0, abs=0.5)
    assert 0.9 <= straggler["explains_share"] <= 1.0
    assert straggler["unattributed_ms"] == pytest.approx(straggler["others_wait_ms"] - straggler["excess_ms"], abs=1e-3)


def test_an_op_much_slower_on_one_rank_is_called_out_a_collective_as_waiting() -> None:
    per_rank = {
        0: {"aten::mm": 4.87, "aten::add": 0.2, "c10d::allreduce_": 0.088, "aten::copy_": 1.0},
        1: {"aten::mm": 0.51, "aten::add": 0.1, "c10d::allreduce_": 1.921, "aten::copy_": 2.9},
    }
    found = slow_ops(per_rank, step_ms=30.0, family="gloo:")
    assert [op["name"] for op in found] == ["aten::mm", "c10d::allreduce_"]  # add: < 1 ms apart; copy_: < 3x
    mm, allreduce = found
    assert mm["text"] == "aten::mm: 4.87 ms/step on rank 0, 0.51 on rank 1" and not mm["collective"]
    assert mm["slow_rank"] == 0 and mm["ms_per_step"] == {"0": 4.87, "1": 0.51}
    assert allreduce["collective"] and allreduce["text"].endswith("time in the collective (waiting), see the straggler")
    assert slow_ops(per_rank, step_ms=100.0, family=None) == []  # under 5 % of a 100 ms step apart
    assert slow_ops({0: {"aten::mm": 2.0}, 1: {}}, step_ms=10.0, family=None)[0]["ms_per_step"] == {"0": 2.0, "1": 0.0}


def test_the_job_names_every_process_by_rank_and_role_and_lists_each_main_thread_first() -> None:
    """kineto's string pid and tid (``Spans`` / ``PyTorch Profiler``) become ``rank N · torch.profiler``
    with an int tid; each process's main thread takes its new pid as tid (Perfetto's main thread)."""
    spans = {
        "ph": "X",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": 0.0,
        "dur": 9.0,
    }
    main = [x("a", 1.0, 2.0, pid=4242, tid=4242), {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 4242,
                                                   "args": {"name": "main thread"}}]  # fmt: skip
    job = merge_job({r: _trace(r, 4242, 0, [*main, dict(spans)]) for r in (0, 1)}, {}, {})
    names = {e["pid"]: e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "process_name"}
    assert names[3] == "rank 0 · torch.profiler" and names[PID_STRIDE + 3] == "rank 1 · torch.profiler"
    assert not [n for n in names.values() if "pid" in n or ":" in n]
    moved = {(e["pid"], e["tid"]) for e in job["traceEvents"] if e.get("ph") == "X" and e["name"] != "fetch (/w.py:1)"}
    assert moved == {(1, 1), (3, 3), (PID_STRIDE + 1, PID_STRIDE + 1), (PID_STRIDE + 3, PID_STRIDE + 3)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "thread_name"}
    assert threads == {(1, 1): "main thread", (PID_STRIDE + 1, PID_STRIDE + 1): "main thread"}


def test_rank_0_on_a_remote_root_fetches_the_ranks_traces_and_publishes_the_job(tmp_path: Path) -> None:
    """controller/remote.with_job, before rank 0's window goes to the store: rank 1's trace (on
    another host, 1 ms ahead) is fetched from the store and merged into the staged window, which
    ``publish`` then uploads with its ``job/``; a rank whose trace never comes is one note."""
    import dataclasses

    from fsspec import filesystem

    from vt_lightning.controller.remote import publish, with_job
    from vt_lightning.export.job import URL, WindowResult

    fs = filesystem("memory")
    target = URL(f"memory://vt-job-{time.monotonic_ns()}/run/window_000-batches_2-4")
    staged = tmp_path / "staged"
    staged.mkdir()
    ranks = {0: rank_events(0.0), 1: rank_events(30.0, pid=200)}
    finish_collectives(ranks)
    samples = {"1": [[0, 1_000_500, 1_001_500, 2_000]]}
    extras = {"clock_sync": {"world_size": 2, "samples": samples, "host_ids": {"0": 1, "1": 2}, "job_wait_s": 0.3}}
    job = dataclasses.replace(_window_job(staged, extras), publish_to=str(target))
    for rank, host in ((0, "h"), (1, "b")):
        trace = _trace(rank, 100 * (rank + 1), 10**18, ranks[rank])
        trace["vt_lightning"].update(span=SPAN, world_size=2, host=host)
        data = gzip.compress(orjson.dumps(trace))
        if rank == 0:
            (staged / job.trace_name).write_bytes(data)
        else:
            fs.pipe(str(target / f"{host}_{rank}.{SPAN}.pt.trace.json.gz"), data)
    result = WindowResult(staged / job.trace_name, 0, 0, 0, 0, False)
    try:
        merged = with_job(job, result, staged, lambda work: work())
        assert merged.notes == () and merged.job is not None
        assert [(r["host"], r["offset_us"]) for r in merged.job["ranks"]] == [("h", 0.0), ("b", 1000.0)]
        assert sorted(p.name for p in staged.iterdir()) == [job.trace_name, "job"]  # the fetched trace is gone
        published = publish(job, merged, staged)
        assert published.trace_path == target / job.trace_name
        assert sorted(URL(p).name for p in fs.ls(str(target / "job"), detail=False)) == [
            f"job.{SPAN}.json.gz",
            f"job.{SPAN}.ranks.json",
        ]
        fs.rm(str(target), recursive=True)  # rank 0 first in the store: nothing listed there yet
        alone = with_job(job, result, staged, lambda work: work())
        assert alone.job is None and alone.notes == (
            "no job file for window_000-batches_2-4 (rank(s) [1] wrote no trace of it within 0 s)",
        )
    finally:
        fs.rm(str(target.parent.parent), recursive=True)
