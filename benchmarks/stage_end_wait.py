"""How long the end of each stage waits for its last window (issue 50). Usage:

    python benchmarks/stage_end_wait.py              # 5 rounds, table into docs/performance.md
    python benchmarks/stage_end_wait.py --rounds 9   # steadier
    python benchmarks/stage_end_wait.py --quick --no-write   # 1 round: proves it runs
    python benchmarks/stage_end_wait.py --no-write --code ../main   # another checkout's vt_lightning

Cases: fit (``max_steps=8``), validate, test, predict (8 batches each) and a short fit
(``limit_train_batches=3``), each with ``VizTraceCallback(stages=[stage])`` and its default window
(batches 2-4), and each again with no callback (the baseline: what the stage's end costs anyway).
Every run is a fresh process; a round runs every case and its baseline, in an order that rotates
each round (interleaved). The wait is wall time from the stage's last batch end to its end hook
(a probe callback after ours). The window's own ``save()`` is the held window's finish on the
writer thread (``handoff._finish_with_collector_paused``, wall and CPU); the target is a wait no
longer than that save. "writer process" counts runs that started one (the old end of
validate/test/predict and of short runs, whose start-up on busy cores made the waits).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

CASES = ("fit", "validate", "test", "predict", "short fit")
START, END = "<!-- stage-end-wait:start -->", "<!-- stage-end-wait:end -->"

CHILD = r"""
import json, sys, time
case, root, vt = sys.argv[1], sys.argv[2], sys.argv[3] == "vt"
sys.path[:0] = [sys.argv[4], sys.argv[5]]
from _common import quiet
quiet()
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset
from vt_lightning import VizTraceCallback
import vt_lightning
from vt_lightning.controller import handoff
assert vt_lightning.__file__.startswith(sys.argv[5]), vt_lightning.__file__

saves, processes, marks = [], [], {}
finish = handoff._finish_with_collector_paused
def timed(job):
    wall, cpu = time.perf_counter(), time.thread_time()
    result = finish(job)
    saves.append((time.perf_counter() - wall, time.thread_time() - cpu))
    return result
handoff._finish_with_collector_paused = timed
real_process = handoff.WriterProcess
def counted():
    processes.append(1)
    return real_process()
handoff.WriterProcess = counted

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()
    def _eval(self, batch, batch_idx):
        return self.layer(batch[0]).sum()
    validation_step = test_step = predict_step = _eval
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

class Probe(L.Callback):
    def _batch_end(self, *args, **kwargs):
        marks["batch_end"] = time.perf_counter()
    on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _batch_end
    def _stage_end(self, *args, **kwargs):
        marks["stage_end"] = time.perf_counter()
    on_train_end = on_validation_end = on_test_end = on_predict_end = _stage_end

stage = case.split()[-1]
limits = {"fit": dict(max_steps=8), "short fit": dict(max_epochs=1, limit_train_batches=3)}.get(case, {})
callbacks = [VizTraceCallback(stages=[stage], memory_snapshot=False)] if vt else []
trainer = L.Trainer(
    default_root_dir=root, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=8,
    limit_test_batches=8, limit_predict_batches=8, callbacks=[*callbacks, Probe()], **limits,
)
getattr(trainer, stage)(Model(), DataLoader(TensorDataset(torch.randn(256, 32)), batch_size=8))
print("RESULT " + json.dumps({"wait_s": marks["stage_end"] - marks["batch_end"], "saves": saves,
                              "processes": len(processes)}))
"""


def one_run(case: str, vt: bool, code: Path = REPO) -> dict:
    root = tempfile.mkdtemp(prefix="vt-stage-end-")
    try:
        args = [sys.executable, "-c", CHILD, case, root, "vt" if vt else "none", str(HERE), str(code)]
        proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=600)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{case} ({'vt' if vt else 'none'}) failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def spread(values: list[float], unit: float = 1000.0) -> str:
    """Median (min-max), in ms by default."""
    if not values:
        return "–"
    scaled = [v * unit for v in values]
    return f"{statistics.median(scaled):.0f} ({min(scaled):.0f}-{max(scaled):.0f})"


def table(runs: dict[tuple[str, bool], list[dict]]) -> str:
    lines = [
        "| stage end | runs | wait, ms: vt | wait, ms: no callback | the window's save(), wall ms | "
        "its CPU ms | wait - baseline / save (median) | writer process started |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for case in CASES:
        vt, none = runs[(case, True)], runs[(case, False)]
        waits = [r["wait_s"] for r in vt]
        base = [r["wait_s"] for r in none]
        saves = [s for r in vt for s in r["saves"]]
        save_wall = statistics.median([s[0] for s in saves]) if saves else None
        ratio = (statistics.median(waits) - statistics.median(base)) / save_wall if save_wall else None
        lines.append(
            f"| {case} | {len(vt)} | {spread(waits)} | {spread(base)} | {spread([s[0] for s in saves])} | "
            f"{spread([s[1] for s in saves])} | {f'{ratio:.2f}' if ratio is not None else '–'} | "
            f"{sum(r['processes'] > 0 for r in vt)} of {len(vt)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 round: proves the script runs")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose vt_lightning runs")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    order = [(case, vt) for case in CASES for vt in (True, False)]
    runs: dict[tuple[str, bool], list[dict]] = {key: [] for key in order}
    for round_ in range(rounds):
        shift = round_ % len(order)
        for case, vt in order[shift:] + order[:shift]:
            runs[(case, vt)].append(one_run(case, vt, args.code.resolve()))
            print(round_, case, "vt" if vt else "none", json.dumps(runs[(case, vt)][-1]), flush=True)
    text = table(runs)
    print(text)
    if not args.no_write:
        from _common import write_block

        write_block(REPO / "docs" / "performance.md", START, END, f"{START}\n{text}\n{END}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
