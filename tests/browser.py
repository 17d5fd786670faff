"""An HTML report as a person sees it: opened in headless Chromium (Debian's `chromium`).

`render_in_chromium(html_path, screenshot_path)` opens the page once, waits for its figures
(the page marks `<body data-plots-drawn="N">`, or `data-plots-error`), and returns what drew:
per plot, the traces in its SVG and the marks they hold; the console errors the page raised
(recorded by a small script put at the top of a copy of the page, so nothing is missed
between loading and drawing); and the screenshot. `chromium_path()` finds the browser;
`.ci/run` installs it where it is missing.

Kept stable for every page gpuwise writes (`gpuwise/report/html/page.py`): other tests import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["BrowserResult", "PlotDrawn", "chromium_path", "render_in_chromium", "NO_CHROMIUM"]

NO_CHROMIUM = ("no Chromium found (chromium, chromium-browser, google-chrome or $GPUWISE_CHROMIUM): "
               "`apt-get install chromium` (.ci/run installs it)")
_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")
# Virtual time: the page's own timers and promises run to the end without waiting in real time.
VIRTUAL_TIME_MS = 20_000
WIDTH = 1280

# Put first in <head>: every error the page raises, kept on <html data-console-errors>.
_CAPTURE = """<script>(() => {
  const seen = [];
  const keep = (m) => { seen.push(String(m)); document.documentElement.dataset.consoleErrors =
                        JSON.stringify(seen); };
  const error = console.error.bind(console);
  console.error = (...a) => { keep(a.map(String).join(' ')); error(...a); };
  window.addEventListener('error', (e) => keep(e.message || ('failed to load ' +
    ((e.target && (e.target.src || e.target.href)) || 'a resource'))), true);
  window.addEventListener('unhandledrejection', (e) => keep('unhandled rejection: ' + e.reason));
})();</script>"""


@dataclass(frozen=True)
class PlotDrawn:
    """One figure as drawn: its element id, the traces in its SVG (plotly's `g.trace`), the
    marks those traces hold (paths with geometry: points, line segments, bars, boxes), and the
    size of its main SVG in pixels."""

    plot_id: str
    traces: int
    marks: int
    width: float
    height: float


@dataclass(frozen=True)
class BrowserResult:
    """What Chromium showed: `drawn` is `<body data-plots-drawn>` (None when it never drew),
    `error` is `data-plots-error`, `plots` in page order, `console_errors` the page's errors
    and uncaught exceptions, `screenshot` the PNG written (None when Chromium wrote none)."""

    drawn: int | None
    error: str | None
    plots: tuple[PlotDrawn, ...]
    console_errors: tuple[str, ...]
    screenshot: Path | None
    dom: str

    @property
    def traces(self) -> tuple[int, ...]:
        """The trace count of each plot, in page order."""
        return tuple(p.traces for p in self.plots)


def chromium_path() -> str | None:
    """The Chromium (or Chrome) binary to use, or None where there is none."""
    named = os.environ.get("GPUWISE_CHROMIUM")
    if named:
        return named if shutil.which(named) else None
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def render_in_chromium(html_path: str | os.PathLike[str], screenshot_path: str | os.PathLike[str],
                       *, height: int | None = None, timeout_s: float = 90.0) -> BrowserResult:
    """Open `html_path` in headless Chromium once: DOM after drawing, console errors and a
    screenshot (`WIDTH` wide; `height` by default from the page's figures and tables).
    Raises RuntimeError when there is no Chromium or it fails to run."""
    browser = chromium_path()
    if browser is None:
        raise RuntimeError(NO_CHROMIUM)
    page = Path(html_path).read_text(encoding="utf-8")
    shot = Path(screenshot_path)
    shot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuwise-chromium-") as work:
        copy = Path(work) / Path(html_path).name
        copy.write_text(_with_capture(page), encoding="utf-8")
        args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--no-first-run", "--disable-extensions", "--mute-audio",
                f"--user-data-dir={Path(work) / 'profile'}",  # one per run: runs in parallel
                f"--virtual-time-budget={VIRTUAL_TIME_MS}",
                f"--window-size={WIDTH},{height or _page_height(page)}",
                f"--screenshot={shot.resolve()}", "--dump-dom", copy.resolve().as_uri()]
        run = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, "LANG": "C.UTF-8"}, check=False)
    if run.returncode != 0 or "<html" not in run.stdout:
        raise RuntimeError(f"chromium exited {run.returncode}: {_tail(run.stderr)}")
    return _result(run.stdout, shot if shot.exists() and shot.stat().st_size else None)


def _with_capture(page: str) -> str:
    match = re.search(r"<head[^>]*>", page, flags=re.IGNORECASE)
    if match is None:
        return _CAPTURE + page
    return page[: match.end()] + _CAPTURE + page[match.end() :]


def _page_height(page: str) -> int:
    """A window tall enough for the whole page: its figures' own heights (from the figures'
    JSON where the page has it), table rows and paragraphs."""
    heights = [450] * page.count('class="plot"')
    found = re.search(r'<script id="gpuwise-figures" type="application/json">(.*?)</script>', page, re.S)
    if found:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            heights = [int((f.get("layout") or {}).get("height") or 450)
                       for f in json.loads(found.group(1))]
    rows = page.count("<tr>")
    paragraphs = page.count("<p") + page.count("<figcaption")
    return min(16_000, 600 + sum(h + 80 for h in heights) + 30 * rows + 60 * paragraphs)


def _tail(text: str, lines: int = 6) -> str:
    useful = [ln for ln in text.splitlines() if "dbus" not in ln.lower() and ln.strip()]
    return " | ".join(useful[-lines:]) or "no output"


def _result(dom: str, screenshot: Path | None) -> BrowserResult:
    parser = _PlotParser()
    parser.feed(dom)
    body = parser.body
    drawn = body.get("data-plots-drawn")
    errors = list(json.loads(parser.html.get("data-console-errors") or "[]"))
    return BrowserResult(
        drawn=int(drawn) if drawn and drawn.isdigit() else None,
        error=body.get("data-plots-error"),
        plots=tuple(parser.plots),
        console_errors=tuple(errors),
        screenshot=screenshot,
        dom=dom,
    )


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}


class _PlotParser(HTMLParser):
    """Walks the dumped DOM: `<html>` and `<body>` attributes, and inside each
    `<div class="plot" id=...>` the plotly traces, their marks and the main SVG's size."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.html: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.plots: list[PlotDrawn] = []
        self._depth = 0
        self._plot: dict[str, object] | None = None  # the plot being read
        self._plot_depth = 0
        self._trace_depths: list[int] = []  # depths of the g.trace elements we are inside

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "html":
            self.html = a
        elif tag == "body":
            self.body = a
        if tag in _VOID:
            self._element(tag, a, classes)
            return
        self._depth += 1
        if self._plot is None and tag == "div" and "plot" in classes and a.get("id"):
            self._plot = {"id": a["id"], "traces": 0, "marks": 0, "w": 0.0, "h": 0.0}
            self._plot_depth = self._depth
        self._element(tag, a, classes)
        if self._plot is not None and tag == "g" and "trace" in classes:
            self._trace_depths.append(self._depth)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self._element(tag, a, a.get("class", "").split())

    def _element(self, tag: str, a: dict[str, str], classes: list[str]) -> None:
        plot = self._plot
        if plot is None:
            return
        if tag == "g" and "trace" in classes:
            plot["traces"] = int(plot["traces"]) + 1  # type: ignore[call-overload]
        elif tag == "path" and self._trace_depths and len(a.get("d", "")) > 2:
            plot["marks"] = int(plot["marks"]) + 1  # type: ignore[call-overload]
        elif tag == "svg" and "main-svg" in classes and not plot["w"]:
            plot["w"] = _number(a.get("width", "0"))
            plot["h"] = _number(a.get("height", "0"))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self._trace_depths and self._trace_depths[-1] == self._depth:
            self._trace_depths.pop()
        if self._plot is not None and self._depth == self._plot_depth:
            p = self._plot
            self.plots.append(PlotDrawn(str(p["id"]), int(p["traces"]), int(p["marks"]),  # type: ignore[call-overload]
                                        float(p["w"]), float(p["h"])))  # type: ignore[arg-type]
            self._plot = None
        self._depth -= 1


def _number(text: str) -> float:
    try:
        return float(text.removesuffix("px"))
    except ValueError:
        return 0.0
