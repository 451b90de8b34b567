"""The end-of-fit wait on ``examples/vision.py`` (issue 39), before/after, rounds alternating.

    python benchmarks/end_wait_example.py --rounds 3 before=/path/to/checkout-of-main after=.

Each round runs the example once per checkout, each in a fresh process importing vt_lightning from
that checkout, and prints per run: the console's ``waited X s for the writer`` (wall seconds, 0
when it printed none) and, per window held to the end of fit (``handoff.finishes_at_end``), the
CPU seconds its finish took on the writer thread and its events (Python + torch). CPU, because on
a shared machine the wall wait swings with the load; divide by the window's events and compare
with ``benchmarks/writer_cost.py``'s ``save()`` µs per event.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# Run inside the child: time the held windows' finish, then run the example as a script.
CHILD = r"""
import json, runpy, sys, time
code, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, code)
import vt_lightning
assert vt_lightning.__file__.startswith(code), vt_lightning.__file__
from vt_lightning.controller import handoff
held = []
finish = handoff._finish_with_collector_paused
def timed(job):
    start = time.thread_time()
    result = finish(job)
    held.append((time.thread_time() - start, result.python_events + result.torch_events))
    return result
handoff._finish_with_collector_paused = timed
sys.argv = ["vision.py", "--root", root]
try:
    runpy.run_path(code + "/examples/vision.py", run_name="__main__")
finally:
    print("HELD " + json.dumps(held))
"""


def one_run(code: str) -> dict[str, object]:
    root = tempfile.mkdtemp(prefix="vt-end-wait-")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, code, root], capture_output=True, text=True, cwd=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"examples/vision.py failed with {code}:\n{text[-3000:]}")
    waited = re.findall(r"waited ([0-9.]+) s for the writer", text)
    held = re.findall(r"^HELD (.*)$", text, re.MULTILINE)
    return {"waited_s": float(waited[-1]) if waited else 0.0, "held": json.loads(held[-1]) if held else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("codes", nargs="+", help="LABEL=CHECKOUT, e.g. before=../main after=.")
    args = parser.parse_args(argv)
    codes = dict(code.split("=", 1) for code in args.codes)
    runs: dict[str, list[dict[str, object]]] = {label: [] for label in codes}
    labels = list(codes)
    for round_ in range(args.rounds):
        for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
            runs[label].append(one_run(codes[label]))
            print(label, json.dumps(runs[label][-1]), flush=True)
    print("\n| code | runs | waited, wall (s) | held windows | held finish, CPU s per window | events per window |")
    print("|---|---:|---|---:|---|---|")
    for label, results in runs.items():
        held = [h for r in results for h in r["held"]]  # type: ignore[attr-defined]
        waits = [float(r["waited_s"]) for r in results]  # type: ignore[arg-type]
        cpu = [h[0] for h in held]
        events = [h[1] for h in held]
        spread = f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f})" if cpu else "–"
        print(
            f"| {label} | {len(results)} | {statistics.median(waits):.1f} ({min(waits):.1f}-{max(waits):.1f}) | "
            f"{len(held)} | {spread} | {min(events, default=0):,}-{max(events, default=0):,} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
