"""`gpuwise repro`: each metric's runs per condition (box with every run as a point), and
the arithmetic share of the variance (variance with the seed fixed over variance with seeds
varied) with its interval, on a log axis where 1 means "as much as changing the seed"."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.estimate.repro.analysis import ConditionRuns
from gpuwise.estimate.repro.stats import Share
from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    axis,
    caption,
    colour,
    layout,
    legend_entry,
    vline,
)

CONDITION_ORDER = ("same-seed", "deterministic", "threads", "seeds")
MAX_METRICS = 8


def metrics_of(runs: Sequence[ConditionRuns]) -> list[str]:
    return sorted({m for c in runs for m, v in c.metrics.items() if v})[:MAX_METRICS]


def spread_figure(runs: Sequence[ConditionRuns], metric: str) -> Figure:
    """One box per condition, every run a point beside it."""
    ordered = sorted((c for c in runs if c.metrics.get(metric)),
                     key=lambda c: (CONDITION_ORDER.index(c.name) if c.name in CONDITION_ORDER else 9, c.name))
    data = []
    for i, c in enumerate(ordered):
        values = c.metrics[metric]
        data.append({"type": "box", "name": f"{c.name} ({len(values)} runs)", "y": values,
                     "boxpoints": "all", "jitter": 0.35, "pointpos": 0, "boxmean": True,
                     "marker": {"color": colour(i), "size": 7, "opacity": 0.8},
                     "line": {"color": colour(i)}, "fillcolor": "rgba(0,0,0,0.03)",
                     "hovertemplate": "%{y:.8g}<extra>" + c.name + "</extra>"})
    fig = {"data": data, "layout": layout(
        f"{metric}: every run, per condition", showlegend=False,
        xaxis=axis("", type="category", showgrid=False),
        yaxis=axis(metric, exponentformat="none", tickformat=".6~g"),
    )}
    return Figure(fig, caption(f"{metric} of every run (points) per condition, box from the "
                               "quartiles with the mean dashed", "measured (each run's own output)"))


def undrawn_shares(shares: Mapping[str, Mapping[str, Share]]) -> list[str]:
    """The shares a log axis cannot show, one line each: exactly zero, or undefined."""
    said = []
    for metric, by_condition in shares.items():
        for name, share in by_condition.items():
            if share.ratio is None:
                said.append(f"{metric}, seed fixed in {name}: undefined ({share.note or 'too few runs'})")
            elif share.exactly_zero:
                said.append(f"{metric}, seed fixed in {name}: exactly 0 (the runs were identical)")
    return said


def shares_figure(shares: Mapping[str, Mapping[str, Share]]) -> Figure | None:
    """The share of each metric under each fixed-seed condition with its interval (log axis);
    shares exactly zero or undefined are not drawn (`undrawn_shares` says them)."""
    drawn: dict[str, list[tuple[str, Share]]] = {}
    for metric, by_condition in shares.items():
        for name, share in by_condition.items():
            if share.ratio is not None and not share.exactly_zero:
                drawn.setdefault(name, []).append((metric, share))
    if not drawn:
        return None
    data = []
    values = [1.0]
    for i, (name, items) in enumerate(drawn.items()):
        ratios = [s.ratio or 0.0 for _, s in items]
        highs = [(s.high or r) - r for (_, s), r in zip(items, ratios, strict=True)]
        lows = [r - (s.low or r) for (_, s), r in zip(items, ratios, strict=True)]
        values += [v for _, s in items for v in (s.low, s.high, s.ratio) if v]
        data.append({"type": "scatter", "mode": "markers", "name": f"seed fixed: {name}",
                     "y": [f"{m} · {name}" for m, _ in items], "x": ratios,
                     "error_x": {"type": "data", "symmetric": False, "array": highs,
                                 "arrayminus": lows, "color": colour(i), "thickness": 2, "width": 6},
                     "marker": {"color": colour(i), "size": 11},
                     "hovertemplate": "%{y}: %{x:.3g}<extra></extra>"})
    level = next((s.confidence for d in shares.values() for s in d.values()), 0.95)
    lo = math.log10(max(min(values), 1e-12)) - 0.3
    hi = math.log10(max(values)) + 0.3
    line = {"color": MEASURED_COLOUR, "dash": "dash", "width": 1.5}
    data.append(legend_entry("1: as much spread as changing the seed", line=line))
    rows = sum(len(v) for v in drawn.values())
    fig = {"data": data, "layout": layout(
        "Arithmetic share of the variance", height=240 + 44 * rows,
        xaxis=axis("variance with the seed fixed / variance with seeds varied (log)", log=True,
                   range=[lo, hi]),
        yaxis=axis("", type="category", showgrid=False, autorange="reversed"),
        shapes=[vline(1.0, MEASURED_COLOUR)], margin={"t": 95, "r": 30, "b": 70, "l": 10},
    )}
    return Figure(fig, caption(f"Arithmetic share of each metric's variance with its {level:.0%} "
                               "interval (F distribution), log scale; shares of exactly 0 are listed below it",
                               "measured runs; interval estimated"))


def runs_record(runs: Sequence[ConditionRuns]) -> list[dict[str, Any]]:
    """What the page plots, for its JSON: each condition's metric values in run order."""
    return [{"condition": c.name, "metrics": c.metrics, "wall_s": c.wall_s, "failed": c.failed}
            for c in runs]
