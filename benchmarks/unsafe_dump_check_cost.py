"""The cost of ``viztracer_layout.unsafe_name_in_buffer`` (run before every VizTracer dump made in the
training process) against VizTracer's own C ``dump`` of the same full buffer, 7 rounds interleaved:
2,000 distinct functions, each call with two C calls. Not a test; prints one line.

    python benchmarks/unsafe_dump_check_cost.py [tracer_entries, default 200000]
"""

import os
import statistics
import sys
import tempfile
import time

from viztracer import VizTracer

from vt_lightning.recording.viztracer_layout import unsafe_name_in_buffer

ENTRIES = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
ns = {}
exec("\n".join(f"def f{i}(x):\n    return len(str(x))" for i in range(2000)), ns)
funcs = [ns[f"f{i}"] for i in range(2000)]
viz = VizTracer(verbose=0, register_global=False, tracer_entries=ENTRIES)
check, dump = [], []
path = os.path.join(tempfile.mkdtemp(), "d.json")
for _round in range(7):
    viz.start()
    for i in range(ENTRIES // 3):  # each: a Python call + 2 C calls (len, str)
        funcs[i % 2000](i)
    viz.stop()
    t0 = time.perf_counter()
    found = unsafe_name_in_buffer(viz, ENTRIES)
    t1 = time.perf_counter()
    viz.dump(path)
    t2 = time.perf_counter()
    viz.clear()
    assert found is None
    check.append((t1 - t0) * 1e3)
    dump.append((t2 - t1) * 1e3)
ratio = [c / d for c, d in zip(check, dump)]
print(
    f"py{sys.version_info[0]}.{sys.version_info[1]} entries={ENTRIES} check ms median {statistics.median(check):.1f} "
    f"(min {min(check):.1f} max {max(check):.1f}); dump ms median {statistics.median(dump):.1f} "
    f"(min {min(dump):.1f} max {max(dump):.1f}); check/dump median {statistics.median(ratio):.3f} "
    f"(min {min(ratio):.3f} max {max(ratio):.3f})"
)
