"""`gpuwise plan --html`: the choice and the command that runs it, the two frontiers as plots
(tokens/s per device against tokens/s per user at each configuration's knee; $ per million
tokens against p90 time per output token at the load) and the runners-up. Renders the record
`--json` prints (report/plan_view.py) and nothing else: every number drawn is one of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.app.plan import PlanAnswer
from gpuwise.report.html.output import Page
from gpuwise.report.html.page import Figure, Section
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    axis,
    caption,
    colour,
    finite,
    layout,
    legend_entry,
    seconds_text,
    vline,
)
from gpuwise.report.plan_view import plan_view

SOURCE = ("estimated: each configuration's replicas simulated step by step with the runtime's "
          "scheduler and time model, priced from the catalogue and the cost assumptions")
Rec = Mapping[str, Any]


def _by_device(rec: Rec, points: Sequence[Rec]) -> list[tuple[str, str, list[Rec]]]:
    """(device, its colour, its points): a device has one colour on both plots."""
    devices = sorted({p["device"] for p in [*rec["sized"], *rec["speed_points"]]})
    return [(d, colour(i), [p for p in points if p["device"] == d])
            for i, d in enumerate(devices) if any(p["device"] == d for p in points)]


def _scatter(name: str, points: Sequence[Rec], x: str, y: str, scale: float, hover: str,
             marker: dict[str, Any], mode: str = "markers") -> dict[str, Any]:
    return {"type": "scatter", "mode": mode, "name": name,
            "x": finite([p[x] * scale if p[x] is not None else None for p in points]),
            "y": finite([p[y] for p in points]), "text": [p["label"] for p in points],
            "marker": marker, "hovertemplate": hover}


def _star(points: Sequence[Rec], x: str, y: str, scale: float,
          hover: str) -> list[dict[str, Any]]:
    """The choice, starred, where the plot has it."""
    if not points:
        return []
    return [_scatter("the choice", points[:1], x, y, scale, hover,
                     {"symbol": "star", "size": 18, "color": MEASURED_COLOUR,
                      "line": {"color": "#333", "width": 1}})]


def speed_figure(rec: Rec) -> Figure:
    """At each knee (the highest rate a replica serves within the targets): output tokens a
    second a device against tokens a second a user, by device; the frontier joined."""
    hover = ("%{text}<br>%{x:,.1f} tokens/s a user<br>%{y:,.0f} tokens/s a device"
             "<extra></extra>")
    x, y = "knee_tokens_per_s_per_user", "knee_tokens_per_s_per_device"
    data = [_scatter(device, pts, x, y, 1.0, hover, {"size": 10, "color": tint, "opacity": 0.7})
            for device, tint, pts in _by_device(rec, rec["speed_points"])]
    data.append(_scatter("frontier", rec["speed_frontier"], x, y, 1.0, hover,
                         {"size": 6, "color": "#333"}, "lines+markers"))
    choice = rec["choice"]
    data += _star([p for p in rec["speed_points"] if choice and p["label"] == choice["label"]],
                  x, y, 1.0, hover)
    fig = {"data": data, "layout": layout(
        "Tokens a second a device against tokens a second a user, at each one's knee",
        xaxis=axis("tokens/s a user (1 / p90 time per output token)", rangemode="tozero"),
        yaxis=axis("output tokens/s a device", rangemode="tozero"))}
    what = (f"{len(rec['speed_points'])} configuration(s) at their knee, coloured by device; "
            "the line joins those no other beats on both (higher and to the right is better)")
    return Figure(fig, caption(what, SOURCE))


def cost_figure(rec: Rec) -> Figure:
    """At the load: $ per million tokens against p90 time per output token of every sized
    configuration that meets the targets, by device; the frontier joined; the target."""
    hover = "%{text}<br>p90 TPOT %{x:.3g} ms<br>$%{y:.4g} per million tokens<extra></extra>"
    x, y = "p90_tpot_s", "usd_per_million_tokens"
    meeting = [p for p in rec["sized"] if p["meets"]]
    data = [_scatter(device, pts, x, y, 1e3, hover, {"size": 9, "color": tint, "opacity": 0.6})
            for device, tint, pts in _by_device(rec, meeting)]
    data.append(_scatter("frontier", rec["cost_frontier"], x, y, 1e3, hover,
                         {"size": 6, "color": "#333"}, "lines+markers"))
    data += _star([rec["choice"]] if rec["choice"] else [], x, y, 1e3, hover)  # its fleet
    shapes = []
    target = rec["load"]["tpot_ms"]
    if target:
        line = vline(target, MEASURED_COLOUR)
        shapes.append(line)
        data.append(legend_entry(f"target: {target:g} ms a token", line=line["line"]))
    fig = {"data": data, "layout": layout(
        "Dollars per million tokens against p90 time per output token, at the load",
        xaxis=axis("p90 time per output token (ms)", rangemode="tozero"),
        yaxis=axis("$ per million tokens", rangemode="tozero"), shapes=shapes)}
    what = (f"{len(meeting)} sized configuration(s) meeting the targets, coloured by device; "
            "the line joins those no other beats on both (lower and to the left is better)")
    return Figure(fig, caption(what, SOURCE))


def _load_text(rec: Rec) -> str:
    load = rec["load"]
    if load["kind"] == "concurrency":
        asked = f"{load['concurrency']:,} clients in a closed loop"
    elif load["kind"] == "trace":
        asked = f"the trace {load['trace']['path']}"
    else:
        asked = f"{load['requests_per_s']:.3g} requests/s"
    how = f" ({load['how']})" if load["how"] else ""
    targets = ", ".join(t for t in (
        f"TTFT <= {load['ttft_ms']:g} ms" if load["ttft_ms"] else "",
        f"<= {load['tpot_ms']:g} ms per output token" if load["tpot_ms"] else "") if t)
    return (f"{asked}{how}, searched at {load['requests_per_s']:.3g} requests/s of "
            f"{load['prompt_tokens']} prompt + {load['new_tokens']} new tokens; "
            f"{targets or 'no latency target'} (p90).")


def _at_load_notes(rec: Rec) -> tuple[str, ...]:
    at, run = rec["at_load"], rec["load_run"]
    if at is None or run is None:
        return ()
    where = ("the load" if run["kind"] == "rate" else
             f"{run['clients_per_replica']} clients a replica" if run["clients_per_replica"]
             else "the trace, dealt round-robin")
    out = [f"{name} at {where}: p50 {seconds_text(at[key]['p50'])}, p90 "
           f"{seconds_text(at[key]['p90'])}, p99 {seconds_text(at[key]['p99'])}"
           for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"))]
    out.append(f"{at['slo_met_fraction']:.0%} of requests within the targets; "
               f"{run['requests_per_s']:.3g} requests/s sent to {run['replicas']} replica(s)")
    if run["added_replicas"]:
        out.append(f"{run['added_replicas']} replica(s) added to the search's to meet the "
                   "targets there (priced above)")
    if run["search_choice"]:
        out.append(f"cheaper there than the search's choice, {run['search_choice']}, once that "
                   f"is grown to meet them ({run['rechecked']} configurations re-simulated)")
    if not run["meets"]:
        out.append(f"the targets are missed there with up to {run['tried_up_to_replicas']} "
                   "replica(s)")
    return tuple(out)


def _runners_up(rec: Rec) -> tuple[tuple[str, ...], ...]:
    rows = [(r["label"], f"{r['replicas']}", f"{r['usd_per_month']:,.0f}",
             f"{r['usd_per_million_tokens']:.3g}", seconds_text(r["p90_tpot_s"]), r["why"])
            for r in rec["runners_up"]]
    return (("configuration", "replicas", "$/month", "$/Mtok", "p90 TPOT", "why not"), *rows)


def plan_page(answer: PlanAnswer) -> Page:
    rec, _ = plan_view(answer)
    choice = rec["choice"]
    verdict = (f"{choice['label']}: {choice['replicas']} replica(s), {choice['devices']} "
               f"device(s), {choice['mode']}, ${choice['usd_per_month']:,.0f} a month"
               if choice else "no configuration meets the targets within the limits")
    search = rec["search"]
    text = (f"{_load_text(rec)}\n\nSearched {search['configurations']:,} configurations: "
            f"{search['sized']} sized, {search['ruled_out']} ruled out, "
            f"{search['left_unsized_by_the_bound']:,} left unsized by the cost bound. "
            "Estimated: time model and catalogue prices.")
    sections = [Section("The choice", text=text, verdict=verdict, notes=_at_load_notes(rec))]
    if rec["command"]:
        notes = [f"needs {rec['command_note']}"] if rec["command_note"] else []
        if rec["deployment_yaml"]:
            notes.append("a Kubernetes Deployment of its replicas is in the page's JSON "
                         "(deployment_yaml)")
        sections.append(Section("The command that runs it", text=rec["command"],
                                notes=tuple(notes)))
    sections.append(Section("The frontiers", figures=(speed_figure(rec), cost_figure(rec))))
    sections.append(Section("Runners-up: the next devices and runtimes, and why they lost",
                            table=_runners_up(rec)))
    return Page(f"gpuwise plan: {answer.model.name}", tuple(sections), rec)
