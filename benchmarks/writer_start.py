"""What starting the writer process costs in CPU (issue 25). Usage:

    python benchmarks/writer_start.py             # 20 interleaved pairs
    python benchmarks/writer_start.py --pairs 50  # steadier
    python benchmarks/writer_start.py --quick     # 3 pairs: proves it runs

A CPU run starts the writer process at its first window's hand-off, on cores training keeps busy, so
every millisecond of CPU the writer spends before its first answer is one training loses. Each
pair starts a real ``WriterProcess`` twice, in alternating order: as the product starts it
(``writer_command()``: ``python -I -S``, no ``site``) and with ``site`` (the same command without
``-S``, how it started before); each start is timed from launch to its first answer ("pong") and
closed. CPU is the writer's own user + system time (``RUSAGE_CHILDREN`` around the start and the
reap). Prints min / lower quartile / median / max per variant and the median of the paired
differences. Nothing is written.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vt_lightning.export import writer_process
from vt_lightning.export.writer_process import WriterProcess

WITHOUT_SITE = "without site (-S, the product)"
WITH_SITE = "with site (before)"
PRODUCT_COMMAND = writer_process.writer_command


def _with_site() -> list[str]:
    return [arg for arg in PRODUCT_COMMAND() if arg != "-S"]


def start_cpu_ms(command: Callable[[], list[str]]) -> float:
    """CPU milliseconds a writer process spends from launch to its first answer (then closed)."""
    writer_process.writer_command = command
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        writer = WriterProcess()
        try:
            assert writer.call("ping") == "pong"
        finally:
            writer.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        writer_process.writer_command = PRODUCT_COMMAND
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 pairs: proves the script runs")
    parser.add_argument("--no-write", action="store_true", help="accepted for the smoke test; nothing is written")
    args = parser.parse_args(argv)
    pairs = 3 if args.quick else args.pairs
    variants = {WITHOUT_SITE: PRODUCT_COMMAND, WITH_SITE: _with_site}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    start_cpu_ms(PRODUCT_COMMAND)  # warm the page cache and the .pyc files
    for i in range(pairs):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            cpu[name].append(start_cpu_ms(variants[name]))
    print(f"writer process start-up, CPU ms to its first answer ({pairs} interleaved pairs)")
    for name, values in cpu.items():
        ordered = sorted(values)
        print(
            f"  {name:32s} min {ordered[0]:6.1f}  q1 {ordered[len(ordered) // 4]:6.1f}  "
            f"median {statistics.median(ordered):6.1f}  max {ordered[-1]:6.1f}"
        )
    saved = [b - a for a, b in zip(cpu[WITHOUT_SITE], cpu[WITH_SITE])]
    print(f"  saved by -S, median of paired differences: {statistics.median(saved):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
