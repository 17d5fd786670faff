"""The `gpuwise claims --html` page: an overview of the verdicts, then one section per claim of
the explainer with its experiment, the rule its verdict follows, a plot and the measurements.
Figures are plain plotly JSON (`{"data": [...], "layout": {...}}`); nothing imports plotly."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpuwise.app.claims import ClaimResult, ClaimsAnswer
from gpuwise.report.claims_view import claims_record, machine_line
from gpuwise.report.html.output import Page
from gpuwise.report.html.page import Figure, Section
from gpuwise.report.html.style import (
    MEASURED_COLOUR,
    SPEC_COLOUR,
    axis,
    caption,
    colour,
    hline,
    layout,
    log_position,
    note,
    vline,
)

TITLE = "The GPU explainer's claims, tested on this machine"
ESTIMATED_COLOUR = colour(0)
SHORT = {True: "holds here", False: "does not hold here", None: "not measured here"}


def claims_page(a: ClaimsAnswer) -> Page:
    """The page: the verdicts, then a section per claim."""
    sections = (overview(a), *(claim_section(r) for r in a.results))
    subtitle = machine_line(a) + (f"; `{a.command}`;" if a.command else ";")
    return Page(TITLE, sections, claims_record(a), subtitle)


def overview(a: ClaimsAnswer) -> Section:
    rows = [("claim", "measured here", "verdict (why: in its section)")]
    rows += [(r.title, r.summary, SHORT[r.verdict.holds]) for r in a.results]
    held = sum(r.verdict.holds is True for r in a.results)
    failed = sum(r.verdict.holds is False for r in a.results)
    return Section(
        "Verdicts",
        "Each claim of the explainer gpuwise started from, tested by a small real experiment "
        "on this machine. A verdict follows from the measurement and a stated threshold "
        "(catalog/data/claims.toml, with its source); every number says whether it was "
        "measured here, detected, estimated by gpuwise's models, or taken from a datasheet.",
        table=tuple(rows), verdict=f"{held} of {len(a.results)} claims hold here, {failed} "
                f"{'does' if failed == 1 else 'do'} not",
    )


def claim_section(r: ClaimResult) -> Section:
    verdict = r.verdict.text + (f": {r.verdict.reason}" if r.verdict.holds else "")
    if r.judged_on is not None:
        verdict += f" (judged on {r.judged_on.text})"
    text = "\n\n".join(p for p in (f"The claim: {r.claim}", f"The experiment: {r.experiment}",
                                   f"The verdict {r.verdict.rule}." if r.verdict.rule else "")
                       if p)
    figure = FIGURES.get(r.id)
    figures = (figure(r),) if figure is not None and r.verdict.holds is not None else ()
    return Section(r.title, text, figures, r.table, verdict, (*r.notes, _took(r)))


def _took(r: ClaimResult) -> str:
    return f"The experiment took {r.seconds:.1f} s."


# ------------------------------------------------------------------------------- figures


def _label(y: float, text: str, log: bool = False) -> dict[str, Any]:
    """A dashed line's label at the plot's right edge, above the line."""
    return note(text, 1, log_position(y) if log else y, xref="paper", xanchor="right",
                yanchor="bottom", font={"size": 12, "color": SPEC_COLOUR})


def memory_figure(r: ClaimResult) -> Figure:
    s = r.series
    gib = 2**30
    data = []
    for i, p in enumerate(s["precisions"]):
        data.append({"type": "scatter", "mode": "markers", "name": f"{p} weights",
                     "x": s["params"], "y": [b / gib for b in s["needed_bytes"][p]],
                     "text": s["models"], "hovertemplate": "%{text}: %{y:.1f} GiB",
                     "marker": {"color": colour(i), "size": 9,
                                "symbol": ["circle" if ok else "x" for ok in s["fits"][p]]}})
    memory = s["memory_bytes"] / gib
    decades = [10.0**e for e in range(7, 13)]
    names = ["10M", "100M", "1B", "10B", "100B", "1T"]
    look = layout(xaxis=axis("parameters", log=True, tickvals=decades, ticktext=names),
                  yaxis=axis("memory needed (GiB)", log=True, exponentformat="none"),
                  shapes=[hline(memory, SPEC_COLOUR)],
                  annotations=[_label(memory, f"this machine: {memory:.1f} GiB", log=True)])
    return Figure({"data": data, "layout": look}, caption(
        "Memory each catalogue model needs to generate (2K-token prompt, 256 new tokens, batch "
        "1) at each weight precision; a cross: does not fit",
        "estimated (gpuwise's memory model); the machine's memory: detected"))


def bandwidth_figure(r: ClaimResult) -> Figure:
    s = r.series
    mb = [b / 1e6 for b in s["bytes_per_token"]]
    f = s["factor"]
    hi = max(mb) * 1.15
    per_mb = 1.0 / s["read_gbs"]  # ms per MB at the measured bandwidth
    data = [
        {"type": "scatter", "mode": "lines", "name": f"within {f:g}x", "x": [0, hi, hi, 0],
         "y": [0, hi * per_mb / f, hi * per_mb * f, 0], "fill": "toself",
         "fillcolor": "rgba(0,114,178,0.10)", "line": {"width": 0}, "hoverinfo": "skip"},
        {"type": "scatter", "mode": "lines", "name": f"bytes / bandwidth ({s['read_gbs']:.0f} GB/s)",
         "x": [0, hi], "y": [0, hi * per_mb], "line": {"color": ESTIMATED_COLOUR}},
        {"type": "scatter", "mode": "markers+text", "name": "measured decode", "x": mb,
         "y": [t * 1e3 for t in s["measured_s"]], "text": s["labels"],
         "textposition": "top center", "marker": {"color": MEASURED_COLOUR, "size": 11}},
    ]
    look = layout(xaxis=axis("bytes read per token (MB)", rangemode="tozero"),
                  yaxis=axis("time per token (ms)", rangemode="tozero"))
    return Figure({"data": data, "layout": look}, caption(
        f"Decode time per token against the bytes each token reads, under {s['runtime']}; "
        "shaded: the verdict's tolerance",
        "measured here (decode and read bandwidth); bytes from the model files"))


def data_movement_figure(r: ClaimResult) -> Figure:
    s = r.series
    share = {k: [v / t if t else 0.0 for v, t in zip(s[k], s["seconds"], strict=True)]
             for k in ("memory_s", "compute_s", "overhead_s")}
    names = {"memory_s": "memory-bound", "compute_s": "compute-bound",
             "overhead_s": "fixed cost (dispatch, launch, runtime)"}
    data = [{"type": "bar", "orientation": "h", "name": names[k], "y": s["labels"],
             "x": [100 * v for v in share[k]], "marker": {"color": colour(i)},
             "hovertemplate": "%{y}: %{x:.0f}%"}
            for i, k in enumerate(("memory_s", "compute_s", "overhead_s"))]
    look = layout(height=130 + 34 * len(s["labels"]), barmode="stack",
                  xaxis=axis("share of the phase's time (%)", range=[0, 100]),
                  yaxis=axis("", autorange="reversed"),
                  shapes=[vline(100 * s["threshold"], SPEC_COLOUR)])
    return Figure({"data": data, "layout": look}, caption(
        "Where each phase's time goes: operations whose bytes over the bandwidth exceed their "
        "FLOPs over the rate (memory-bound), the others (compute-bound), and fixed "
        "per-operation costs; dashed: the threshold",
        "estimated (roofline model on this machine's probe)"))


def quantized_figure(r: ClaimResult) -> Figure:
    s = r.series
    data = []
    for source, hue in (("measured", MEASURED_COLOUR), ("estimated", ESTIMATED_COLOUR)):
        picked = [i for i, src in enumerate(s["sources"]) if src == source]
        if picked:
            data.append({"type": "bar", "name": source, "x": [s["labels"][i] for i in picked],
                         "y": [s["tokens_per_s"][i] for i in picked], "marker": {"color": hue},
                         "hovertemplate": "%{x}: %{y:.1f} tokens/s"})
    reading = s["reading_tokens_per_s"]
    look = layout(bargap=0.25, xaxis=axis("", tickangle=-30),
                  yaxis=axis("tokens per second", rangemode="tozero"),
                  shapes=[hline(reading, SPEC_COLOUR)],
                  annotations=[_label(reading, f"reading speed: {reading:.1f} tokens/s")])
    return Figure({"data": data, "layout": look}, caption(
        "Tokens generated per second on this CPU, one sequence, against how fast people read",
        "measured here (the small model); estimated (llama.cpp time model on this machine's "
        "probe) for catalogue models"))


def pipeline_figure(r: ClaimResult) -> Figure:
    s = r.series
    data = [
        {"type": "bar", "name": "waiting for data", "x": s["labels"],
         "y": [100 * v for v in s["input_share"]], "marker": {"color": MEASURED_COLOUR}},
        {"type": "bar", "name": "computing", "x": s["labels"],
         "y": [100 * v for v in s["busy_share"]], "marker": {"color": ESTIMATED_COLOUR}},
    ]
    limit = 100 * s["threshold"]
    look = layout(height=380, barmode="stack", xaxis=axis(""),
                  yaxis=axis("share of each step (%)", range=[0, 100]),
                  shapes=[hline(limit, SPEC_COLOUR)],
                  annotations=[_label(limit, f"input-bound at {limit:.0f}% waiting")])
    return Figure({"data": data, "layout": look}, caption(
        "Each training step of the watched job: waiting for its input against computing, with "
        "the loader in the loop's process and with workers", "measured (gpuwise watch)"))


def reproducibility_figure(r: ClaimResult) -> Figure:
    s = r.series
    sds = [sd if sd else None for sd in s["sd"]]
    text = ["bit-identical" if same else (f"{sd:.2g}" if sd else "")
            for same, sd in zip(s["bit_identical"], s["sd"], strict=True)]
    shown = [v for v in sds if v]
    floor = min(shown) / 10 if shown else 1e-12
    data = [{"type": "bar", "name": "standard deviation of the final loss",
             "x": s["conditions"], "y": [v if v else floor for v in sds], "text": text,
             "textposition": "outside",
             "marker": {"color": [MEASURED_COLOUR if v else "#cccccc" for v in sds]}}]
    look = layout(height=400, showlegend=False, xaxis=axis("condition"),
                  yaxis=axis("sd of the final loss", log=True, exponentformat="power"))
    return Figure({"data": data, "layout": look}, caption(
        "Spread of the final training loss over runs: seed fixed (same-seed; threads: the thread "
        "count varied), seed varied (seeds); grey: runs bit-identical",
        "measured (gpuwise repro)"))


def energy_figure(r: ClaimResult) -> Figure:
    s = r.series
    values = s["joules_per_gflop"]
    data = [{"type": "bar", "name": f"joules per GFLOP ({s['source']})", "x": s["labels"],
             "y": values, "text": [f"{v:.3g} J/GFLOP" if v else "" for v in values],
             "textposition": "outside",
             "marker": {"color": [ESTIMATED_COLOUR, MEASURED_COLOUR]}}]
    got = [v for v in values if v]
    span = {"range": [math.log10(min(got) / 3), math.log10(max(got) * 5)]} if got else {}
    look = layout(height=400, showlegend=False, xaxis=axis(""),
                  yaxis=axis("joules per GFLOP", log=True, exponentformat="power", **span))
    return Figure({"data": data, "layout": look}, caption(
        "Energy per unit of arithmetic: a training step against a generated token of the same "
        "model", f"times measured here; energy {s['source']}; FLOPs counted from the model's "
        "operations"))


FIGURES: dict[str, Callable[[ClaimResult], Figure]] = {
    "memory": memory_figure, "bandwidth": bandwidth_figure,
    "data-movement": data_movement_figure, "quantized-cpu": quantized_figure,
    "pipeline": pipeline_figure, "reproducibility": reproducibility_figure,
    "energy": energy_figure,
}
