"""What every figure shares: colours, axes, number formats and the one-line caption.

Figures are plain plotly JSON (no plotly import): `{"data": [...], "layout": {...}}`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

GIB = 2**30

# Colour-blind-safe (Okabe-Ito), then a few more for long lists.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000", "#999999", "#882255", "#44AA99", "#117733")
PHASE_COLOURS = {"prefill": "#0072B2", "decode": "#E69F00", "forward": "#0072B2",
                 "backward": "#D55E00", "optimizer": "#009E73"}
SPEC_COLOUR = "#555555"
MEASURED_COLOUR = "#D55E00"
TIGHT_COLOUR = "rgba(230,159,0,0.18)"
OVER_COLOUR = "rgba(213,94,0,0.10)"

# Provenance words the JSON uses, as a caption says them.
PROVENANCE = {"spec": "spec (datasheet)", "measured": "measured (this machine's probe)",
              "estimated": "estimated", "detected": "spec"}


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def caption(what: str, source: str) -> str:
    """The one line under a figure: what it shows; where its numbers came from."""
    text = f"{what.rstrip('.')}. Source: {source.rstrip('.')}."
    return " ".join(text.split())  # one line, whatever the parts held


def layout(title: str = "", height: int = 440, **extra: Any) -> dict[str, Any]:
    """A white layout with the legend above the plot (never over the data)."""
    base: dict[str, Any] = {
        "height": height, "paper_bgcolor": "white", "plot_bgcolor": "white",
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 13},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
                   "traceorder": "normal"},
        "margin": {"t": 70, "r": 30, "b": 60, "l": 80}, "hovermode": "closest",
    }
    if title:
        base["title"] = {"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}}
        base["margin"]["t"] = 95
        base["legend"]["y"] = 1.02
    base.update(extra)
    return base


def axis(title: str, log: bool = False, **extra: Any) -> dict[str, Any]:
    ax: dict[str, Any] = {"title": {"text": title}, "showgrid": True, "gridcolor": "#e6e6e6",
                          "zeroline": False, "linecolor": "#888", "showline": True,
                          "ticks": "outside", "automargin": True}
    if log:
        ax.update(type="log", exponentformat="SI", dtick=1, minor={"showgrid": False})
    ax.update(extra)
    return ax


def log_ticks(values: Iterable[float | None], unit: str | None = None) -> dict[str, Any]:
    """On a log axis spanning three decades or less, ticks at 1, 2, 5 x 10^k across the
    values, labelled in full (the decades alone leave one or two labels; plotly's own minor
    labels are bare digits); nothing (the decades) on a wider one. `unit`: labels with SI
    prefixes ("20 MFLOP/s") instead of plain numbers."""
    got = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not got:
        return {}
    lo, hi = math.floor(math.log10(min(got))), math.ceil(math.log10(max(got)))
    if hi - lo > 3:
        return {}
    ticks = [m * 10.0**e for e in range(lo, hi + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if min(got) / 2.5 <= t <= max(got) * 2.5]
    text = [si(t, unit) if unit is not None else f"{t:,.6g}" for t in ticks]
    return {"tickmode": "array", "tickvals": ticks, "ticktext": text}


def finite(values: Sequence[float | None]) -> list[float | None]:
    """JSON has no NaN or infinity: those become gaps (None)."""
    return [v if v is not None and math.isfinite(v) else None for v in values]


def gb(n: float) -> float:
    """Bytes as GiB, rounded for the page (the exact bytes are in the page's JSON)."""
    return round(n / GIB, 4)


def seconds_text(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "NA"
    if s >= 1:
        return f"{s:,.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e9:.3g} ns"


def si(value: float | None, unit: str = "") -> str:
    """1.2e12 -> '1.2 T' + unit."""
    if value is None or not math.isfinite(value):
        return "NA"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def hline(y: float, colour_: str, dash: str = "dash", xref: str = "paper", yref: str = "y",
          width: float = 1.5) -> dict[str, Any]:
    return {"type": "line", "xref": xref, "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
            "line": {"color": colour_, "dash": dash, "width": width}}


def vline(x: float, colour_: str, dash: str = "dash", yref: str = "paper", xref: str = "x",
          width: float = 1.5) -> dict[str, Any]:
    return {"type": "line", "yref": yref, "y0": 0, "y1": 1, "xref": xref, "x0": x, "x1": x,
            "line": {"color": colour_, "dash": dash, "width": width}}


def legend_entry(name: str, line: dict[str, Any] | None = None,
                 marker: dict[str, Any] | None = None) -> dict[str, Any]:
    """A trace that draws nothing and names, in the legend, a line or a zone drawn as a shape
    (so that no label is written over the data)."""
    trace: dict[str, Any] = {"type": "scatter", "x": [None], "y": [None], "name": name,
                             "hoverinfo": "skip", "mode": "lines" if line else "markers"}
    if line:
        trace["line"] = line
    if marker:
        trace["marker"] = marker
    return trace


def log_position(value: float) -> float:
    """Where an annotation goes on a log axis: plotly takes annotations there as log10."""
    return math.log10(value) if value > 0 else 0.0


def note(text: str, x: float, y: float, xref: str = "x", yref: str = "y", **extra: Any) -> dict[str, Any]:
    ann = {"text": text, "x": x, "y": y, "xref": xref, "yref": yref, "showarrow": False,
           "font": {"size": 12, "color": "#333"}, "bgcolor": "rgba(255,255,255,0.8)"}
    ann.update(extra)
    return ann
