"""Our trace files in the REAL TensorBoard PyTorch Profiler plugin (torch-tb-profiler 0.4.3): a real
Lightning run in process (tests/support/plugin_run.py); every window's file goes through the
plugin's own parser and run generator (tests/support/tbcheck.py) and offers Overview, Operator,
Trace and Memory, with Python calls (cat FEE) and torch ops (cat cpu_op) on one thread."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import tbcheck
from support.plugin_run import EXPECTED_WINDOWS, REQUIRED_VIEWS, check_trace_content, train_tiny


# --------------------------------------------------------------------------- in-process parsing
@pytest.fixture(scope="module")
def trained_root(tmp_path_factory) -> Path:
    """One in-process training run shared by the in-process tests of this module."""
    root = tmp_path_factory.mktemp("tb_inproc")
    train_tiny(root)
    return root


def test_traces_parse_in_plugin(trained_root):
    files = tbcheck.trace_files(trained_root)
    assert len(files) == EXPECTED_WINDOWS, f"expected {EXPECTED_WINDOWS} window traces, found {files}"
    assert len({f.parent for f in files}) == len(files), "each window must be a run directory of its own"
    leftovers = [p for p in trained_root.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left behind: {leftovers}"

    for path in files:
        where = str(path.relative_to(trained_root))
        trace = tbcheck.load_json(path)
        assert tbcheck.contract_problems(trace) == [], where

        profile = tbcheck.parse_trace(path)  # raises with the plugin's log lines if it rejects the file
        offered = set(tbcheck.views(profile))
        assert offered >= REQUIRED_VIEWS, f"{where}: plugin offers {sorted(offered)}"
        tbcheck.exercise_views(profile)  # what the HTTP routes compute, for each offered view

        run = tbcheck.load_run_dir(path.parent)  # the whole run directory, as the loader sees it
        assert run.workers == [profile.worker] and run.get_spans(profile.worker) == ["1"], where
        assert {v.display_name for v in run.views} >= REQUIRED_VIEWS, where

        check_trace_content(trace, where)


def test_trace_files_readable_like_the_other_logs(trained_root):
    """TensorBoard often runs as another user (shared server): our files must get the same
    permission bits as the event files Lightning writes next to them (i.e. respect the umask)."""
    events = sorted(trained_root.rglob("events.out.tfevents.*"))
    assert events, "Lightning wrote no TensorBoard event file to compare with"
    reference = events[0].stat().st_mode & 0o777
    for path in tbcheck.trace_files(trained_root):
        mode = path.stat().st_mode & 0o777
        assert mode == reference, (
            f"{path.name} has mode {mode:o}, Lightning's {events[0].name} has {reference:o}: "
            "a TensorBoard server running as another user cannot read it"
        )
