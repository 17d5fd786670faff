"""Memory: stacked bars of the breakdown (one bar per precision, batch or plan), the device's
capacity as a line, and the "tight" zone (within the margin of the capacity, `fits: tight`)
shaded. Takes the `memory` records and `precisions` rows the JSON output holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import (
    GIB,
    MEASURED_COLOUR,
    OVER_COLOUR,
    TIGHT_COLOUR,
    axis,
    caption,
    gb,
    layout,
    legend_entry,
)

# Components in the order they stack, each with one colour on every page.
COMPONENT_COLOURS = {
    "weights": "#0072B2", "kv_cache": "#E69F00", "activations": "#009E73", "logits": "#CC79A7",
    "gradients": "#D55E00", "optimizer": "#882255", "fsdp_unsharded": "#56B4E9",
    "workspace": "#F0E442", "compute_buffer": "#44AA99", "allocator_slack": "#BBBBBB",
    "cublas_workspace": "#117733", "nccl_buffers": "#AA4499", "overhead": "#555555",
}
ORDER = tuple(COMPONENT_COLOURS)
OTHER_COLOURS = ("#332288", "#999933", "#661100", "#6699CC", "#888888")


@dataclass(frozen=True)
class Bar:
    """One bar: its label, the breakdown (bytes by component; parts add up to the total),
    and the bytes below the capacity that count as tight (0: none said)."""

    label: str
    breakdown: Mapping[str, int]
    margin_bytes: int = 0
    verdict: str = ""


def memory_figure(bars: Sequence[Bar], capacity_bytes: int, device: str, title: str,
                  what: str, source: str) -> Figure:
    """Horizontal stacked bars (the first bar on top), capacity line, tight zone per bar."""
    names = _components(bars)
    labels = [_label(b) for b in bars]
    data = []
    for name in names:
        xs = [gb(b.breakdown.get(name, 0)) for b in bars]
        data.append({
            "type": "bar", "orientation": "h", "name": name.replace("_", " "), "y": labels,
            "x": xs, "marker": {"color": component_colour(name)},
            "hovertemplate": f"{name.replace('_', ' ')}: %{{x:.3f}} GiB<br>%{{y}}<extra></extra>",
        })
    cap = gb(capacity_bytes)
    totals = [gb(sum(b.breakdown.values())) for b in bars]
    shapes: list[dict[str, Any]] = [
        {"type": "line", "xref": "x", "x0": cap, "x1": cap, "yref": "paper", "y0": 0, "y1": 1,
         "line": {"color": MEASURED_COLOUR, "width": 2.5}},
    ]
    for i, b in enumerate(bars):
        if b.margin_bytes:
            shapes.append({"type": "rect", "xref": "x", "x0": gb(capacity_bytes - b.margin_bytes),
                           "x1": cap, "yref": "y", "y0": i - 0.45, "y1": i + 0.45,
                           "fillcolor": TIGHT_COLOUR, "line": {"width": 0}, "layer": "below"})
    right = max([cap, *totals]) * 1.12
    if max(totals, default=0) > cap:
        shapes.append({"type": "rect", "xref": "x", "x0": cap, "x1": right, "yref": "paper",
                       "y0": 0, "y1": 1, "fillcolor": OVER_COLOUR, "line": {"width": 0},
                       "layer": "below"})
    data.append(legend_entry(f"capacity {capacity_bytes / GIB:,.2f} GiB", line={"color": MEASURED_COLOUR, "width": 2.5}))
    if max(totals, default=0) > cap:
        data.append(legend_entry("beyond the capacity: does not fit", marker={
            "symbol": "square", "size": 13, "color": "rgba(213,94,0,0.30)"}))
    if any(b.margin_bytes for b in bars):
        data.append(legend_entry("tight: within the allocator's margin", marker={
            "symbol": "square", "size": 13, "color": "rgba(230,159,0,0.45)"}))
    rows = -(-len(data) // 4)  # legend rows, four entries a row
    fig = {"data": data, "layout": layout(
        title, height=170 + 48 * len(bars) + 24 * rows, barmode="stack",
        xaxis=axis("GiB on the device", range=[0, right]),
        yaxis=axis("", autorange="reversed", showgrid=False, type="category"),
        shapes=shapes, bargap=0.35,
        margin={"t": 60, "r": 30, "b": 80 + 24 * rows, "l": 10},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0,
                "xanchor": "left", "traceorder": "normal", "entrywidth": 250},
    )}
    return Figure(fig, caption(f"{what} on {device}: stacked by component, capacity "
                               f"{capacity_bytes / GIB:,.2f} GiB marked", source))


def component_colour(name: str) -> str:
    return COMPONENT_COLOURS.get(name) or OTHER_COLOURS[sum(map(ord, name)) % len(OTHER_COLOURS)]


def _components(bars: Sequence[Bar]) -> list[str]:
    seen = {k for b in bars for k, v in b.breakdown.items() if v}
    return [k for k in ORDER if k in seen] + sorted(seen - set(ORDER))


def _label(b: Bar) -> str:
    total = gb(sum(b.breakdown.values()))
    verdict = f", fits: {b.verdict}" if b.verdict else ""
    return f"{b.label}<br>{total:,.2f} GiB{verdict}"


def bar_of(label: str, memory: Mapping[str, Any]) -> Bar:
    """A bar from a `memory` record (infer, train, module)."""
    return Bar(label, memory["breakdown"], int(memory.get("margin_bytes") or 0),
               str(memory.get("verdict") or ("yes" if memory.get("fits") else "no")))


def precision_bars(rows: Sequence[Mapping[str, Any]]) -> list[Bar]:
    """One bar per `check` precision row."""
    return [Bar(str(r["weights"]), r["breakdown"], int(r.get("margin_bytes") or 0),
                str(r.get("verdict") or ("fits" if r["fits"] else "no")))
            for r in rows]
