"""`gpuwise advise` and `gpuwise cost`: $/month and $/million tokens per option (bars by
purchase mode), and buy-vs-rent: the share of the month's hours the workload holds each
device against the break-even share above which owning costs less than renting on demand.
Takes the option records of `--json` (report/cost_view.py `option_record`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import MEASURED_COLOUR, axis, caption, colour, layout, note
from gpuwise.units import HOURS_PER_MONTH

MODES = ("owned", "reserved", "on-demand", "api")
SOURCE = ("estimated: the time model sizes each option (speed from {rates} rates), "
          "catalogue prices and the cost assumptions price it")


def _rates(options: Sequence[Mapping[str, Any]]) -> str:
    found = sorted({str(o.get("rates_source")) for o in options if o.get("rates_source")})
    return "/".join(found) or "spec"


def options_figure(options: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Two panels sharing the options as rows: $/month and $/million tokens, one trace per
    purchase mode and panel; options that miss the target are pale."""
    labels = [o["option"] for o in options]
    data = []
    for i, mode in enumerate(m for m in MODES if any(o["mode"] == m for o in options)):
        mine = [o for o in options if o["mode"] == mode]
        tint = colour(i)
        for col, key, unit in ((1, "usd_per_month", "$/month"), (2, "usd_per_million_tokens", "$/Mtok")):
            data.append({
                "type": "bar", "orientation": "h", "name": mode, "legendgroup": mode,
                "showlegend": col == 1, "y": [o["option"] for o in mine],
                "x": [o[key] if o[key] is not None and math.isfinite(o[key]) else None for o in mine],
                "xaxis": "x" if col == 1 else "x2", "yaxis": "y",
                "marker": {"color": tint, "opacity": [1.0 if o["meets_target"] else 0.35 for o in mine]},
                "text": [_money(o[key]) for o in mine], "textposition": "outside", "cliponaxis": False,
                "hovertemplate": f"%{{y}}<br>%{{x:,.4g}} {unit}<extra>{mode}</extra>",
            })
    monthly = [o["usd_per_month"] for o in options if o["usd_per_month"]]
    per_token = [o["usd_per_million_tokens"] for o in options if o["usd_per_million_tokens"]]
    fig = {"data": data, "layout": layout(
        title, height=170 + 30 * len(options), barmode="overlay",
        grid={"rows": 1, "columns": 2, "pattern": "independent"},
        xaxis=axis("$ per month", domain=[0.0, 0.46], range=[0, max(monthly, default=1) * 1.25]),
        xaxis2=axis("$ per million tokens", domain=[0.54, 1.0],
                    range=[0, max(per_token, default=1) * 1.3]),
        yaxis=axis("", type="category", showgrid=False, autorange="reversed",
                   categoryorder="array", categoryarray=labels),
        margin={"t": 95, "r": 40, "b": 60, "l": 10},
    )}
    what = (f"Cost of {len(options)} option(s): $/month and $/million tokens, coloured by how "
            "the hardware is had; pale: misses the target")
    return Figure(fig, caption(what, SOURCE.format(rates=_rates(options))))


def _money(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "NA"
    return f"${value:,.0f}" if value >= 100 else f"${value:,.3g}"


def break_even_figure(options: Sequence[Mapping[str, Any]]) -> Figure | None:
    """Per device (and count) among the options: the month's hours the workload holds it
    against its buy-vs-rent break-even (right of it: buying pays; 'never': renting is
    cheaper even if busy every hour)."""
    rows: dict[str, Mapping[str, Any]] = {}
    for o in options:
        if o.get("break_even_utilisation") is not None and o.get("held_hours_per_device_month") is not None:
            rows.setdefault(f"{o['devices']}x {o['hardware']} {o['precision']}", o)
    if not rows:
        return None
    names = list(rows)
    held = [min(1.0, rows[n]["held_hours_per_device_month"] / HOURS_PER_MONTH) * 100 for n in names]
    even_raw = [rows[n]["break_even_utilisation"] for n in names]
    even = [min(e, 1.05) * 100 if math.isfinite(e) else 105.0 for e in even_raw]
    shapes = [{"type": "line", "xref": "x", "yref": "y", "x0": h, "x1": e, "y0": n, "y1": n,
               "line": {"color": "#bbb", "width": 3}, "layer": "below"}
              for n, h, e in zip(names, held, even, strict=True)]
    data = [
        {"type": "scatter", "mode": "markers", "name": "hours the workload holds it",
         "y": names, "x": held, "marker": {"color": colour(0), "size": 12},
         "hovertemplate": "%{y}: held %{x:.1f}% of the month's hours<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "buy-vs-rent break-even",
         "y": names, "x": even, "marker": {"color": MEASURED_COLOUR, "size": 12, "symbol": "diamond"},
         "text": [f"{e:.1%}" if math.isfinite(e) and e <= 1 else "never (renting is cheaper)" for e in even_raw],
         "hovertemplate": "%{y}: break-even %{text}<extra></extra>"},
    ]
    never = note("105%: renting is cheaper even if busy every hour", 1, -0.02, xref="paper",
                 yref="paper", xanchor="right", yanchor="top", yshift=-30,
                 font={"size": 11, "color": "#555"})
    fig = {"data": data, "layout": layout(
        "Rent or buy: hours held against the break-even", height=200 + 34 * len(names),
        xaxis=axis("share of the month's hours (%)", range=[0, 110]),
        yaxis=axis("", type="category", showgrid=False, autorange="reversed"),
        shapes=shapes, annotations=[never] if max(even) > 100 else [],
        margin={"t": 95, "r": 30, "b": 90, "l": 10},
    )}
    what = ("Buy-vs-rent break-even per device: owning costs less than renting on demand when the "
            "workload holds it for more of the month's hours than the diamond")
    return Figure(fig, caption(what, "estimated from catalogue prices and the cost assumptions"))


def breakdown_figure(option: Mapping[str, Any], title: str) -> Figure:
    """One option's monthly cost, stacked by what it pays for."""
    parts = {k: v for k, v in (option.get("cost_breakdown_usd") or {}).items() if v}
    data = [{"type": "bar", "orientation": "h", "name": k, "y": [option["option"]], "x": [v],
             "marker": {"color": colour(i)},
             "hovertemplate": f"{k}: $%{{x:,.2f}} a month<extra></extra>"}
            for i, (k, v) in enumerate(parts.items())]
    total = option["usd_per_month"]
    per_mtok = option.get("usd_per_million_tokens")
    said = f"${total:,.0f} a month" + (f", ${per_mtok:,.3g} per million tokens" if per_mtok else "")
    fig = {"data": data, "layout": layout(
        f"{title}: {said}", height=260, barmode="stack",
        xaxis=axis("$ per month", range=[0, total * 1.08]),
        yaxis=axis("", type="category", showgrid=False),
        margin={"t": 95, "r": 30, "b": 60, "l": 10},
    )}
    return Figure(fig, caption("Monthly cost of the option by what it pays for",
                               SOURCE.format(rates=_rates([option]))))
