"""The roofline: a device's roofs (spec; measured where probed) and the plan's operations as
points (arithmetic intensity, achieved FLOP/s), coloured by phase. Log-log axes.

Takes the records `--json --ops` prints (report/records.py `ops_record`): an operation's
`flops` and `bytes` are its totals over `count` calls, `seconds` its estimated time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.app.roofs import Roof
from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    PHASE_COLOURS,
    SPEC_COLOUR,
    axis,
    caption,
    colour,
    layout,
    log_ticks,
    seconds_text,
    si,
)

ROOF_STYLE = {"spec": (SPEC_COLOUR, "solid"), "measured": (MEASURED_COLOUR, "dash")}


def plotted_ops(ops: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The operations a log-log plot can show: some arithmetic, some bytes, some time."""
    return [o for o in ops if o["flops"] > 0 and o["bytes"] > 0 and o["seconds"] > 0]


def roofline_figure(roofs: Sequence[Roof], phases: Mapping[str, Sequence[Mapping[str, Any]]],
                    dtype: str, device: str, time_source: str) -> Figure:
    """One roof line per roof (at `dtype`'s peak), one point trace per phase with operations.
    `time_source` says where the operations' times came from (the time record's `source`
    and `rates`)."""
    points = {name: plotted_ops(ops) for name, ops in phases.items()}
    points = {name: ops for name, ops in points.items() if ops}
    xs = [o["flops"] / o["bytes"] for ops in points.values() for o in ops]
    ys = [o["flops"] / o["seconds"] for ops in points.values() for o in ops]
    ridges = [peak_of(r, dtype) / r.bandwidth_bytes_per_s for r in roofs if peak_of(r, dtype)]
    x_lo = min([*xs, *ridges, 1.0]) / 4
    x_hi = max([*xs, *ridges, 1.0]) * 4
    data: list[dict[str, Any]] = [_roof_trace(r, dtype, x_lo, x_hi) for r in roofs if peak_of(r, dtype)]
    for i, (name, ops) in enumerate(points.items()):
        data.append(_ops_trace(name, ops, PHASE_COLOURS.get(name, colour(i))))
    roof_tops = [peak_of(r, dtype) for r in roofs if peak_of(r, dtype)]
    y_lo = min([*ys, *(x_lo * r.bandwidth_bytes_per_s for r in roofs)] or [1.0]) / 3
    y_hi = max([*ys, *roof_tops] or [1.0]) * 3
    fig = {
        "data": data,
        "layout": layout(
            f"Roofline of {device} ({dtype})", height=520,
            xaxis=axis("arithmetic intensity (FLOP per byte moved)", log=True,
                       range=[math.log10(x_lo), math.log10(x_hi)], **log_ticks([x_lo, x_hi])),
            yaxis=axis("achieved FLOP/s", log=True, range=[math.log10(y_lo), math.log10(y_hi)],
                       **log_ticks([y_lo, y_hi], "FLOP/s")),
        ),
    }
    sources = sorted({r.source for r in roofs})
    roofs_said = " and ".join(f"{s}" for s in sources) or "none known"
    count = sum(len(v) for v in points.values())
    skipped = sum(len(v) for v in phases.values()) - count
    what = (f"Roofline: roofs ({roofs_said}) for {dtype}; {count} operations of the plan as "
            f"points (FLOP/byte, FLOP/s achieved at their estimated time), sized by their share "
            f"of the phase's time" + (f"; {skipped} without arithmetic or bytes not shown" if skipped else ""))
    return Figure(fig, caption(what, f"roofs {roofs_said}; operation times estimated from {time_source}"))


def peak_of(roof: Roof, dtype: str) -> float:
    """The roof's FLOP/s at `dtype` (fp16 or fp32 where the dtype has none listed)."""
    return roof.peak_flops.get(dtype) or roof.peak_flops.get("fp16") or roof.peak_flops.get("fp32") or 0.0


def _roof_trace(roof: Roof, dtype: str, x_lo: float, x_hi: float) -> dict[str, Any]:
    peak, bw = peak_of(roof, dtype), roof.bandwidth_bytes_per_s
    ridge = peak / bw
    xs = [x_lo, ridge, x_hi] if x_lo < ridge < x_hi else [x_lo, x_hi]
    ys = [min(x * bw, peak) for x in xs]
    tint, dash = ROOF_STYLE.get(roof.source, (SPEC_COLOUR, "dot"))
    label = f"{roof.source} roof: {si(bw, 'B/s')}, {si(peak, 'FLOP/s')}"
    return {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": label,
            "line": {"color": tint, "dash": dash, "width": 2.5},
            "hovertemplate": f"{roof.label}<br>memory {si(bw, 'B/s')}, {dtype} peak "
                             f"{si(peak, 'FLOP/s')}<br>ridge at {ridge:.3g} FLOP/byte<extra></extra>"}


def _ops_trace(phase: str, ops: Sequence[Mapping[str, Any]], tint: str) -> dict[str, Any]:
    total = sum(o["seconds"] for o in ops) or 1.0
    sizes = [7 + 23 * math.sqrt(o["seconds"] / total) for o in ops]
    text = [f"<b>{o['op']}</b> ({phase}, {o.get('kind', '')}) x{o.get('count', 1)}<br>"
            f"time {seconds_text(o['seconds'])} ({o['seconds'] / total:.1%} of {phase})<br>"
            f"{si(o['flops'], 'FLOP')}, {si(o['bytes'], 'B')}<br>{o.get('bound', '')}-bound, "
            f"timed by {o.get('timed_by', 'roofline')}" for o in ops]
    return {"type": "scatter", "mode": "markers", "name": f"{phase} ops ({len(ops)})",
            "x": [o["flops"] / o["bytes"] for o in ops], "y": [o["flops"] / o["seconds"] for o in ops],
            "text": text, "hovertemplate": "%{text}<extra></extra>",
            "marker": {"size": sizes, "color": tint, "opacity": 0.75,
                       "line": {"color": "white", "width": 1}}}
