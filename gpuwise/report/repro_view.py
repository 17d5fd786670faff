"""Renders `gpuwise repro`'s answer: the verdict, per condition and per metric."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.repro import Placement, ReproAnswer
from gpuwise.estimate.repro.analysis import ConditionSummary, StudyAnalysis
from gpuwise.estimate.repro.stats import Share
from gpuwise.report.terminal import ByWidth, left_out


def repro_view(answer: ReproAnswer) -> tuple[Any, Any]:
    """(JSON record, renderable) of an analysed study."""
    study, analysis, notes = answer.study, answer.analysis, answer.energy_notes
    record = {"study": study.header() | {"results": str(study.results)},
              "analysis": dataclasses.asdict(analysis), "energy": notes,
              "placement": [dataclasses.asdict(p) for p in answer.placement],
              "ray": answer.ray}
    return record, format_study(analysis, study, notes, answer.placement, answer.ray)


def _num(x: float | None, digits: int = 4) -> str:
    return "NA" if x is None else f"{x:.{digits}g}"


def _identity(s: ConditionSummary) -> str:
    if s.bit_identical is not None:
        return "yes (parameters)" if s.bit_identical else "no (parameters)"
    if s.metrics_identical is not None:
        return "equal metrics" if s.metrics_identical else "no (metrics)"
    return "NA"


def _divergence(s: ConditionSummary) -> str:
    if not s.step_hashes_compared:
        return "NA"  # said under the table
    return "none" if s.first_divergent_step is None else str(s.first_divergent_step)


# headers on short lines: the table fits 80 columns with each condition's name whole
HEADERS = {"first diverging step": "first\ndiverging\nstep", "time/run s": "time/run\ns",
           "energy/run J": "energy/run\nJ", "bit-identical": "bit-\nidentical"}


def _conditions_table(a: StudyAnalysis) -> Table:
    notes = ["bit-identical: the runs' parameters (without their hashes: metrics) equal to "
             "the bit"]
    if any(not s.step_hashes_compared for s in a.conditions.values()):
        notes.append("first diverging step NA: the runs hashed no steps")
    t = Table(title="Runs per condition (measured)", title_justify="left",
              caption="; ".join(notes), caption_justify="left")
    for col in ("condition", "runs", "bit-identical", "first diverging step", "time/run s",
                "energy/run J"):
        t.add_column(HEADERS.get(col, col), overflow="fold", no_wrap=col == "condition",
                     justify="left" if col in ("condition", "bit-identical") else "right")
    for s in a.conditions.values():
        runs = f"{s.runs}" + (f" (+{s.failed} failed)" if s.failed else "")
        t.add_row(s.name, runs, _identity(s), _divergence(s),
                  _num(s.wall_s.mean if s.wall_s else None, 3),
                  _num(s.energy_j.mean if s.energy_j else None, 3))
    return t


def _metric_table(a: StudyAnalysis, metric: str) -> Table:
    t = Table(title=f"{metric} (measured)", title_justify="left")
    for col in ("condition", "mean", "sd", "min", "max", "range"):
        t.add_column(col, justify="left" if col == "condition" else "right", no_wrap=True)
    for s in a.conditions.values():
        m = s.metrics.get(metric)
        if m is not None:
            t.add_row(s.name, _num(m.mean, 8), _num(m.sd, 3), _num(m.min, 8), _num(m.max, 8),
                      _num(m.range, 3))
    return t


def _share_text(share: Share) -> tuple[str, str]:
    if share.ratio is None:
        return "NA", share.note
    if share.exactly_zero:
        return "0 (exactly)", share.note
    interval = f"[{share.low:.3g}, {share.high:.3g}]"
    return f"{share.ratio:.3g}", interval + (f"  {share.note}" if share.note else "")


def _shares_table(a: StudyAnalysis) -> Table:
    level = next((s.confidence for d in a.shares.values() for s in d.values()), 0.95)
    t = Table(title="Arithmetic share: variance with the seed fixed / with seeds varied "
                    "(measured; interval: F distribution)", title_justify="left")
    for col in ("metric", "seed fixed in", "share", f"{level:.0%} interval"):
        t.add_column(col, no_wrap=col != f"{level:.0%} interval")
    for metric, shares in a.shares.items():
        for name, share in shares.items():
            t.add_row(metric, name, *_share_text(share))
    return t


def _detect_table(a: StudyAnalysis) -> Table:
    first = a.detect[0]
    t = Table(title=f"Telling two settings apart (estimated: normal approximation, "
                    f"α={first.alpha:g}, power {first.power:g})", title_justify="left")
    for col in ("metric", "sd", "sd from", f"detectable with {first.detectable_at_runs} runs",
                "difference asked", "runs needed per setting"):
        t.add_column(col, justify="left" if col in ("metric", "sd from") else "right")
    for d in a.detect:
        t.add_row(d.metric, _num(d.sd, 3), d.sd_from, _num(d.detectable_diff, 3),
                  _num(d.diff, 3), "NA" if d.runs_needed is None else str(d.runs_needed))
    return t


def _placement_text(placement: list[Placement], ray: dict[str, Any] | None) -> Text:
    where = "".join(f"\n  {p.hardware}: {p.runs} run(s) on {len(p.nodes)} node(s) "
                    f"({', '.join(p.nodes[:4])}{', ...' if len(p.nodes) > 4 else ''})"
                    for p in placement)  # a line each: the hardware's name starts it, whole
    text = f"Ran on:{where or ' NA (no finished run recorded where it ran)'}"
    if ray is not None:
        text += (f"\nRay: {ray['nodes']} node(s) at {ray['address'] or 'ray.init()'}, "
                 f"{ray['cpus_per_replica']:g} CPU(s) and {ray['gpus_per_replica']:g} GPU(s) "
                 "per replica")
    return Text(text)


HARDWARE_OPTIONAL = ("runs per hardware", "F")


def _hardware_table(a: StudyAnalysis) -> ByWidth:
    """A row per metric and condition, each hardware's name whole on its own line in the
    cell; where the terminal is too narrow for them, without the runs per hardware (where
    the runs ran is above the table, a line a hardware) and F (its p is there)."""
    return ByWidth(_hardware_rows(a, ()), lambda need: _hardware_rows(
        a, HARDWARE_OPTIONAL, left_out(HARDWARE_OPTIONAL, need)))


def _hardware_rows(a: StudyAnalysis, without: tuple[str, ...], note: str = "") -> Table:
    caption = "; ".join(["between-hardware share: of the metric's variance; p: of the F test",
                         *([note] if note else [])])
    t = Table(title="Hardware as a source of variance: runs grouped by the hardware they ran "
                    "on (measured; one-way ANOVA, F test)", title_justify="left",
              caption=caption, caption_justify="left")
    columns = [c for c in ("metric", "condition", "runs per hardware", "between-hardware share",
                           "F", "p", "note") if c not in without]
    for col in columns:
        t.add_column(col.replace("between-hardware ", "between-\nhardware\n"),
                     justify="right" if col in ("F", "p", "between-hardware share") else "left",
                     no_wrap=col in ("metric", "condition", "runs per hardware"))
    for h in a.hardware:
        g = h.groups
        cells = {"metric": h.metric, "condition": h.condition,
                 "runs per hardware": "\n".join(f"{name}: {n}" for name, n in g.runs.items()),
                 "between-hardware share": _num(g.share, 3), "F": _num(g.f, 3),
                 "p": _num(g.p, 2), "note": g.note}
        t.add_row(*(cells[c] for c in columns))
    return t


def format_study(a: StudyAnalysis, study: Any, energy_notes: list[str],
                 placement: list[Placement] | None = None,
                 ray: dict[str, Any] | None = None) -> Group:
    """The verdict as rich renderables."""
    command = " ".join(study.command)
    parts: list[Any] = [Text(f"gpuwise repro: {study.runs} run(s) x {len(study.conditions)} "
                             f"condition(s) of `{command}`  (results: {study.results})")]
    if placement or ray is not None:
        parts.append(_placement_text(placement or [], ray))
    parts.append(_conditions_table(a))
    metrics = sorted({m for s in a.conditions.values() for m in s.metrics})
    parts += [_metric_table(a, m) for m in metrics]
    if a.shares:
        parts.append(_shares_table(a))
    if a.hardware:
        parts.append(_hardware_table(a))
    if "deterministic" in a.conditions and "same-seed" in a.conditions:
        energy = a.deterministic_energy_ratio
        parts.append(Text("Deterministic mode over same-seed (measured, wall time per run with "
                          f"start-up): time x{_num(a.deterministic_time_ratio, 3)}, energy "
                          + (f"x{energy:.3g}" if energy is not None else "NA")))
    parts.append(Text("Energy: " + "; ".join(energy_notes)))
    if a.detect:
        parts.append(_detect_table(a))
    for f in a.findings:
        parts.append(Text(f"! {f.message}", style="bold yellow"))
        if f.hint:
            parts.append(Text(f"  hint: {f.hint}"))
    return Group(*parts)
