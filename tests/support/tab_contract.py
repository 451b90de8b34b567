"""The fields issue 51's writer adds for the tab (the contract the tab reads: step bounds, the
recorded source lines, the memory view side file), made here from a real window's own files where
the writer does not write them yet. A field the writer wrote is left as it is, so the tab's tests
read the writer's fields once it does."""

from __future__ import annotations

import gzip
import os
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

SUMMARY = ".summary.jsonc"
CONTEXT = 4


def add_contracted_fields(logdir: Path, user_file: str) -> None:
    """Every window summary under ``logdir``: ``steps.bounds_us``/``trace_us``, ``sources`` (the
    lines around each place the summary names, read now), and its ``.memory_view.jsonc`` (the
    allocator's curve from the trace's ``[memory]`` events, the sites live at the peak replayed
    from the snapshot, grouped at their innermost frame in ``user_file``)."""
    for path in logdir.rglob(f"*{SUMMARY}"):
        summary = orjson.loads(path.read_bytes())
        stem = path.name[: -len(SUMMARY)]
        events = orjson.loads(gzip.decompress((path.parent / f"{stem}.pt.trace.json.gz").read_bytes()))["traceEvents"]
        timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
        steps = {
            e["name"].removeprefix("ProfilerStep#"): [e["ts"], e["ts"] + e["dur"]]
            for e in timed
            if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")
        }
        summary["steps"].setdefault("bounds_us", steps)
        summary["steps"].setdefault(
            "trace_us", [min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0) for e in timed)]
        )
        summary.setdefault("sources", _sources(summary))
        path.write_bytes(orjson.dumps(summary))
        view = path.parent / f"{stem}.memory_view.jsonc"
        snapshot = path.parent / f"{stem}.memory_snapshot.pickle"
        if not view.exists() and snapshot.exists():
            view.write_bytes(orjson.dumps(_memory_view(events, snapshot, steps, user_file)))


def _sources(summary: dict[str, Any]) -> dict[str, Any]:
    places = [w for v in summary.get("verdicts") or [] for w in v.get("where") or []]
    places += [summary.get("job", {}).get("straggler") or {}]
    files: dict[str, Any] = {}
    for place in places:
        name, line = place.get("file"), place.get("line")
        if not name or not line:
            continue
        text = Path(name).read_text().splitlines()
        info = os.stat(name)
        entry = files.setdefault(name, {"mtime_ns": info.st_mtime_ns, "size": info.st_size, "lines": {}})
        for n in range(max(1, line - CONTEXT), min(len(text), line + CONTEXT) + 1):
            entry["lines"][str(n)] = text[n - 1]
    return {"files": files, "truncated": False}


def _memory_view(events: list[dict[str, Any]], snapshot: Path, steps: dict[str, Any], user_file: str) -> dict[str, Any]:
    samples = sorted((e["ts"], e["args"]["Total Allocated"]) for e in events if e.get("name") == "[memory]")
    peak_ts, peak = max(samples, key=lambda s: s[1])
    with open(snapshot, "rb") as f:
        (trace,) = pickle.load(f)["device_traces"]
    live: dict[int, dict[str, Any]] = {}
    for entry in trace:
        if entry["time_us"] > peak_ts + 1:
            break
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry
        elif entry["action"].startswith("free"):
            live.pop(entry["addr"], None)
    sites: dict[tuple[str, str | None, int | None], list[int]] = defaultdict(lambda: [0, 0])
    for entry in live.values():
        frame = next((f for f in entry["frames"] if f["filename"] == user_file), entry["frames"][0])
        python = frame["filename"].endswith(".py")
        site = sites[(frame["name"], frame["filename"] if python else None, frame["line"] if python else None)]
        site[0] += entry["size"]
        site[1] += 1
    top = sorted(sites.items(), key=lambda kv: -kv[1][0])[:10]
    return {
        "schema": 1,
        "steps": steps,
        "devices": {
            "cpu": {
                "events": len(samples),
                "peak_bytes": peak,
                "peak_ts_us": peak_ts,
                "series": ["ts_us", "allocated"],
                "points": [list(s) for s in samples],
                "top_sites_at_peak": [
                    {
                        "function": function,
                        "file": file,
                        "line": line,
                        "origin": "user" if file == user_file else "other",
                        "bytes": size,
                        "allocations": count,
                    }
                    for (function, file, line), (size, count) in top
                ],
            }
        },
    }
