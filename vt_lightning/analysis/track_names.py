"""Every process and thread of a window's trace named by rank and role, each main process and main
thread first, so Perfetto shows no "Unnamed" track and no bare ``python <pid>``. Pure. Kineto's
string pid ``Spans`` keeps its name: HTA looks it up."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vt_lightning.analysis.trace import WindowTrace

MAIN_THREAD = "main thread"
# Python's and torch's thread names -> their role (a prefix names a family of threads)
THREAD_ROLES = (
    ("MainThread", MAIN_THREAD),
    ("QueueFeederThread", "DataLoader queue feeder"),
    ("pt_gloo_runloop", "gloo"),
    ("pt_autograd", "torch autograd"),
    ("pt_nccl", "nccl"),
)
PIN_MEMORY = "_pin_memory_loop"  # Python names it "Thread-3 (_pin_memory_loop)"
KINETO_PROCESS = "Spans"  # kineto's process of the profiler's own span: HTA finds it by this pid
KINETO_THREAD = "PyTorch Profiler"


def rank_track(rank: int, role: str) -> str:
    """``rank N · <role>``: how every process of a trace or job file is named (once, if already so)."""
    prefix = f"rank {rank} · "
    return role if role.startswith(prefix) else prefix + role


def main_process_name(rank: int) -> str:
    return rank_track(rank, "main process")


def thread_role(name: str) -> str:
    """``MainThread`` -> ``main thread``, ``MainThread · torch ranges`` -> ``main thread · torch ranges``."""
    if PIN_MEMORY in name:
        return "DataLoader pin memory"
    for prefix, role in THREAD_ROLES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            return role + rest if rest.startswith(" ·") or role == MAIN_THREAD else role
    return name


def name_tracks(trace: WindowTrace, rank: int) -> None:
    """Rename the trace's processes and threads in place; add names to tracks that have none."""
    own = trace.meta.get("pid")
    named_processes: set[Any] = set()
    named_threads: dict[tuple[Any, Any], str] = {}
    sorted_threads: set[Any] = set()
    for event in trace.metadata:
        kind, pid, args = event.get("name"), event.get("pid"), event.get("args") or {}
        if kind == "process_name":
            name = str(args.get("name", ""))
            if pid == own:
                name = main_process_name(rank)
            elif isinstance(pid, int):
                name = rank_track(rank, name)  # a device's process (kineto's "GPU 0")
            event["args"] = {"name": name}
            named_processes.add(pid)
        elif kind == "process_labels":  # Perfetto appends them to the name ("CPU"): the rank's order instead
            event.update(name="process_sort_index", args={"sort_index": rank * 1000 + 1})
        elif kind == "process_sort_index" and pid == own:
            event["args"] = {"sort_index": rank * 1000 + 1}
        elif kind == "thread_name":
            name = thread_role(str(args.get("name", "")))
            event["args"] = {"name": name}
            named_threads[(pid, event.get("tid"))] = name
        elif kind == "thread_sort_index" and pid == event.get("tid"):
            event["args"] = {"sort_index": 1}  # a process's main thread first
            sorted_threads.add(pid)
    added: list[dict[str, Any]] = []
    if own is not None and own not in named_processes:
        added.append(_meta("process_name", own, 0, name=main_process_name(rank)))
    threads: dict[Any, set[Any]] = defaultdict(set)
    for event in trace.other_events():
        if event.get("ph") == "i" and event.get("s") == "g":  # kineto's window markers: no global track
            event.update(s="p", pid=KINETO_PROCESS, tid=KINETO_THREAD)
        elif event.get("ph") == "X":
            threads[event.get("pid")].add(event.get("tid"))
    for pid, tid in trace.python_threads():
        threads[pid].add(tid)
    for pid, tids in threads.items():
        for tid in tids:
            if (pid, tid) not in named_threads and isinstance(tid, int):
                added.append(_meta("thread_name", pid, tid, name=MAIN_THREAD if tid == pid else f"thread {tid}"))
            if tid == pid and pid not in sorted_threads:
                added.append(_meta("thread_sort_index", pid, tid, sort_index=1))
    trace.add(added)


def _meta(kind: str, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}
