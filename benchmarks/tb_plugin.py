"""The TensorBoard tab's first load and memory as windows grow (issue 37). Usage:

    python benchmarks/tb_plugin.py             # 1,000 and 4,000 windows, 3 rounds; updates docs/performance.md
    python benchmarks/tb_plugin.py --quick     # 50 and 200 windows, 1 round
    python benchmarks/tb_plugin.py --no-write  # print only

One real ``Trainer.fit`` with ``VizTraceCallback`` writes one window (tests/support/tab_run.py's slow
``__getitem__``: an input_bound verdict). Its files are then copied into N window directories of
one run: each gets its own summary file (the real summary with its window index changed), and hard
links to the real trace and memory snapshot. Measured in process, through TensorBoard's own WSGI routing, with a fresh
plugin each time (cold caches, warm OS page cache):

* **first load**: the requests the tab makes before it shows anything: ``runs``, the first page of
  ``windows`` (``FIRST_PAGE`` = 200 rows, as static/index.js asks) and the first ``window``, which
  carries its verdicts' recorded source lines (the tab then fetches the other rows, 500 a request,
  while shown);
* **all rows**: every page of ``windows``, on a fresh plugin (every window's summary read, checked
  against the schema and cached);
* **memory**: tracemalloc's peak during the first load, and what the plugin holds after all rows.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
START = "<!-- tb-plugin:start -->"
END = "<!-- tb-plugin:end -->"
SUMMARY = ".summary.jsonc"
FIRST_PAGE = 200  # static/index.js's FIRST_PAGE


def one_window(root: Path) -> Path:
    """A real window directory, written by the callback: the TensorBoard tab tests' run
    (tests/support/tab_run.py), one window of it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.tab_run import input_bound_run

    input_bound_run(root, repeat=1)
    (summary,) = root.rglob(f"*{SUMMARY}")
    return summary.parent


def build_logdir(source: Path, target: Path, windows: int) -> None:
    """``windows`` window directories under ``target/run``, each with its own summary file."""
    (summary_path,) = source.glob(f"*{SUMMARY}")
    summary = orjson.loads(summary_path.read_bytes())
    others = [p for p in source.iterdir() if p.is_file() and not p.name.endswith(SUMMARY)]
    run = target / "run"
    for i in range(windows):
        first = 2 + 5 * i
        window_dir = run / f"window_{i:03d}-batches_{first}-{first + 2}"
        window_dir.mkdir(parents=True)
        summary["window"]["index"] = i
        (window_dir / summary_path.name).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        for other in others:
            os.link(other, window_dir / other.name)


def _client(logdir: Path) -> tuple[Any, Any]:
    from tensorboard.backend.application import TensorBoardWSGI
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from vt_lightning.tensorboard.plugin import VtLightningPlugin

    plugin = VtLightningPlugin(base_plugin.TBContext(logdir=str(logdir)))
    return Client(TensorBoardWSGI([plugin])), plugin


def _get(client: Any, route: str, **params: Any) -> Any:
    response = client.get(f"/data/plugin/vt_lightning/{route}", query_string=params)
    assert response.status_code == 200, (route, params, response.get_data()[:300])
    return orjson.loads(response.get_data())


def first_load(client: Any) -> int:
    """The tab's requests when opened; returns how many window rows it got."""
    runs = _get(client, "runs")["runs"]
    page = _get(client, "windows", run=runs[0]["run"], limit=FIRST_PAGE)
    first = page["windows"][0]
    _get(client, "window", run=first["run"], name=first["name"])
    return len(page["windows"])


def all_rows(client: Any) -> int:
    total, seen = None, 0
    while total is None or seen < total:
        page = _get(client, "windows", run="run", offset=seen)
        total, seen = page["total"], seen + len(page["windows"])
    return seen


def measure(logdir: Path) -> dict[str, float]:
    gc.collect()
    client, _ = _client(logdir)
    start = time.perf_counter()
    rows = first_load(client)
    first_s = time.perf_counter() - start
    client, _ = _client(logdir)
    start = time.perf_counter()
    every = all_rows(client)
    all_s = time.perf_counter() - start
    gc.collect()
    client, plugin = _client(logdir)
    tracemalloc.start()
    first_load(client)
    _, first_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    all_rows(client)
    gc.collect()
    held, all_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del client, plugin
    return {
        "first_s": first_s,
        "rows": rows,
        "all_s": all_s,
        "every": every,
        "first_peak": first_peak,
        "all_peak": all_peak,
        "held": held,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vt_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    sizes = (50, 200) if args.quick else (1000, 4000)
    rounds = args.rounds or (1 if args.quick else 3)
    tmp = Path(tempfile.mkdtemp(prefix="vt-bench-tb-"))
    results: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    try:
        source = one_window(tmp / "train")
        dirs = {}
        for n in sizes:
            dirs[n] = tmp / f"logs-{n}"
            build_logdir(source, dirs[n], n)
        for r in range(rounds):
            for n in sizes if r % 2 == 0 else tuple(reversed(sizes)):  # interleaved, order alternating
                results[n].append(measure(dirs[n]))
            print(f"  round {r + 1}/{rounds}: done", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    block = render(results, rounds, args.quick)
    print(block)
    if not args.no_write:
        doc = Path(args.doc)
        text = doc.read_text()
        if START in text and END in text:
            head, rest = text.split(START, 1)
            text = head + block + rest.split(END, 1)[1]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
        doc.write_text(text)
        print(f"wrote {doc}")
    return 0


def _spread(values: list[float], scale: float, digits: int = 0) -> str:
    values = sorted(v * scale for v in values)
    return f"{statistics.median(values):.{digits}f} ({values[0]:.{digits}f}–{values[-1]:.{digits}f})"


def render(results: dict[int, list[dict[str, float]]], rounds: int, quick: bool) -> str:
    import torch

    lines = [
        START,
        "## The TensorBoard tab: first load and memory",
        "",
        f"`python benchmarks/tb_plugin.py{' --quick' if quick else ''}` — one run directory of N windows (copies "
        "of a real window, each with its own summary), the plugin in process through TensorBoard's WSGI "
        f"routing, a fresh plugin per measure; median (min–max) over {rounds} round(s), the sizes "
        "interleaved in alternating order. First load: what the tab waits for before it shows anything: "
        f"`runs`, the first {FIRST_PAGE} rows of `windows`, the first `window` (with its recorded source lines); "
        "all rows: every page of `windows` (a summary read and schema-checked per window), on a fresh "
        "plugin. Memory: tracemalloc (Python allocations); held: what the plugin keeps after all rows.",
        "",
        f"Python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} while measuring.",
        "",
        "| windows | first load ms | rows shown | all rows ms | peak MiB, first load | peak MiB, all rows "
        "| held MiB after all rows |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mib = 1 / (1 << 20)
    for n, runs in results.items():
        lines.append(
            f"| {n:,} | {_spread([r['first_s'] for r in runs], 1000)} | {int(runs[0]['rows'])} | "
            f"{_spread([r['all_s'] for r in runs], 1000)} | {_spread([r['first_peak'] for r in runs], mib, 1)} | "
            f"{_spread([r['all_peak'] for r in runs], mib, 1)} | {_spread([r['held'] for r in runs], mib, 1)} |"
        )
    lines += [END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
