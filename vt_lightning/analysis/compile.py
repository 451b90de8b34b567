"""torch.compile in a window, from what ``recording/compile_watch.py`` collected: the compile spans,
the trace metadata's record and the summary's ``compile`` key (docs/compile.md). Pure. A phase's
time excludes the phases inside it (dynamo ⊃ AOT autograd ⊃ inductor)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from vt_lightning.analysis.nest import Nest
from vt_lightning.analysis.schema import CompiledGraph, CompileSummary, TopOps
from vt_lightning.analysis.spans import ms as _ms
from vt_lightning.analysis.spans import overlap_of_unions
from vt_lightning.analysis.trace import Calls, Thread
from vt_lightning.analysis.usercode import is_user_file, parse_function

COMPILE_SPAN_PREFIX = "torch.compile: "
PHASES = ("dynamo", "aot_autograd", "inductor")

MAX_LISTED = 50  # graph breaks / recompiles / functions listed in the summary
REASON_CHARS = 300

_BREAK_AT = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)")
_BREAK_REASON = re.compile(r"^(?:Graph Break )?Reason:\s*(?P<reason>.*)$", re.M)
_TRACEBACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s]+)')
_REASON_END = ("Hint:", "Developer debug context", "For more details", "User code traceback", "Most recent bytecode")
_LEGACY_BREAK = "Graph break: from user code at:"  # torch 2.4
_LEGACY_REASON = re.compile(r"^torch\._dynamo\.exc\.\w+: (.*)$", re.M)
RESUME_MARK = "torch_dynamo_resume_in_"  # in the name of every resume function dynamo makes at a graph break
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<function>\w+?)_at_(?P<line>\d+)$")
REGION_PREFIX = "Torch-Compiled Region: "  # dynamo's range around a compiled frame's code, + compile id
GRAPH_CALL_PREFIX = "## Call CompiledFxGraph "  # inductor's range around one graph's run, + its key
AUTOGRAD_RANGES = ("CompiledFunction", "CompiledFunctionBackward")  # a compiled graph's forward / backward
COUNTS = ("graphs", "compile_s", "recompiles", "graph_breaks")


def _us(record: Mapping[str, Any], us_key: str, s_key: str) -> float | None:
    value = record.get(us_key)
    if isinstance(value, (int, float)):
        return float(value)
    value = record.get(s_key)
    if isinstance(value, (int, float)):
        return float(value) * 1e6
    return None


def phases_us(record: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """(total µs, own µs per phase) of one ``CompilationMetrics`` record."""
    total = _us(record, "duration_us", "entire_frame_compile_time_s")
    if total is None:
        total = _us(record, "dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s") or 0.0
    inductor = _us(record, "inductor_cumulative_compile_time_us", "inductor_compile_time_s") or 0.0
    if record.get("is_forward") is False:  # a backward compiled at its first run: AOT + inductor
        inductor = min(inductor, total)
        return total, {"dynamo": 0.0, "aot_autograd": total - inductor, "inductor": inductor}
    backend = _us(record, "aot_autograd_cumulative_compile_time_us", "backend_compile_time_s") or 0.0
    backend = min(backend, total)
    inductor = min(inductor, backend) if backend else 0.0
    return total, {"dynamo": total - backend, "aot_autograd": backend - inductor, "inductor": inductor}


def _frame_of(record: Mapping[str, Any]) -> str:
    name = str(record.get("co_name") or "?")
    return f"backward of {name}" if record.get("is_forward") is False else name


def _match(span: Mapping[str, Any], records: Sequence[Mapping[str, Any]], used: set[int]) -> int | None:
    """The metrics record of a compile span: same id and direction, else the first started in it."""
    backward = span.get("trigger") == "LAZY_BACKWARD"
    for i, record in enumerate(records):
        if i in used or span.get("compile_id") is None:
            continue
        if record.get("compile_id") == span["compile_id"] and (record.get("is_forward") is False) == backward:
            return i
    lo, hi = float(span.get("wall_start", 0.0)) - 0.01, float(span.get("wall_end", 0.0)) + 0.01
    for i, record in enumerate(records):
        start = record.get("start_time")
        if start is None and isinstance(record.get("start_time_us"), (int, float)):
            start = record["start_time_us"] / 1e6
        if i not in used and isinstance(start, (int, float)) and lo <= start <= hi:
            return i
    return None


def _compiles(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per compile: its span (when the callbacks caught it) and its metrics record."""
    records = [r for r in info.get("compiles") or () if isinstance(r, Mapping)]
    used: set[int] = set()
    out: list[dict[str, Any]] = []
    for span in info.get("spans") or ():
        if not isinstance(span, Mapping) or not isinstance(span.get("end_us"), (int, float)):
            continue
        index = _match(span, records, used)
        record: Mapping[str, Any] = records[index] if index is not None else {}
        if index is not None:
            used.add(index)
        out.append(_compile_entry(span, record))
    out.extend(_compile_entry(None, r) for i, r in enumerate(records) if i not in used)
    forwards = {c["compile_id"]: c for c in out if not c["backward"] and c.get("compile_id")}
    for entry in out:  # a backward's record names no frame: its forward's (same compile id) does
        forward = forwards.get(entry["compile_id"]) if entry["backward"] and not entry["function"] else None
        if forward is not None:
            entry.update(function=forward["function"], file=forward["file"], line=forward["line"])
            entry["frame"] = f"backward of {forward['function']}"
    return out


def _compile_entry(span: Mapping[str, Any] | None, record: Mapping[str, Any]) -> dict[str, Any]:
    total_us, phases = phases_us(record) if record else (0.0, dict.fromkeys(PHASES, 0.0))
    if span is not None and isinstance(span.get("start_us"), (int, float)):
        total_us = float(span["end_us"]) - float(span["start_us"])
    frame = _frame_of(record) if record else ("backward" if span and span.get("trigger") == "LAZY_BACKWARD" else "?")
    return {
        "frame": frame,
        "function": record.get("co_name"),
        "file": record.get("co_filename"),
        "line": record.get("co_firstlineno"),
        "compile_id": record.get("compile_id") or (span or {}).get("compile_id"),
        "ms": _ms(total_us),
        "phases_ms": {p: _ms(v) for p, v in phases.items()},
        "backward": record.get("is_forward") is False or bool(span and span.get("trigger") == "LAZY_BACKWARD"),
        "recompile_reason": record.get("recompile_reason"),
        "failed": record.get("fail_type"),
        "span": span,
    }


def span_name(entry: Mapping[str, Any]) -> str:
    phases = entry["phases_ms"]
    return (
        f"{COMPILE_SPAN_PREFIX}{entry['frame']} (dynamo {phases['dynamo']:.0f}ms, "
        f"aot {phases['aot_autograd']:.0f}ms, inductor {phases['inductor']:.0f}ms)"
    )


def compile_span_events(info: Mapping[str, Any], python_events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The window's compile spans (VizTracer's clock), trimmed so no recorded call crosses one: the
    calls around dynamo's callbacks end just after the span starts, or begin just before it ends."""
    entries = [e for e in _compiles(info) if e["span"] is not None and e["span"].get("start_us") is not None]
    if not entries:
        return []
    by_thread: dict[Any, list[tuple[float, float]]] = {}
    wanted = {(e["span"].get("pid"), e["span"].get("tid")) for e in entries}
    for event in python_events:
        key = (event.get("pid"), event.get("tid"))
        if event.get("ph") == "X" and key in wanted and "ts" in event:
            start = float(event["ts"])
            by_thread.setdefault(key, []).append((start, start + float(event.get("dur", 0.0) or 0.0)))
    out = []
    for entry in entries:
        span = entry["span"]
        lo, hi = float(span["start_us"]), float(span["end_us"])
        for start, end in by_thread.get((span.get("pid"), span.get("tid")), ()):
            if start < lo < end < hi:
                lo = end  # a call that led to the start callback: the span begins after it
            elif lo < start < hi < end:
                hi = min(hi, start)  # a call that leads to the end callback: the span ends before it
        if hi <= lo:
            continue
        out.append(
            {
                "ph": "X",
                "name": span_name(entry),
                "ts": lo,
                "dur": hi - lo,
                "pid": span.get("pid"),
                "tid": span.get("tid"),
                "args": {
                    "compile_id": entry["compile_id"],
                    "trigger": span.get("trigger"),
                    "ms": entry["ms"],
                    **{f"{p}_ms": v for p, v in entry["phases_ms"].items()},
                },
            }
        )
    return out


def _short_reason(text: str) -> str:
    """The reason's first lines, without dynamo's hints and stack (one line, capped)."""
    kept: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(_REASON_END):
            break
        kept.append(line.removeprefix("Explanation:").strip())
    if len(kept) > 1 and kept[0].startswith("Encountered graph break when attempting to trace"):
        kept = kept[1:]
    reason = ": ".join(kept) if len(kept) <= 2 else f"{kept[0]}: {kept[1]}"
    return reason[:REASON_CHARS]


def parse_graph_break(message: str) -> dict[str, Any] | None:
    """``{file, line, function, reason}`` from one ``graph_breaks`` log record (None: not one)."""
    at = _BREAK_AT.search(message)
    if at is None:
        return _parse_legacy_graph_break(message)
    reason_match = _BREAK_REASON.search(message)
    reason = _short_reason(message[reason_match.start("reason") :]) if reason_match else None
    function = None
    for frame in _TRACEBACK_FRAME.finditer(message):  # the innermost frame naming the break's line
        if frame["file"] == at["file"] and int(frame["line"]) == int(at["line"]):
            function = frame["function"]
    return {"file": at["file"], "line": int(at["line"]), "function": function, "reason": reason}


def _parse_legacy_graph_break(message: str) -> dict[str, Any] | None:
    """torch 2.4's record: the user's frames after ``Graph break: from user code at:``."""
    _, marker, rest = message.partition(_LEGACY_BREAK)
    if not marker:
        return None
    user_part = rest.split("Traceback (most recent call last):", 1)[0]
    frames = list(_TRACEBACK_FRAME.finditer(user_part))
    if not frames:
        return None
    frame = frames[-1]
    reasons = _LEGACY_REASON.findall(message)
    reason = reasons[-1].strip()[:REASON_CHARS] if reasons else None
    return {"file": frame["file"], "line": int(frame["line"]), "function": frame["function"], "reason": reason}


def compile_record(info: Mapping[str, Any]) -> dict[str, Any]:
    """What the trace's metadata keeps of a window's torch.compile (``compile_summary`` reads it)."""
    compiles = _compiles(info)
    by_id = {c["compile_id"]: c for c in compiles if c.get("compile_id")}
    breaks: dict[tuple[str, int], dict[str, Any]] = {}
    for raw in info.get("graph_breaks") or ():
        parsed = parse_graph_break(str(raw.get("message", ""))) if isinstance(raw, Mapping) else None
        if parsed is None:
            continue
        key = (parsed["file"], parsed["line"])
        if parsed["function"] is None:
            parsed["function"] = _enclosing_function(parsed, by_id.get(raw.get("compile_id")), compiles)
        known = breaks.get(key)
        if known is None:
            breaks[key] = {**parsed, "compiles": 1, "source": "compile"}
        else:
            known["compiles"] += 1
            known["function"] = known["function"] or parsed["function"]
            known["reason"] = known["reason"] or parsed["reason"]
    recompiles = []
    for entry in compiles:
        reason = entry.get("recompile_reason")
        compile_id = str(entry.get("compile_id") or "")
        if reason is None and not is_recompile_id(compile_id):
            continue
        if entry["backward"]:
            continue
        recompiles.append(
            {
                "function": entry.get("function"),
                "file": entry.get("file"),
                "line": entry.get("line"),
                "reason": str(reason)[:REASON_CHARS] if reason is not None else None,
                "compile_id": compile_id or None,
            }
        )
    during = counts_during(info.get("before"), info.get("after"))
    if during is not None:
        during["recompiles"] = len(recompiles)  # the new records' count: exact, the deque may have turned
    return {
        "torch": info.get("torch"),
        "before": info.get("before"),
        "during": during,
        "frames": dict(info.get("frames") or {}),
        "compiles": [{k: v for k, v in c.items() if k != "span"} for c in compiles],
        "graph_breaks": list(breaks.values())[:MAX_LISTED],
        "recompiles": recompiles[:MAX_LISTED],
        "notes": [str(n) for n in info.get("notes") or ()],
    }


def _enclosing_function(
    place: Mapping[str, Any], compiled: Mapping[str, Any] | None, compiles: Sequence[Mapping[str, Any]]
) -> str | None:
    """A graph break's function without a traceback: the frame then compiled, else the nearest above."""
    if compiled is not None and compiled.get("file") == place["file"] and not _RESUME.search(str(compiled["function"])):
        return compiled.get("function")
    best: tuple[int, str] | None = None
    for entry in compiles:
        line, function = entry.get("line"), entry.get("function")
        if entry.get("file") != place["file"] or not isinstance(line, int) or not function:
            continue
        if _RESUME.search(str(function)) or line > place["line"]:
            continue
        if best is None or line > best[0]:
            best = (line, str(function))
    return best[1] if best else None


def is_recompile_id(compile_id: str) -> bool:
    """``"0/1"``: frame 0's second compile (a recompile); ``"[0/1]"`` and ``"!0/0/1"`` forms too."""
    match = re.search(r"(\d+)/(\d+)\D*$", compile_id)
    return match is not None and int(match[2]) > 0


def counts_during(before: Any, after: Any) -> dict[str, Any] | None:
    """Close minus open of each count; one that went down (``torch._dynamo.reset()``) counts from 0."""
    if not isinstance(after, Mapping):
        return None
    before = before if isinstance(before, Mapping) else {}
    out: dict[str, Any] = {}
    for key in COUNTS:
        end, start = after.get(key), before.get(key)
        if isinstance(end, (int, float)) and isinstance(start, (int, float)) and end >= start:
            end = end - start
        out[key] = round(end, 3) if isinstance(end, float) else end
    return out


def _user_caller(calls: Calls | None, t: float) -> tuple[str, str | None, int | None] | None:
    """The innermost user call open at ``t``: a compiled ``torch.nn`` module's frame is torch's."""
    if calls is None or not len(calls):
        return None
    open_at = np.flatnonzero((calls.starts <= t) & (calls.ends > t))
    for i in open_at[np.argsort(calls.starts[open_at], kind="stable")[::-1]].tolist():
        function, path, line = parse_function(calls.names[i])
        if is_user_file(path):
            return function, path, line
    return None


def _around(ordered: list[Mapping[str, Any]], parents: list[int], i: int, prefix: str) -> Mapping[str, Any] | None:
    """The innermost range around ``ordered[i]`` whose name starts with ``prefix``."""
    i = parents[i]
    while i >= 0 and not str(ordered[i]["name"]).startswith(prefix):
        i = parents[i]
    return ordered[i] if i >= 0 else None


def compiled_graphs(
    events: Iterable[Mapping[str, Any]], frames: Mapping[str, Any], python_calls: Mapping[Thread, Calls]
) -> list[CompiledGraph]:
    """The compiled graphs the window ran, named by the frame dynamo compiled: a graph's call nests in its
    region (forward), or in a ``CompiledFunctionBackward`` whose sequence number is a forward's in it."""
    by_thread: dict[Thread, list[Mapping[str, Any]]] = defaultdict(list)
    for e in events:
        name = str(e.get("name", ""))
        if name.startswith((REGION_PREFIX, GRAPH_CALL_PREFIX)) or name in AUTOGRAD_RANGES:
            # a range the merge moved to a track beside its thread (analysis/nesting.py) keeps its thread
            by_thread[(e.get("pid"), (e.get("args") or {}).get("vt_lightning.thread", e.get("tid")))].append(e)
    runs: Counter[tuple[str | None, bool, str | None]] = Counter()  # (compile id, backward, key) -> runs
    first_run: dict[str, tuple[Thread, float]] = {}  # compile id -> where its region first ran
    forward_of: dict[Any, str] = {}  # a forward CompiledFunction's sequence number -> its compile id
    backward: list[tuple[Any, str]] = []  # (sequence number, key) of each backward graph's run
    for thread, spans in by_thread.items():
        nest = Nest([e["ts"] for e in spans], [float(e["ts"]) + float(e.get("dur") or 0.0) for e in spans], clip=False)
        ordered, parents = [spans[i] for i in nest.order.tolist()], nest.parents.tolist()
        for i, e in enumerate(ordered):
            name, sequence = str(e["name"]), (e.get("args") or {}).get("Sequence number")
            region = _around(ordered, parents, i, REGION_PREFIX)
            compile_id = str(region["name"])[len(REGION_PREFIX) :] if region else None
            if name.startswith(REGION_PREFIX):
                first_run.setdefault(name[len(REGION_PREFIX) :], (thread, float(e["ts"])))
                runs[(name[len(REGION_PREFIX) :], False, None)] += 1
            elif name == "CompiledFunction" and compile_id:
                forward_of[sequence] = compile_id
            elif name.startswith(GRAPH_CALL_PREFIX):
                key = name[len(GRAPH_CALL_PREFIX) :].removesuffix("##").strip()
                around = None if compile_id else _around(ordered, parents, i, "CompiledFunctionBackward")
                if around is not None:
                    backward.append(((around.get("args") or {}).get("Sequence number"), key))
                else:
                    runs[(compile_id, False, key)] += 1
    for sequence, key in backward:  # once every thread's forwards are known (a GPU's backward thread)
        runs[(forward_of.get(sequence), True, key)] += 1
    inductor = {compile_id for compile_id, _, graph_key in runs if graph_key}
    out: list[CompiledGraph] = []
    for (compile_id, back, graph_key), n in sorted(runs.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if graph_key is None and compile_id in inductor:
            continue  # the region of an inductor graph: its graph is listed
        function, path, line = (list(frames.get(str(compile_id)) or ()) + [None] * 3)[:3]
        if compile_id in first_run and not is_user_file(path):
            thread, t = first_run[compile_id]
            function, path, line = _user_caller(python_calls.get(thread), t) or (function, path, line)
        graph = {"compile_id": compile_id, "function": function, "file": path, "line": line, "backward": back}
        out.append(cast(CompiledGraph, {**graph, "hash": graph_key, "calls": n}))
    return out[:MAX_LISTED]


def graph_label(graph: Mapping[str, Any]) -> str:
    """``compiled graph: Block.forward (model.py:23) [<key>]``: the ops table's name of a graph's run."""
    place = f"{str(graph.get('file')).rsplit('/', 1)[-1]}:{graph.get('line')}" if graph.get("file") else "?"
    direction = "backward of " if graph.get("backward") else ""
    return f"compiled graph: {direction}{graph.get('function') or '?'} ({place}) [{graph.get('hash')}]"


def named_graph_ops(ops: TopOps, graphs: Sequence[Mapping[str, Any]]) -> TopOps:
    """The ops tables with each mapped ``## Call CompiledFxGraph <key> ##`` named by its graph."""
    labels = {f"{GRAPH_CALL_PREFIX}{g['hash']} ##": graph_label(g) for g in reversed(graphs) if g.get("hash")}
    if not labels:
        return ops
    out: dict[str, Any] = dict(ops)
    for table in ("by_cpu", "by_kernel"):
        if table in ops:
            out[table] = [{**row, "name": labels.get(row["name"], row["name"])} for row in out[table]]
    if "totals" in ops:
        totals = ops["totals"]
        out["totals"] = {**totals, "ms": {labels.get(name, name): ms for name, ms in totals["ms"].items()}}
    return cast(TopOps, out)


def runtime_graph_breaks(events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Graph breaks the steps went through: calls of dynamo's resume functions, by file and line."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events:
        name = str(event.get("name", ""))
        if RESUME_MARK not in name:
            continue
        function, path, _ = parse_function(name)
        match = _RESUME.search(function)
        if match is None or not path:
            continue
        key = (path, int(match["line"]))
        entry = found.setdefault(
            key, {"file": path, "line": key[1], "function": match["function"], "reason": None, "calls": 0}
        )
        entry["calls"] += 1
    return found


def compile_summary(
    record: Mapping[str, Any] | None,
    events: Sequence[Mapping[str, Any]],
    steps: Mapping[int, tuple[float, float]],
    python_calls: Mapping[Thread, Calls] | None = None,
) -> CompileSummary | None:
    """The summary's ``compile`` key; None when the run compiled nothing and no graph break ran."""
    runtime = runtime_graph_breaks(events)
    if record is None and not runtime:
        return None
    record = record or {}
    before, during = record.get("before") or {}, record.get("during") or {}
    graphs = compiled_graphs(events, record.get("frames") or {}, python_calls or {})
    compiles = [c for c in record.get("compiles") or () if isinstance(c, Mapping)]
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if str(e.get("name", "")).startswith(COMPILE_SPAN_PREFIX) and "ts" in e
    ]
    regions = list(steps.values())
    steps_us = sum(hi - lo for lo, hi in regions)
    in_steps_us = overlap_of_unions(spans, regions)
    phases = dict.fromkeys(PHASES, 0.0)
    functions: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for entry in compiles:
        for phase in PHASES:
            phases[phase] += float((entry.get("phases_ms") or {}).get(phase, 0.0))
        key = (entry.get("function"), entry.get("file"), entry.get("line"))
        item = functions.setdefault(key, {"function": key[0], "file": key[1], "line": key[2], "compiles": 0, "ms": 0.0})
        item["compiles"] += 1
        item["ms"] = round(item["ms"] + float(entry.get("ms") or 0.0), 3)
    breaks = [dict(b) for b in record.get("graph_breaks") or () if isinstance(b, Mapping)]
    for item in breaks:
        seen = runtime.pop((str(item.get("file")), int(item.get("line") or 0)), None)
        item["calls"] = seen["calls"] if seen else 0
    breaks.extend({**b, "compiles": 0, "source": "run"} for b in runtime.values())
    recompiles = [dict(r) for r in record.get("recompiles") or () if isinstance(r, Mapping)]
    if not (compiles or breaks or recompiles or graphs or before.get("graphs") or during.get("graphs")):
        return None  # torch._dynamo imported, nothing compiled or broken: nothing to say
    out = {
        "compiles": len(compiles),
        "total_ms": round(sum(float(c.get("ms") or 0.0) for c in compiles), 3),
        "phases_ms": {p: round(v, 3) for p, v in phases.items()},
        "in_steps_ms": _ms(in_steps_us),
        "steps_ms": _ms(steps_us),
        "share": round(in_steps_us / steps_us, 4) if steps_us > 0 else None,
        "functions": sorted(functions.values(), key=lambda f: f["ms"], reverse=True)[:MAX_LISTED],
        "graph_breaks": breaks[:MAX_LISTED],
        "recompiles": recompiles[:MAX_LISTED],
        "notes": list(record.get("notes") or ()),
        "torch": record.get("torch"),
        "before": record.get("before"),
        "during": record.get("during"),
        "graphs": graphs,
    }
    return cast(CompileSummary, out)


def compile_text(info: Mapping[str, Any] | None) -> str | None:
    """The console's and the report's line of what the run compiled (None: no counters)."""
    before, during = (info or {}).get("before"), (info or {}).get("during") or {}
    if not isinstance(before, Mapping):
        return None
    ahead, inside = (
        f"{v:.1f} s" if isinstance(v, (int, float)) else "? s"
        for v in (before.get("compile_s"), during.get("compile_s"))
    )
    total = {key: int(before.get(key) or 0) + int(during.get(key) or 0) for key in ("recompiles", "graph_breaks")}
    return (
        f"compiled model: {before.get('graphs')} graph(s), {ahead} compiling before this window "
        f"({during.get('graphs', 0)} graph(s), {inside} during), {total['recompiles']} recompile(s), "
        f"{total['graph_breaks']} graph break(s)"
    )


def compile_markdown(info: Mapping[str, Any], top: int = 5) -> list[str]:
    """The summary.md lines of the ``compile`` key."""
    phases = info.get("phases_ms") or {}
    share = info.get("share")
    lines = [""]
    text = compile_text(info)
    if text:
        lines.append(f"**{text}.**")
    graphs = [g for g in info.get("graphs") or () if isinstance(g, Mapping)]
    if graphs:
        lines += ["", "| compiled graph | compile id | calls |", "|---|---|---:|"]
        lines += [f"| `{graph_label(g)}` | {g.get('compile_id')} | {g.get('calls')} |" for g in graphs[: top * 2]]
    if info.get("compiles") or not text:
        lines += [
            "",
            f"**torch.compile**: {info.get('compiles', 0)} compile(s), {info.get('total_ms', 0)} ms (dynamo "
            f"{phases.get('dynamo', 0)}, aot {phases.get('aot_autograd', 0)}, "
            f"inductor {phases.get('inductor', 0)} ms); "
            f"{info.get('in_steps_ms', 0)} ms inside the recorded steps"
            + (f" ({share:.0%} of their time)." if isinstance(share, (int, float)) else "."),
        ]
    rows = [
        ("graph break", b, b.get("reason") or "compiled before the window")
        for b in info.get("graph_breaks") or ()
        if isinstance(b, Mapping)
    ]
    rows += [("recompile", r, r.get("reason") or "?") for r in info.get("recompiles") or () if isinstance(r, Mapping)]
    if rows:
        lines += ["", "| torch.compile | where | reason |", "|---|---|---|"]
        for kind, item, reason in rows[: top * 2]:
            place = f"`{item.get('function')}` ({str(item.get('file')).rsplit('/', 1)[-1]}:{item.get('line')})"
            lines.append(f"| {kind} | {place} | {str(reason).replace('|', '/')} |")
    lines += [f"- note: {note}" for note in info.get("notes") or ()]
    return lines
