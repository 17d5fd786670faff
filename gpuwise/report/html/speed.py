"""Speed: throughput and latency against batch (two y axes over a log2 batch axis), and, for
`check`, the decode time per token of each weight precision with its 80% interval."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import axis, caption, colour, finite, layout, vline


def batch_figure(points: Sequence[Mapping[str, Any]], rate_key: str, rate_label: str,
                 latency_key: str, latency_label: str, title: str, what: str, source: str,
                 plan_batch: int | None = None) -> Figure:
    """Throughput (left axis) and latency in ms (right axis) at each batch of `points`."""
    batches = [p["batch"] for p in points]
    data = [
        {"type": "scatter", "mode": "lines+markers", "name": rate_label, "x": batches,
         "y": finite([p[rate_key] for p in points]), "marker": {"color": colour(0), "size": 8},
         "line": {"color": colour(0), "width": 2.5},
         "hovertemplate": "batch %{x}: %{y:,.4g} " + rate_label + "<extra></extra>"},
        {"type": "scatter", "mode": "lines+markers", "name": latency_label, "x": batches,
         "y": finite([p[latency_key] * 1e3 for p in points]), "yaxis": "y2",
         "marker": {"color": colour(1), "size": 8, "symbol": "diamond"},
         "line": {"color": colour(1), "width": 2.5, "dash": "dot"},
         "hovertemplate": "batch %{x}: %{y:,.4g} ms<extra></extra>"},
    ]
    shapes = [vline(plan_batch, "#888", "dot")] if plan_batch is not None and plan_batch in batches else []
    fig = {"data": data, "layout": layout(
        title, xaxis=axis("batch (sequences)", log=True, tickmode="array",
                          tickvals=batches, ticktext=[str(b) for b in batches]),
        yaxis=axis(rate_label, rangemode="tozero", color=colour(0)),
        yaxis2=axis(latency_label + " (ms)", overlaying="y", side="right", rangemode="tozero",
                    showgrid=False, color=colour(1), tickmode="auto", nticks=8),
        shapes=shapes, margin={"t": 95, "r": 90, "b": 60, "l": 80},
    )}
    return Figure(fig, caption(what, source))


def decode_precision_figure(rows: Sequence[Mapping[str, Any]], device: str, runtime: str,
                            source: str) -> Figure | None:
    """Decode ms per token of each precision `check` could time, with its 80% interval."""
    timed = [r for r in rows if "s_per_token" in r.get("decode", {})]
    if not timed:
        return None
    ms = [r["decode"]["s_per_token"] * 1e3 for r in timed]
    high = [((r["decode"].get("high") or r["decode"]["s_per_token"]) * 1e3) - m for r, m in zip(timed, ms, strict=True)]
    low = [m - ((r["decode"].get("low") or r["decode"]["s_per_token"]) * 1e3) for r, m in zip(timed, ms, strict=True)]
    labels = [f"{r['weights']}<br>{m:.3g} ms" for r, m in zip(timed, ms, strict=True)]
    data = [{"type": "bar", "name": "decode ms per token", "x": labels,
             "y": ms, "marker": {"color": [colour(0) if r["fits"] else "#bbbbbb" for r in timed]},
             "error_y": {"type": "data", "symmetric": False, "array": high, "arrayminus": low,
                         "color": "#333", "thickness": 1.5, "width": 6},
             "hovertemplate": "%{x}: %{y:.4g} ms per token<extra></extra>"}]
    fig = {"data": data, "layout": layout(
        f"Decode time per token on {device} ({runtime})", showlegend=False,
        xaxis=axis("weight precision", type="category", showgrid=False), bargap=0.45,
        yaxis=axis("ms per generated token", rangemode="tozero"),
    )}
    return Figure(fig, caption("Decode time per token by weight precision, bars with the 80% "
                               "interval; grey: does not fit", source))
