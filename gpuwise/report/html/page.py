"""One self-contained HTML page: sections of text, tables and plotly figures (docs/reports.md).

Renders only. Figures are plain plotly JSON (`{"data": [...], "layout": {...}}`), built by the
report modules without importing plotly; plotly's JavaScript is read from the installed `plotly`
package (the `html` extra) and inlined gzip-compressed and base64-encoded, so the page works
offline and stays small (plotly.min.js is 4.6-4.8 MB; compressed it is about 1.4 MB). The page
inflates it with the browser's DecompressionStream (Chromium 80+, Firefox 113+, Safari 16.4+).
The numbers the page shows travel with it as JSON in `<script id="gpuwise-data">`.

When every figure has drawn, `<body>` gets `data-plots-drawn="N"`; when something failed,
`data-plots-error` holds the message. The browser test waits on both.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from gpuwise.errors import GpuwiseError

__all__ = ["FIRST_LINE", "Figure", "Section", "is_report", "render_page"]

# The first line of every page: what `files.own_output` checks before replacing a file.
FIRST_LINE = "<!DOCTYPE html><!-- gpuwise report -->"


@dataclass(frozen=True)
class Figure:
    """A plotly figure as JSON and its one-line caption: what it shows and where the numbers
    came from (spec / measured / estimated)."""

    figure: dict[str, Any]
    caption: str


@dataclass(frozen=True)
class Section:
    """A heading, a paragraph, optional table rows (the first row is the header) and figures."""

    title: str
    text: str = ""
    figures: tuple[Figure, ...] = ()
    table: tuple[tuple[str, ...], ...] = ()
    verdict: str = ""  # a short line shown highlighted under the heading ("holds here", ...)
    notes: tuple[str, ...] = field(default=())


def is_report(first_line: bytes) -> bool:
    """Whether a file's first line says it is a gpuwise HTML report (so it may be replaced)."""
    return first_line.strip() == FIRST_LINE.encode()


def render_page(title: str, sections: list[Section] | tuple[Section, ...],
                data: dict[str, Any] | None = None, subtitle: str = "") -> bytes:
    """The whole page as UTF-8 bytes."""
    figures: list[dict[str, Any]] = []
    body = [_section_html(s, figures) for s in sections]
    parts = [
        FIRST_LINE,
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="subtitle">{html.escape(subtitle)}</p>' if subtitle else "",
        *body,
        _json_script("gpuwise-data", data or {}),
        _json_script("gpuwise-figures", figures, lambda _: None),
        f'<script id="gpuwise-plotly" type="text/plain">{_plotly_gzip_b64()}</script>',
        f"<script>{_LOADER}</script></body></html>",
    ]
    return "\n".join(p for p in parts if p).encode()


def _section_html(section: Section, figures: list[dict[str, Any]]) -> str:
    out = [f"<section><h2>{html.escape(section.title)}</h2>"]
    if section.verdict:
        out.append(f'<p class="verdict">{html.escape(section.verdict)}</p>')
    if section.text:
        out += [f"<p>{html.escape(p)}</p>" for p in section.text.split("\n\n")]
    if section.table:
        out.append(_table_html(section.table))
    for fig in section.figures:
        out.append(f'<figure><div class="plot" id="plot-{len(figures)}"></div>'
                   f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>")
        figures.append(fig.figure)
    out += [f'<p class="note">{html.escape(n)}</p>' for n in section.notes]
    out.append("</section>")
    return "\n".join(out)


def _table_html(rows: tuple[tuple[str, ...], ...]) -> str:
    """A table whose columns of figures are right-aligned and whose columns of words are not:
    a column is a figure column when every cell of it starts with a digit, a sign or a dot."""
    head, *rest = rows
    figures = [bool(rest) and all(_is_figure(row[i]) for row in rest if i < len(row))
               for i in range(len(head))]
    cells = "".join(f"<th{_num(figures, i)}>{html.escape(c)}</th>" for i, c in enumerate(head))
    lines = [f"<table><thead><tr>{cells}</tr></thead><tbody>"]
    for row in rest:
        lines.append("<tr>" + "".join(f"<td{_num(figures, i)}>{html.escape(c)}</td>"
                                      for i, c in enumerate(row)) + "</tr>")
    lines.append("</tbody></table>")
    return "".join(lines)


def _is_figure(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "+-.$~<>")


def _num(figures: list[bool], i: int) -> str:
    return ' class="num"' if i < len(figures) and figures[i] else ""


def _finite(value: Any, nonfinite: Callable[[float], Any]) -> Any:
    """`value` with every NaN and infinity replaced (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else nonfinite(value)
    if isinstance(value, dict):
        return {k: _finite(v, nonfinite) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, nonfinite) for v in value]
    return value


def _json_script(element_id: str, value: Any, nonfinite: Callable[[float], Any] = str) -> str:
    """JSON in a script element; NaN and infinity become `nonfinite(x)`: "inf" in the data
    (what it was), null (a gap) in the figures."""
    # "</" would end the script element early; JSON allows "<\/" for it
    text = json.dumps(_finite(value, nonfinite), allow_nan=False, default=str, separators=(",", ":"))
    text = text.replace("</", "<\\/")
    return f'<script id="{element_id}" type="application/json">{text}</script>'


@lru_cache(maxsize=1)
def _plotly_gzip_b64() -> str:
    try:
        js = resources.files("plotly").joinpath("package_data", "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise GpuwiseError("--html needs plotly, which is not installed",
                           "pip install 'gpuwise[html]'") from None
    return base64.b64encode(gzip.compress(js, compresslevel=9, mtime=0)).decode("ascii")


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.subtitle{color:#555;margin-top:0}.verdict{font-weight:600;background:#f3f6fa;padding:.4em .7em;
border-left:4px solid #36c}.note{color:#555;font-size:.92em}
figure{margin:1em 0 2em}.plot{width:100%;min-height:100px}figcaption{color:#444;font-size:.92em;margin-top:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left}th{background:#f6f6f6}
th.num,td.num{text-align:right}
"""

# Inflate plotly, run it, draw each figure; mark <body> when done (or why not).
_LOADER = """
(async () => {
  const body = document.body;
  try {
    const b64 = document.getElementById('gpuwise-plotly').textContent.trim();
    const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    const code = await new Response(stream).text();
    const script = document.createElement('script');
    script.textContent = code;
    document.head.appendChild(script);
    const figs = JSON.parse(document.getElementById('gpuwise-figures').textContent);
    for (let i = 0; i < figs.length; i++) {
      const layout = Object.assign({margin: {t: 40, r: 20, b: 60, l: 70}}, figs[i].layout || {});
      await Plotly.newPlot('plot-' + i, figs[i].data || [], layout,
                           {responsive: true, displaylogo: false});
    }
    body.dataset.plotsDrawn = String(figs.length);
  } catch (err) {
    body.dataset.plotsError = String(err);
    console.error(err);
  }
})();
"""
