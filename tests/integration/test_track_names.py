"""A real window's trace names every process and thread by rank and role, with the main process
and each process's main thread sorted first, and no global (unnamed) instant track."""

from __future__ import annotations

import re

import torch
from conftest import MarkerModel, load_trace, make_trainer, trace_files
from torch.utils.data import DataLoader, TensorDataset

from vt_lightning import VizTraceCallback


def test_a_windows_tracks_are_named_by_rank_and_role(tmp_path) -> None:
    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4, num_workers=2)
    make_trainer(tmp_path, [VizTraceCallback(wait=1, warmup=1, active=2)], max_steps=5).fit(MarkerModel(), data)
    trace = load_trace(trace_files(tmp_path)[0])
    own = trace["vt_lightning"]["pid"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes[own] == "rank 0 · main process"
    workers = sorted(name for name in processes.values() if "DataLoader worker" in name)
    assert workers == ["rank 0 · DataLoader worker 0", "rank 0 · DataLoader worker 1"]
    assert all(name.startswith("rank 0 · ") for name in processes.values())
    assert not [e for e in meta if e["name"] == "process_labels"]  # Perfetto would append "CPU"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    timed = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("pid"), int)}
    assert timed <= set(threads)  # every track with events has a name
    assert threads[(own, own)] == "main thread"
    assert not [n for n in threads.values() if re.match(r"^(MainThread|Unnamed|Thread \d+|python)\b", n)]
    first = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_sort_index" and e["args"]["sort_index"] == 1}
    assert (own, own) in first
    sort = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    assert sort[own] == min(v for p, v in sort.items() if isinstance(p, int))
    assert not [e for e in trace["traceEvents"] if e.get("ph") == "i" and e.get("s") == "g"]
