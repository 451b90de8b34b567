"""The memory panel on a window with 100,000 allocation events (issue 51). Usage:

    python benchmarks/memory_panel.py             # 100,000 vs 1,000 events, 15 rounds; updates docs/performance.md
    python benchmarks/memory_panel.py --quick     # 10,000 vs 1,000 events, 2 rounds
    python benchmarks/memory_panel.py --no-write  # print only

Two measures, each against a baseline in the same run, interleaved, order alternating per round:

* **writer**: ``analysis.summary_devices.memory_view`` (what the writer turns a window's ``[memory]``
  events into: the ``.memory_view.jsonc`` side file) on N synthetic CPU events spread over a real
  window's steps (an allocation/free random walk, seeded), against the same on 1,000 events; CPU time
  of the call, and the side file's size.
* **tab**: one real window (``tb_plugin.one_window``: a ``Trainer.fit`` with the callback) copied into
  two runs; the big run's side file is recomputed from the N-event walk, the small one keeps the
  window's own. A real TensorBoard on 127.0.0.1 and system Chromium (Playwright, ``executable_path``):
  the time from the click on a run to its memory panel's chart drawn (the panel names the run's event
  count and the chart's peak marker is in the page), measured in the page by ``performance.now()``,
  the next animation frame included.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]

from _common import quiet, write_block
from tb_plugin import SUMMARY, one_window

START = "<!-- memory-panel:start -->"
END = "<!-- memory-panel:end -->"
BASELINE = 1000
CHROMIUM = "/usr/bin/chromium"
VIEW = ".memory_view.jsonc"
# Clicks a run, then waits (each animation frame) for its panel to name `events` and draw the peak.
DRAW_MS = """async ([run, events]) => {
  const t0 = performance.now();
  document.querySelector(`.vt-run[data-run="${run}"]`).click();
  for (;;) {
    await new Promise((r) => requestAnimationFrame(r));
    const peak = document.querySelector('.vt-memory-peak');
    const drawn = document.querySelector('.vt-memory-chart .vt-peak');
    if (drawn && peak && peak.textContent.includes(`(${events} allocator events)`)) {
      return performance.now() - t0;
    }
    if (performance.now() - t0 > 60000) throw new Error(`no memory chart for ${run} within 60 s`);
  }
}"""


def memory_events(n: int, start_us: float, end_us: float, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` CPU ``[memory]`` instants evenly over [start, end]: allocations and frees of 4 KiB-8 MiB."""
    rng, live, total, out = random.Random(seed), [], 0, []
    for i in range(n):
        if live and (rng.random() < 0.5 or total > 256 << 20):
            size = -live.pop(rng.randrange(len(live)))
        else:
            size = rng.randrange(4096, 8 << 20)
            live.append(size)
        total += size
        args = {
            "Addr": 4096 * i,
            "Bytes": size,
            "Total Allocated": total,
            "Total Reserved": 0,
            "Device Type": 0,
            "Device Id": -1,
        }
        out.append(
            {"ph": "i", "name": "[memory]", "ts": start_us + (end_us - start_us) * i / n, "s": "t", "args": args}
        )
    return out


def writer_ms(events: list[dict[str, Any]], steps: dict[str, list[float]], memory: Any) -> tuple[float, int]:
    """(CPU ms of one ``memory_view`` call, bytes of the side file it gives)."""
    from vt_lightning.analysis.summary_devices import memory_view

    start = time.process_time()
    view = memory_view(events, steps, memory)
    return (time.process_time() - start) * 1000, len(orjson.dumps(view))


def build_runs(window: Path, logdir: Path, events: list[dict[str, Any]]) -> dict[str, int]:
    """Runs ``small`` (the window as written) and ``big`` (its view from ``events``); their event counts."""
    from vt_lightning.analysis.summary_devices import memory_view

    counts = {}
    for run in ("small", "big"):
        target = logdir / run / window.name
        shutil.copytree(window, target)
        (view_path,) = target.glob(f"*{VIEW}")
        if run == "big":
            summary = orjson.loads(next(target.glob(f"*{SUMMARY}")).read_bytes())
            view = memory_view(events, summary["steps"]["bounds_us"], summary["memory"])
            view_path.write_bytes(orjson.dumps(view))
        counts[run] = orjson.loads(view_path.read_bytes())["devices"]["cpu"]["events"]
    return counts


def tab_rounds(logdir: Path, counts: dict[str, int], rounds: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright
    from support import tbcheck

    times: dict[str, list[float]] = {run: [] for run in counts}
    with tbcheck.TensorBoardServer(logdir) as tb, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{tb.base_url}/#vt_lightning")
            deadline = time.monotonic() + 60
            frame = None
            while frame is None or not frame.query_selector(".vt-run"):
                assert time.monotonic() < deadline, "the tab listed no run within 60 s"
                page.wait_for_timeout(200)
                frame = next((f for f in page.frames if "plugin_entry.html?name=vt_lightning" in f.url), None)
            frame.evaluate(DRAW_MS, ["small", counts["small"]])  # warm: the module, the first fetches
            for r in range(rounds):
                for run in ("big", "small") if r % 2 == 0 else ("small", "big"):
                    times[run].append(frame.evaluate(DRAW_MS, [run, counts[run]]))
        finally:
            browser.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args(argv)
    quiet()
    big = args.events or (10_000 if args.quick else 100_000)
    rounds = args.rounds or (2 if args.quick else 15)
    tmp = Path(tempfile.mkdtemp(prefix="vt-bench-memory-"))
    try:
        (summary_path,) = one_window(tmp / "train").glob(f"*{SUMMARY}")
        summary = orjson.loads(summary_path.read_bytes())
        bounds = summary["steps"]["bounds_us"]
        span = min(b[0] for b in bounds.values()), max(b[1] for b in bounds.values())
        walks = {n: memory_events(n, *span) for n in (big, BASELINE)}
        writer: dict[int, list[tuple[float, int]]] = {n: [] for n in walks}
        for r in range(rounds):
            for n in (big, BASELINE) if r % 2 == 0 else (BASELINE, big):
                writer[n].append(writer_ms(walks[n], bounds, summary["memory"]))
        counts = build_runs(summary_path.parent, tmp / "logs", walks[big])
        tab = tab_rounds(tmp / "logs", counts, rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    block = render(writer, tab, counts, rounds, args.quick)
    print(block)
    if not args.no_write:
        write_block(Path(args.doc), START, END, block)
        print(f"wrote {args.doc}")
    return 0


def _spread(values: list[float], digits: int = 1) -> str:
    values = sorted(values)
    return f"{statistics.median(values):.{digits}f} ({values[0]:.{digits}f}–{values[-1]:.{digits}f})"


def render(
    writer: dict[int, list[tuple[float, int]]],
    tab: dict[str, list[float]],
    counts: dict[str, int],
    rounds: int,
    quick: bool,
) -> str:
    import torch

    big, base = writer
    ratio = [a[0] / b[0] for a, b in zip(writer[big], writer[base])]
    tab_ratio = [a / b for a, b in zip(tab["big"], tab["small"])]
    lines = [
        START,
        "## The memory panel on a window with 100,000 allocation events",
        "",
        f"`python benchmarks/memory_panel.py{' --quick' if quick else ''}` — median (min–max) over {rounds} rounds, "
        "the two sizes interleaved in alternating order; ratios are per round, against the baseline measured "
        "beside it. Writer: CPU ms of `summary_devices.memory_view` (the `.memory_view.jsonc` side file) on "
        "a seeded allocation/free walk of N CPU `[memory]` events over a real window's steps. Tab: a real "
        "TensorBoard on 127.0.0.1 and Chromium; ms from the click on a run to its memory chart drawn (the "
        "peak marker in the page, next animation frame), the big run's side file made from the N-event walk, "
        "the small run's the real window's own.",
        "",
        f"Python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} while measuring.",
        "",
        "| measure | baseline | N events | baseline ms | N events ms | ratio | side file bytes (N) |",
        "|---|---|---:|---:|---:|---:|---:|",
        f"| writer: memory view | {base:,} events | {big:,} | {_spread([w[0] for w in writer[base]])} | "
        f"{_spread([w[0] for w in writer[big]])} | {_spread(ratio, 2)} | {writer[big][0][1]:,} |",
        f"| tab: click to chart drawn | the real window ({counts['small']:,} events) | {counts['big']:,} | "
        f"{_spread(tab['small'])} | {_spread(tab['big'])} | {_spread(tab_ratio, 2)} | |",
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
