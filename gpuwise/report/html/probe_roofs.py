"""`gpuwise probe`: the machine's roofs as measured against its datasheet's: a roofline with
both and every timed matmul as a point; matmul FLOP/s by size per dtype against the spec
peak; bandwidths measured against spec. Takes the probe's JSON record (the saved profile)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.app.roofs import Roof
from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    SPEC_COLOUR,
    axis,
    caption,
    colour,
    layout,
    log_ticks,
    note,
    si,
)

ROOFLINE_DTYPES = ("fp32", "bf16")  # the rest are in the matmul figure: one plot stays readable
DTYPE_COLOURS = {"fp32": "#0072B2", "tf32": "#56B4E9", "bf16": "#E69F00", "fp16": "#CC79A7",
                 "fp8": "#009E73", "int8": "#D55E00"}
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def measured_roof(rec: Mapping[str, Any]) -> Roof | None:
    """The probe's roofs: triad bandwidth (read where no triad) and the best matmul per dtype."""
    bw = {r["kind"]: r["gbs"] for r in rec.get("bandwidth", []) if r.get("gbs")}
    gbs = bw.get("triad") or bw.get("read")
    peaks = {d: p["flops_per_s"] for d, p in (rec.get("matmul_best") or {}).items() if p}
    if not gbs or not peaks:
        return None
    return Roof("measured", f"probe of {rec.get('device')}", gbs * 1e9, peaks)


def _intensity(p: Mapping[str, Any]) -> float:
    size = DTYPE_BYTES.get(p["dtype"], 2)
    m, n, k = p["m"], p["n"], p["k"]
    return 2 * m * n * k / (size * (m * k + k * n + m * n))


def probe_roofline(rec: Mapping[str, Any], spec: Roof | None) -> Figure | None:
    """Measured and spec roofs for each dtype the probe timed, the matmuls as points."""
    measured = measured_roof(rec)
    if measured is None:
        return None
    points = [p for p in rec.get("matmul_points", []) if p.get("flops_per_s")]
    timed = [d for d in measured.peak_flops if any(p["dtype"] == d for p in points)]
    dtypes = [d for d in ROOFLINE_DTYPES if d in timed] or timed[:2]
    xs = [_intensity(p) for p in points]
    bws = [measured.bandwidth_bytes_per_s] + ([spec.bandwidth_bytes_per_s] if spec else [])
    peaks = list(measured.peak_flops.values()) + [spec.peak_flops.get(d, 0) for d in dtypes if spec]
    ridges = [pk / bw for pk in peaks if pk for bw in bws]
    x_lo, x_hi = min([*xs, *ridges, 1.0]) / 3, max([*xs, *ridges, 1.0]) * 3
    data: list[dict[str, Any]] = []
    for i, dtype in enumerate(dtypes):
        tint = DTYPE_COLOURS.get(dtype, colour(i))
        for roof in (spec, measured):
            peak = roof.peak_flops.get(dtype) if roof else None
            if not roof or not peak:
                continue
            data.append(_roof_line(roof, dtype, peak, x_lo, x_hi, tint))
        mine = [p for p in points if p["dtype"] == dtype]
        data.append({"type": "scatter", "mode": "markers", "name": f"{dtype} matmuls timed",
                     "x": [_intensity(p) for p in mine], "y": [p["flops_per_s"] for p in mine],
                     "marker": {"color": tint, "size": 8, "symbol": "circle-open", "line": {"width": 2}},
                     "text": [f"{p['m']}x{p['n']}x{p['k']} {dtype}: {si(p['flops_per_s'], 'FLOP/s')}" for p in mine],
                     "hovertemplate": "%{text}<extra></extra>"})
    ys = [p["flops_per_s"] for p in points] + [x_lo * bw for bw in bws] + [pk for pk in peaks if pk]
    against = ": measured (dashed) against spec (solid)" if spec else " as measured"
    y_lo, y_hi = min(ys) / 3, max(ys) * 3
    fig = {"data": data, "layout": layout(
        f"Roofline of {rec.get('device')}{against}", height=540,
        xaxis=axis("arithmetic intensity (FLOP per byte)", log=True,
                   range=[math.log10(x_lo), math.log10(x_hi)], **log_ticks([x_lo, x_hi])),
        yaxis=axis("FLOP/s", log=True, range=[math.log10(y_lo), math.log10(y_hi)],
                   **log_ticks([y_lo, y_hi], "FLOP/s")),
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "font": {"size": 11}},
        margin={"t": 95, "r": 30, "b": 60, "l": 80},
    )}
    said = f"spec from the catalogue entry {rec.get('spec_id')}" if spec else "no spec: device not in the catalogue"
    return Figure(fig, caption(f"Roofs of {' and '.join(dtypes)} as measured (bandwidth and the "
                               "best matmul) and from the datasheet, every matmul timed as a point",
                               f"measured by gpuwise probe; {said}"))


def _roof_line(roof: Roof, dtype: str, peak: float, x_lo: float, x_hi: float,
               tint: str) -> dict[str, Any]:
    bw = roof.bandwidth_bytes_per_s
    ridge = peak / bw
    xs = [x_lo, ridge, x_hi] if x_lo < ridge < x_hi else [x_lo, x_hi]
    spec = roof.source == "spec"
    return {"type": "scatter", "mode": "lines", "x": xs, "y": [min(x * bw, peak) for x in xs],
            "name": f"{dtype} {roof.source}: {si(peak, 'FLOP/s')}, {si(bw, 'B/s')}",
            "line": {"color": tint, "dash": "solid" if spec else "dash", "width": 2 if spec else 2.5},
            "opacity": 0.55 if spec else 1.0,
            "hovertemplate": f"{roof.label}: {dtype} {si(peak, 'FLOP/s')}, memory {si(bw, 'B/s')}<extra></extra>"}


def matmul_figure(rec: Mapping[str, Any], spec: Roof | None) -> Figure | None:
    """Square matmuls' FLOP/s against their size, per dtype; the spec peak dashed."""
    points = [p for p in rec.get("matmul_points", []) if p["m"] == p["n"] == p["k"] and p.get("flops_per_s")]
    if not points:
        return None
    dtypes = sorted({p["dtype"] for p in points}, key=lambda d: list(DTYPE_BYTES).index(d) if d in DTYPE_BYTES else 9)
    data, shapes = [], []
    for i, dtype in enumerate(dtypes):
        mine = sorted((p for p in points if p["dtype"] == dtype), key=lambda p: p["m"])
        data.append({"type": "scatter", "mode": "lines+markers", "name": dtype,
                     "x": [p["m"] for p in mine], "y": [p["flops_per_s"] for p in mine],
                     "line": {"color": DTYPE_COLOURS.get(dtype, colour(i))},
                     "marker": {"color": DTYPE_COLOURS.get(dtype, colour(i)), "size": 8},
                     "hovertemplate": "%{x}³: %{y:.3s}FLOP/s<extra>" + dtype + "</extra>"})
        peak = spec.peak_flops.get(dtype) if spec else None
        if peak:
            shapes.append({"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y",
                           "y0": peak, "y1": peak, "line": {"color": DTYPE_COLOURS.get(dtype, colour(i)),
                                                            "dash": "dash", "width": 1.5}})
    sizes = sorted({p["m"] for p in points})
    fig = {"data": data, "layout": layout(
        "Square matmul speed by size", xaxis=axis("n (an n x n by n x n matmul)", log=True, tickmode="array",
                                                  tickvals=sizes, ticktext=[str(s) for s in sizes]),
        yaxis=axis("FLOP/s (best of the repeats)", log=True, **log_ticks(
            [p["flops_per_s"] for p in points] + [s["y0"] for s in shapes], "FLOP/s")), shapes=shapes,
    )}
    return Figure(fig, caption("FLOP/s of square matmuls by size and dtype" + (
        "; each dtype's spec peak dashed" if shapes else ""), "measured by gpuwise probe"
        + ("; peaks spec (datasheet)" if shapes else "")))


def bandwidth_figure(rec: Mapping[str, Any], spec: Roof | None) -> Figure | None:
    """Each bandwidth measured (GB/s), with the spec memory bandwidth where known."""
    readings: Sequence[Mapping[str, Any]] = [r for r in [*rec.get("bandwidth", []), *rec.get("links", [])]
                                              if r.get("gbs")]
    if not readings:
        return None
    data = [{"type": "bar", "name": "measured", "x": [r["kind"] for r in readings],
             "y": [r["gbs"] for r in readings], "marker": {"color": MEASURED_COLOUR},
             "text": [f"{r['gbs']:,.0f}" + (f" ({r['fraction_of_spec']:.0%})" if r.get("fraction_of_spec") else "")
                      for r in readings], "textposition": "outside", "cliponaxis": False,
             "hovertemplate": "%{x}: %{y:,.1f} GB/s<extra></extra>"}]
    shapes = []
    if spec:
        gbs = spec.bandwidth_bytes_per_s / 1e9
        shapes.append({"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y",
                       "y0": gbs, "y1": gbs, "line": {"color": SPEC_COLOUR, "dash": "dash", "width": 2}})
    top = max([r["gbs"] for r in readings] + ([spec.bandwidth_bytes_per_s / 1e9] if spec else []))
    fig = {"data": data, "layout": layout(
        "Bandwidth", xaxis=axis("", type="category", showgrid=False),
        yaxis=axis("GB/s", range=[0, top * 1.2]), shapes=shapes, bargap=0.4, showlegend=False,
        annotations=[note(f"spec memory bandwidth {spec.bandwidth_bytes_per_s / 1e9:,.0f} GB/s",
                          1, spec.bandwidth_bytes_per_s / 1e9, xref="x domain", xanchor="right",
                          yanchor="bottom", font={"size": 11, "color": SPEC_COLOUR})] if spec else [],
    )}
    return Figure(fig, caption("Memory (read, copy, triad) and link bandwidths, with their share "
                               "of spec" + ("; spec memory bandwidth dashed" if spec else ""),
                               "measured by gpuwise probe" + ("; spec (datasheet)" if spec else "")))
