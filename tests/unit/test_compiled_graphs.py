"""What a window says the run compiled, on synthetic events and counts (a real inductor run on a
Trainer: tests/integration/test_compile_watch.py): each graph's run named by the frame dynamo
compiled, forward through its region and backward through the sequence number of its forward."""

from __future__ import annotations

from typing import Any

from vt_lightning.analysis.compile import compile_text, compiled_graphs, counts_during, named_graph_ops
from vt_lightning.analysis.trace import Calls

MODEL = "/home/me/model.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/_dynamo/external_utils.py"


def _x(name: str, ts: float, dur: float, tid: int = 7, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _graph(key: str, ts: float) -> dict[str, Any]:
    return _x(f"## Call CompiledFxGraph {key} ##", ts, 1.0)


FRAMES = {"0/0": ["forward", MODEL, 23], "0/1": ["forward", MODEL, 23], "1/0": ["inner", TORCH, 67]}


def test_forward_graphs_by_their_region_backward_by_the_forwards_sequence_number_on_any_thread():
    events = [
        _x("Torch-Compiled Region: 0/0", 0.0, 10.0),
        _x("CompiledFunction", 1.0, 8.0, **{"Sequence number": 5}),
        _graph("fwdA", 2.0),
        _x("Torch-Compiled Region: 0/1", 20.0, 10.0),  # a recompile's code ran
        _x("CompiledFunction", 21.0, 8.0, **{"Sequence number": 9}),
        _graph("fwdB", 22.0),
        # backward on the autograd thread (a GPU's), after the forwards
        _x("CompiledFunctionBackward", 40.0, 5.0, tid=8, **{"Sequence number": 5}),
        _graph("bwdA", 41.0) | {"tid": 8},
        _x("CompiledFunctionBackward", 50.0, 5.0, tid=8, **{"Sequence number": 9}),
        _graph("bwdB", 51.0) | {"tid": 8},
        _graph("fwdA", 60.0),  # outside any region: no frame to name it by
    ]
    graphs = {(g["compile_id"], g["backward"], g["hash"]): g for g in compiled_graphs(events, FRAMES, {})}
    assert set(graphs) == {
        ("0/0", False, "fwdA"),
        ("0/1", False, "fwdB"),
        ("0/0", True, "bwdA"),
        ("0/1", True, "bwdB"),
        (None, False, "fwdA"),
    }
    assert (graphs[("0/0", True, "bwdA")]["function"], graphs[("0/0", True, "bwdA")]["line"]) == ("forward", 23)
    assert graphs[(None, False, "fwdA")]["function"] is None


def test_a_range_moved_beside_its_thread_still_holds_its_graph():
    moved = _x("Torch-Compiled Region: 0/0", 0.0, 10.0, tid=2_000_000_007, **{"vt_lightning.thread": 7})
    (graph,) = compiled_graphs([moved, _graph("fwdA", 2.0)], FRAMES, {})
    assert (graph["compile_id"], graph["function"], graph["calls"]) == ("0/0", "forward", 1)


def test_a_compiled_torch_module_is_named_by_the_users_call_around_it_and_another_backend_by_its_region():
    calls = Calls.of(
        [
            (0.0, 100.0, f"Model.training_step ({MODEL}:40)"),
            (1.0, 50.0, f"inner ({TORCH}:67)"),
        ]
    )
    events = [_x("Torch-Compiled Region: 1/0", 5.0, 10.0), _x("Torch-Compiled Region: 1/0", 55.0, 10.0)]
    (graph,) = compiled_graphs(events, FRAMES, {(1, 7): calls})
    assert graph == {
        "compile_id": "1/0",
        "function": "Model.training_step",
        "file": MODEL,
        "line": 40,
        "backward": False,
        "hash": None,  # aot_eager: no inductor graph in the region
        "calls": 2,
    }


def test_the_ops_tables_name_each_graphs_run():
    graphs = compiled_graphs([_x("Torch-Compiled Region: 0/0", 0.0, 10.0), _graph("fwdA", 2.0)], FRAMES, {})
    raw = "## Call CompiledFxGraph fwdA ##"
    ops = named_graph_ops(
        {
            "by_cpu": [{"name": raw, "calls": 1, "self_cpu_ms": 1.0, "cpu_ms": 1.0}],
            "totals": {"threshold_ms": 0.001, "ms": {raw: 1.0, "aten::mm": 2.0}, "other_ms": 0.0, "other_count": 0},
        },
        graphs,
    )
    label = "compiled graph: forward (model.py:23) [fwdA]"
    assert [row["name"] for row in ops["by_cpu"]] == [label]
    assert ops["totals"]["ms"] == {label: 1.0, "aten::mm": 2.0}


def test_counts_during_the_window_and_the_line_that_says_them():
    before = {"graphs": 4, "compile_s": 1.7, "recompiles": 0, "graph_breaks": 1}
    after = {"graphs": 6, "compile_s": 2.0, "recompiles": 1, "graph_breaks": 2}
    during = counts_during(before, after)
    assert during == {"graphs": 2, "compile_s": 0.3, "recompiles": 1, "graph_breaks": 1}
    # torch._dynamo.reset() inside the window zeroes the compile time: counted from 0
    assert counts_during(before, {**after, "compile_s": 0.2})["compile_s"] == 0.2
    assert counts_during(before, None) is None
    assert compile_text({"before": before, "during": during}) == (
        "compiled model: 4 graph(s), 1.7 s compiling before this window (2 graph(s), 0.3 s during), "
        "1 recompile(s), 2 graph break(s)"
    )
    assert compile_text({"compiles": 1}) is None  # a torch without counters
