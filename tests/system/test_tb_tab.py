"""The ``vt_lightning`` tab in a real browser: Chromium from the system's packages driven by
Playwright (never a downloaded browser), against a real TensorBoard server on 127.0.0.1, over the
files of one real Trainer run with a seeded slow ``Dataset.__getitem__``. One run, one server and
one browser for the module.

``VT_SCREENSHOTS=1`` saves the tab as docs/img/tb_vt_lightning.png (docs/viewing.md shows it)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import recorded_name
from support import tab_run, tbcheck
from support.paths import REPO
from support.tab_run import input_bound_run

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
SCREENSHOT = REPO / "docs" / "img" / "tb_vt_lightning.png"
WAIT_S = 60.0


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
def served(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[tuple[tbcheck.TensorBoardServer, Path]]:
    root = tmp_path_factory.mktemp("tb_tab")
    input_bound_run(root)
    with tbcheck.TensorBoardServer(root) as tb:
        yield tb, root


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


def test_the_tab_lists_the_windows_and_shows_input_bound_at_the_users_line(browser: Any, served: Any) -> None:
    tb, root = served
    session = Session(browser)
    try:
        page, frame = _tab(session, tb)
        windows = frame.inner_text("#vt-windows")
        assert "window_000-batches_2-4" in windows and "window_001-batches_7-9" in windows
        assert windows.count("input_bound") == 2 and windows.count("complete") == 2
        verdicts = frame.inner_text("#vt-verdicts")
        assert "input_bound" in verdicts
        place = frame.inner_text("#vt-verdicts .vt-place")
        line = tab_run.getitem_line()
        assert place == f"{recorded_name('SlowRows.__getitem__')} at {tab_run.SOURCE}:{line}"
        shown = frame.inner_text("#vt-verdicts .vt-hit").strip()
        assert shown == f"{line}      def __getitem__(self, index: int) -> torch.Tensor:"  # the source line
        assert frame.query_selector_all("#vt-breakdown .vt-seg"), "the breakdown bar"
        frame.click("rect[data-window='window_001-batches_7-9']")  # the whole-run strip opens a window
        frame.wait_for_selector("#vt-window-title:has-text('window_001-batches_7-9')", timeout=WAIT_S * 1000)
        (run,) = {w.parent.relative_to(root).as_posix() for w in root.rglob("window_000-batches_2-4")}
        frame.fill("#vt-diff-a", f"{run}/window_000-batches_2-4")
        frame.fill("#vt-diff-b", f"{run}/window_001-batches_7-9")
        frame.click("#vt-diff-go")
        frame.wait_for_selector("#vt-diff-out table", timeout=WAIT_S * 1000)
        diff = frame.inner_text("#vt-diff-out")
        assert "A: 1 window(s), B: 1 window(s). Step:" in diff and "data_wait" in diff
        if os.environ.get("VT_SCREENSHOTS"):
            frame.click("rect[data-window='window_000-batches_2-4']")
            frame.wait_for_selector("#vt-window-title:has-text('window_000-batches_2-4')", timeout=WAIT_S * 1000)
            frame.wait_for_selector("#vt-verdicts .vt-hit", timeout=WAIT_S * 1000)
            page.mouse.move(1300, 1000)  # no bar of the strip under the pointer (hover dims it)
            page.screenshot(path=str(SCREENSHOT))
        # torch-tb-profiler loads its runs on a background thread: poll until it has read them
        assert tb.wait_for_runs(1, timeout=WAIT_S), "torch-tb-profiler's tab still lists the windows beside ours"
    finally:
        session.context.close()
    assert session.off_host() == ([], [])


def test_open_in_perfetto_loads_the_trace_from_the_tensorboard_host(browser: Any, served: Any) -> None:
    tb, root = served
    session = Session(browser)
    try:
        _, frame = _tab(session, tb)
        button = frame.query_selector(".vt-perfetto")
        path = button.get_attribute("data-path")
        trace = root / path
        assert f"({trace.stat().st_size / 1024:.1f} KB on disk" in frame.inner_text(".vt-trace")  # the size, first
        with session.context.expect_page() as opened:
            button.click()
        perfetto = opened.value
        deadline = time.monotonic() + WAIT_S
        while trace.name not in perfetto.title() and time.monotonic() < deadline:
            perfetto.wait_for_timeout(250)
        assert trace.name in perfetto.title(), perfetto.title()  # Perfetto loaded it: its title names it
        assert urlsplit(perfetto.url).netloc == urlsplit(tb.base_url).netloc
        fetched = [u for u in session.sent if u.endswith("/data/plugin/vt_lightning/file/" + path)]
        assert fetched and all(u.startswith(tb.base_url) for u in fetched)
    finally:
        session.context.close()
    assert session.off_host() == ([], [])


def test_a_new_window_shows_on_reload_without_a_restart_and_a_huge_trace_is_announced(
    browser: Any, served: Any
) -> None:
    """A window added while TensorBoard runs is listed on the next load; a trace past what a browser
    loads (its gzip trailer says 400 MB of JSON) is announced with what to do instead."""
    tb, root = served
    (run_dir,) = {p.parent for p in root.rglob("window_000-batches_2-4")}
    new = run_dir / "window_005-slow_step-batches_12-14"
    shutil.copytree(run_dir / "window_001-batches_7-9", new)
    (trace,) = new.glob("*.pt.trace.json.gz")
    data = trace.read_bytes()
    trace.write_bytes(data[:-4] + (400 << 20).to_bytes(4, "little"))
    session = Session(browser)
    try:
        _, frame = _tab(session, tb)
        assert "window_005-slow_step-batches_12-14" in frame.inner_text("#vt-windows")
        frame.click("tr[data-window='window_005-slow_step-batches_12-14']")
        frame.wait_for_selector("#vt-window-title:has-text('slow_step')", timeout=WAIT_S * 1000)
        warning = frame.inner_text(".vt-too-big")
        assert "more than a browser loads" in warning and f"vt-lightning view {root}" in warning
        assert "400.0 MB of JSON to load" in frame.inner_text(".vt-trace")
    finally:
        shutil.rmtree(new)
        session.context.close()
