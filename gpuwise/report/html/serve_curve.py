"""Serving: the latency-throughput curve of `--sweep` with the targets (SLO) and the knee
(the highest rate meeting them); without a sweep, the latency percentiles of the one load
and the KV cache in use over the simulated time. Takes `gpuwise serve --json`'s record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    axis,
    caption,
    colour,
    finite,
    layout,
    legend_entry,
    log_position,
    log_ticks,
    note,
)

LATENCIES = (("ttft_s", "time to first token"), ("tpot_s", "time per output token"),
             ("itl_s", "inter-token latency"), ("e2e_s", "end to end"))
PERCENTILES = ("p50", "p90", "p99")


def sweep_figure(rec: Mapping[str, Any]) -> Figure:
    """Three panels over the offered rate: TTFT, TPOT (p50 and p90, log ms, each with its
    target), and output tokens/s; the knee and the saturation ceiling as vertical lines."""
    curve = rec["curve"]
    rates = [p["rate"] for p in curve]
    data: list[dict[str, Any]] = []
    for row, (key, label) in enumerate((("ttft_s", "TTFT"), ("tpot_s", "TPOT")), start=1):
        for pct in ("p50", "p90"):
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"{label} {pct}",
                         "x": rates, "y": finite([p[key][pct] * 1e3 for p in curve]),
                         "xaxis": "x", "yaxis": f"y{row if row > 1 else ''}",
                         "line": {"color": colour(row - 1), "dash": "solid" if pct == "p90" else "dot"},
                         "marker": {"size": 6, "color": colour(row - 1)},
                         "hovertemplate": f"%{{x:.3g}} req/s: {label} {pct} %{{y:.4g}} ms<extra></extra>"})
    data.append({"type": "scatter", "mode": "lines+markers", "name": "output tokens/s",
                 "x": rates, "y": finite([p["output_tokens_per_s"] for p in curve]),
                 "xaxis": "x", "yaxis": "y3", "line": {"color": colour(2)},
                 "marker": {"size": [11 if p["saturated"] else 6 for p in curve], "color": colour(2),
                            "symbol": ["x" if p["saturated"] else "circle" for p in curve]},
                 "text": ["saturated" if p["saturated"] else "" for p in curve],
                 "hovertemplate": "%{x:.3g} req/s: %{y:,.0f} output tokens/s %{text}<extra></extra>"})
    shapes, annotations = _targets(rec)
    knee = rec.get("max_rate_meeting_slo")
    ceiling = rec.get("rate_ceiling")
    for x, text, dash in ((knee, "knee", "dash"), (ceiling, "ceiling (saturates)", "dot")):
        if x:
            line = {"color": "#333", "dash": dash, "width": 1.5}
            shapes.append({"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper",
                           "y0": 0, "y1": 1, "line": line})
            data.append(legend_entry(f"{text}: {x:.3g} req/s", line=line))
    fig = {"data": data, "layout": layout(
        "Latency and throughput against the offered load (--sweep)", height=760,
        grid={"rows": 3, "columns": 1, "pattern": "coupled", "roworder": "top to bottom"},
        xaxis=axis("offered load (requests/s, Poisson)"),
        yaxis=axis("TTFT (ms)", log=True, **log_ticks(_ms(rec, "ttft_s"))),
        yaxis2=axis("TPOT (ms)", log=True, **log_ticks(_ms(rec, "tpot_s"))),
        yaxis3=axis("output tokens/s", rangemode="tozero"),
        shapes=shapes, annotations=annotations, margin={"t": 60, "r": 30, "b": 60, "l": 80},
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top",
                "traceorder": "normal"},
    )}
    att = rec.get("attainment", 0.9)
    what = (f"Latency (p50 dotted, p90 solid; log scale) and throughput at each offered rate of "
            f"the sweep; targets dashed red; knee: the highest rate where {att:.0%} of requests meet them")
    return Figure(fig, caption(what, _source(rec)))


def _ms(rec: Mapping[str, Any], key: str) -> list[float]:
    """The sweep's p50 and p90 of one latency and its target, in ms: what its axis spans."""
    values = [p[key][pct] * 1e3 for p in rec["curve"] for pct in ("p50", "p90")]
    target = (rec.get("slo") or {}).get(key)
    return values + ([target * 1e3] if target else [])


def _targets(rec: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shapes, annotations = [], []
    slo = rec.get("slo") or {}
    for row, key in ((1, "ttft_s"), (2, "tpot_s")):
        target = slo.get(key)
        if target:
            yref = f"y{row if row > 1 else ''}"
            shapes.append({"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": yref,
                           "y0": target * 1e3, "y1": target * 1e3,
                           "line": {"color": MEASURED_COLOUR, "dash": "dash", "width": 2}})
            annotations.append(note(f"target {target * 1e3:g} ms", 0, log_position(target * 1e3),
                                    xref="x domain", yref=yref, xanchor="left", yanchor="bottom",
                                    font={"size": 11, "color": MEASURED_COLOUR}))
    return shapes, annotations


def percentiles_figure(rec: Mapping[str, Any]) -> Figure:
    """Grouped bars: p50, p90, p99 of each latency (log ms), the targets marked."""
    data = []
    for j, pct in enumerate(PERCENTILES):
        data.append({"type": "bar", "name": pct, "x": [label for _, label in LATENCIES],
                     "y": finite([rec[key][pct] * 1e3 for key, _ in LATENCIES]),
                     "marker": {"color": colour(j)},
                     "hovertemplate": f"%{{x}} {pct}: %{{y:.4g}} ms<extra></extra>"})
    shapes, annotations = [], []
    slo = rec.get("slo") or {}
    for i, (key, _) in enumerate(LATENCIES[:2]):
        target = slo.get(key)
        if target:
            shapes.append({"type": "line", "xref": "x", "x0": i - 0.45, "x1": i + 0.45,
                           "yref": "y", "y0": target * 1e3, "y1": target * 1e3,
                           "line": {"color": MEASURED_COLOUR, "dash": "dash", "width": 2.5}})
            annotations.append(note(f"target {target * 1e3:g} ms", i, log_position(target * 1e3),
                                    yanchor="bottom", font={"size": 11, "color": MEASURED_COLOUR}))
    load = rec["load"]
    what_load = (f"{load['rate']:g} requests/s" if load.get("rate") else
                 f"{load['concurrency']} clients" if load.get("concurrency") else "the trace")
    fig = {"data": data, "layout": layout(
        f"Latency percentiles at {what_load} ({rec['requests']:,} requests)", barmode="group",
        xaxis=axis("", type="category", showgrid=False),
        yaxis=axis("ms (log scale)", log=True, **log_ticks(
            [rec[key][pct] * 1e3 for key, _ in LATENCIES for pct in PERCENTILES]
            + [v * 1e3 for v in slo.values() if v])),
        shapes=shapes, annotations=annotations,
    )}
    return Figure(fig, caption(f"Latency percentiles of the simulated load ({what_load}); targets "
                               "dashed where given", _source(rec)))


def kv_figure(rec: Mapping[str, Any]) -> Figure | None:
    """The share of the KV cache in use over the simulated time."""
    timeline = rec.get("kv_timeline") or []
    if not timeline:
        return None
    data = [{"type": "scatter", "mode": "lines", "name": "KV cache in use",
             "x": [t for t, _ in timeline], "y": [100 * f for _, f in timeline],
             "line": {"color": colour(4), "width": 2}, "fill": "tozeroy",
             "hovertemplate": "t %{x:.2f} s: %{y:.1f}% in use<extra></extra>"}]
    peak = 100 * rec.get("kv_peak_fraction", 0.0)
    fig = {"data": data, "layout": layout(
        f"KV cache in use (peak {peak:.1f}%, {rec.get('preemptions', 0):,} preemptions)",
        showlegend=False, xaxis=axis("simulated time (s)"),
        yaxis=axis("% of the KV cache", range=[0, max(5.0, min(100.0, peak * 1.25))]),
    )}
    return Figure(fig, caption("Share of the KV cache blocks in use at each scheduler step of "
                               "the simulation", _source(rec)))


def _source(rec: Mapping[str, Any]) -> str:
    return (f"{rec.get('source_kind', 'estimated')}: {rec.get('runtime')}'s scheduler simulated, "
            f"steps timed from {rec.get('rates')}")
