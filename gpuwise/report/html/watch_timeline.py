"""`gpuwise watch --report`: a timeline of the job over one time axis, in panels: GPU busy and
SM active per GPU (CPU use without a GPU), the data wait of each rank's steps, memory, and
power per GPU; the verdict written on it and its evidence marked (the thresholds it uses,
the straggler, the memory trend). Every reading is measured; long runs are averaged into at
most `MAX_POINTS` buckets per series (the caption says so)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch.log_records import SampleRecord, StepRecord, WatchLog
from gpuwise.estimate.watch.summary import WatchSummary
from gpuwise.estimate.watch.verdict import Verdict
from gpuwise.report.html.page import Figure
from gpuwise.report.html.style import MEASURED_COLOUR, axis, caption, colour, layout, note

MAX_POINTS = 1200
GIB = 2**30


def bucketed(xs: Sequence[float], ys: Sequence[float | None],
             limit: int = MAX_POINTS) -> tuple[list[float], list[float | None]]:
    """At most `limit` points: means of consecutive runs of points (gaps stay gaps)."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    size = -(-len(xs) // limit)
    out_x, out_y = [], []
    for i in range(0, len(xs), size):
        got = [y for y in ys[i : i + size] if y is not None]
        out_x.append(sum(xs[i : i + size]) / len(xs[i : i + size]))
        out_y.append(sum(got) / len(got) if got else None)
    return out_x, out_y


def timeline_figure(log: WatchLog, summary: WatchSummary, verdict: Verdict) -> Figure:
    """The panels the log has readings for, stacked over one time axis."""
    t0 = _start(log)
    panels: list[tuple[str, list[dict[str, Any]]]] = []
    busy = _gpu_series(log.samples, t0, "util_percent", "GPU {i} busy %", "solid")
    busy += _gpu_series(log.samples, t0, "sm_percent", "GPU {i} SM active %", "dot")
    if busy:
        panels.append(("GPU busy / SM active (%)", busy))
    else:
        cpu = _sample_series(log.samples, t0, lambda s: s.cpu_percent, "CPU use % (mean of cores)", 0)
        if cpu:
            panels.append(("CPU use (%)", cpu))
    stragglers = set(summary.ranks.stragglers) if summary.ranks else set()
    wait = _rank_series(log.steps, t0, lambda s: 100 * (s.data_s + s.h2d_s) / s.step_s if s.step_s > 0 else None,
                        "rank {r} data wait %", stragglers)
    if wait:
        panels.append(("data wait (% of step)", wait))
    memory = _gpu_series(log.samples, t0, "mem_used_bytes", "GPU {i} memory GiB", "solid", 1 / GIB)
    memory += _rank_series(log.steps, t0, lambda s: s.device_mem_bytes / GIB if s.device_mem_bytes else None,
                           "rank {r} device memory GiB", stragglers, "dot")
    memory += _rank_series(log.steps, t0, lambda s: s.rss_bytes / GIB if s.rss_bytes else None,
                           "rank {r} RSS GiB", stragglers, "dashdot")
    if not memory:
        memory = _sample_series(log.samples, t0, lambda s: s.rss_bytes / GIB if s.rss_bytes else None,
                                "process tree RSS GiB", 3)
    if memory:
        panels.append(("memory (GiB)", memory))
    power = _gpu_series(log.samples, t0, "power_w", "GPU {i} power W", "solid")
    if power:
        panels.append(("power (W)", power))
    return _figure(panels, log, summary, verdict, t0)


def _figure(panels: list[tuple[str, list[dict[str, Any]]]], log: WatchLog, summary: WatchSummary,
            verdict: Verdict, t0: float) -> Figure:
    data: list[dict[str, Any]] = []
    layout_axes: dict[str, Any] = {}
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    limits = watch_thresholds()
    for row, (title, traces) in enumerate(panels, start=1):
        yname = f"y{row if row > 1 else ''}"
        for trace in traces:
            trace.update(xaxis="x", yaxis=yname)
            data.append(trace)
        layout_axes[f"yaxis{row if row > 1 else ''}"] = axis(title, rangemode="tozero")
        if title.startswith("data wait"):
            y = 100 * limits.input_bound_share
            shapes.append(_threshold(yname, y))
            annotations.append(note(f"input-bound at {y:.0f}%", 1, y, xref="x domain", yref=yname,
                                    xanchor="right", yanchor="bottom",
                                    font={"size": 11, "color": MEASURED_COLOUR}))
        if title.startswith("GPU busy") and verdict.bound == "host-bound":
            y = limits.low_gpu_util_percent
            shapes.append(_threshold(yname, y))
            annotations.append(note(f"low GPU use below {y:.0f}%", 1, y, xref="x domain",
                                    yref=yname, xanchor="right", yanchor="bottom",
                                    font={"size": 11, "color": MEASURED_COLOUR}))
        if title.startswith("memory"):
            data += _trend_traces(log.steps, summary, t0, yname)
    first = verdict.findings[0] if verdict.findings else None
    headline = f"verdict: {first.title}" if first else f"verdict: {verdict.bound}"
    more = [f.title for f in verdict.findings[1:]]
    if more:
        headline += "; also " + "; ".join(more)
    annotations.append(note(headline, 0, 1.0, xref="paper", yref="paper", xanchor="left",
                            yanchor="bottom", yshift=12, font={"size": 13, "color": "#8a2a00"}))
    rows = max(1, len(panels))
    fig = {"data": data, "layout": layout(
        "", height=190 + 190 * rows,
        grid={"rows": rows, "columns": 1, "pattern": "coupled", "roworder": "top to bottom"},
        xaxis=axis("seconds since the job started"), shapes=shapes, annotations=annotations,
        margin={"t": 90, "r": 30, "b": 60, "l": 80}, **layout_axes,
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top",
                "font": {"size": 11}},
    )}
    many = max((len(t["x"]) for t in data), default=0) >= MAX_POINTS
    what = (f"Timeline of the job ({summary.steps_total} steps, {summary.processes} process(es)): "
            + ", ".join(t for t, _ in panels)
            + "; thresholds of the verdict dashed red" + ("; long series averaged into buckets" if many else ""))
    return Figure(fig, caption(what, "measured (NVML, psutil and the steps the job reported)"))


def _threshold(yref: str, y: float) -> dict[str, Any]:
    return {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
            "line": {"color": MEASURED_COLOUR, "dash": "dash", "width": 1.5}}


def _trend_traces(steps: Sequence[StepRecord], summary: WatchSummary, t0: float,
                  yref: str) -> list[dict[str, Any]]:
    """The verdict's memory trends over the steps, as the line it fitted (first -> last)."""
    out: list[dict[str, Any]] = []
    if not steps:
        return out
    start = steps[int(0.2 * (len(steps) - 1))].t_start - t0
    end = max(s.t_end for s in steps) - t0
    for trend in summary.memory:
        growth = (trend.last_bytes - trend.first_bytes) / GIB
        out.append({"type": "scatter", "mode": "lines", "x": [start, end],
                    "y": [trend.first_bytes / GIB, trend.last_bytes / GIB], "xaxis": "x", "yaxis": yref,
                    "name": f"{trend.what} trend ({growth:+.2f} GiB, r={trend.r:.2f})",
                    "line": {"color": MEASURED_COLOUR, "dash": "dash", "width": 2},
                    "hovertemplate": "%{y:.3f} GiB<extra>memory trend</extra>"})
    return out


def _start(log: WatchLog) -> float:
    times = [s.t for s in log.samples[:1]] + [s.t_start for s in log.steps[:1]]
    header_t = log.header.get("t")
    if isinstance(header_t, int | float):
        times.append(float(header_t))
    return min(times) if times else 0.0


def _gpu_series(samples: Sequence[SampleRecord], t0: float, field: str, name: str, dash: str,
                scale: float = 1.0) -> list[dict[str, Any]]:
    indices = sorted({g.index for s in samples for g in s.gpus if getattr(g, field) is not None})
    out = []
    for k, i in enumerate(indices):
        xs, ys = [], []
        for s in samples:
            reading = next((g for g in s.gpus if g.index == i), None)
            value = getattr(reading, field) if reading else None
            xs.append(s.t - t0)
            ys.append(value * scale if value is not None else None)
        x, y = bucketed(xs, ys)
        out.append(_line(name.format(i=i), x, y, colour(k), dash))
    return out


def _sample_series(samples: Sequence[SampleRecord], t0: float,
                   value: Callable[[SampleRecord], float | None], name: str,
                   tint: int) -> list[dict[str, Any]]:
    ys = [value(s) for s in samples]
    if not any(y is not None for y in ys):
        return []
    x, y = bucketed([s.t - t0 for s in samples], ys)
    return [_line(name, x, y, colour(tint), "solid")]


def _rank_series(steps: Sequence[StepRecord], t0: float,
                 value: Callable[[StepRecord], float | None], name: str,
                 stragglers: set[int], dash: str = "solid") -> list[dict[str, Any]]:
    out = []
    for k, rank in enumerate(sorted({s.rank for s in steps})):
        mine = [s for s in steps if s.rank == rank]
        ys = [value(s) for s in mine]
        if not any(y is not None for y in ys):
            continue
        x, y = bucketed([s.t_start - t0 for s in mine], ys)
        label = name.format(r=rank) + (" (straggler)" if rank in stragglers else "")
        trace = _line(label, x, y, colour(k), dash)
        if rank in stragglers:
            trace["line"]["width"] = 3.5
        out.append(trace)
    return out


def _line(name: str, x: list[float], y: list[float | None], tint: str, dash: str) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines", "name": name, "x": [round(v, 3) for v in x],
            "y": [None if v is None else round(v, 4) for v in y],
            "line": {"color": tint, "dash": dash, "width": 1.8},
            "hovertemplate": f"%{{x:.1f}} s: %{{y:.4g}}<extra>{name}</extra>"}
