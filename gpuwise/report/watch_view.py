"""`gpuwise watch` report: where the time and the energy went, and the verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.watch import WatchAnswer
from gpuwise.estimate.watch.summary import ALL_PHASES, WatchSummary
from gpuwise.estimate.watch.verdict import Verdict
from gpuwise.units import format_bytes

PHASE_LABELS = {"data": "waiting for data", "h2d": "host-to-device copy", "forward": "forward",
                "backward": "backward", "optimizer": "optimizer", "other": "other"}


def watch_record(summary: WatchSummary, verdict: Verdict, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: every number with its unit in the key; all `measured` unless the
    key says `estimated` (energy split over phases, per step, per 1000 samples)."""
    record = {"source": "measured", **meta, "verdict": dataclasses.asdict(verdict)}
    record["summary"] = dataclasses.asdict(summary)
    record["summary"]["energy"]["source"] = "measured totals; phase split estimated by time share"
    return record


def format_watch(summary: WatchSummary, verdict: Verdict, meta: dict[str, Any]) -> Group:
    parts: list[Any] = [Text(_headline(summary, meta), style="bold")]
    if summary.steps_total:
        parts.append(_phase_table(summary))
    parts.append(_resources_table(summary))
    if summary.ranks is not None:
        parts.append(_ranks_table(summary))
    for finding in verdict.findings:
        lines = Text(f"\n{finding.title}\n", style="bold yellow")
        for line in finding.evidence:
            lines.append(f"  - {line}\n")
        if finding.suggestions:
            lines.append("  try: " + "; ".join(finding.suggestions) + "\n", style="cyan")
        parts.append(lines)
    missing = dict(meta.get("unavailable", {}))
    for source, why in summary.energy.missing.items():
        if why not in missing.values():
            missing[f"{source}_energy"] = why
    if missing:
        parts.append(Text("unavailable: " + "; ".join(f"{k}: {v}" for k, v in missing.items()),
                          style="dim"))
    for note in meta.get("notes", ()):
        parts.append(Text(f"note: {note}", style="dim"))
    parts.append(Text(f"log: {meta.get('log')}  (re-render: gpuwise watch --report LOG)",
                      style="dim"))
    return Group(*parts)


def _headline(s: WatchSummary, meta: dict[str, Any]) -> str:
    parts = [f"{s.steps_total} steps" + (f" on {s.processes} processes" if s.processes > 1 else "")]
    if s.step_s_median is not None:
        parts.append(
            f"median step {1e3 * s.step_s_median:.1f} ms (p90 {1e3 * (s.step_s_p90 or 0):.1f})"
        )
    if s.samples_per_s:
        parts.append(f"{s.samples_per_s:,.1f} samples/s")
    if meta.get("exit_code") is not None:
        parts.append(f"exit code {meta['exit_code']}")
    return "gpuwise watch (measured): " + ", ".join(parts)


def _phase_table(s: WatchSummary) -> Table:
    n = max(s.steps_timed, 1)
    energy = bool(s.energy.per_phase_j)
    notes = ["per step: the mean over the timed steps; share: of their time"]
    if energy:
        notes.append("energy: the measured energy in steps, split by time share")
    table = Table(title=f"Where each step's time went ({s.steps_timed} steps timed; measured)",
                  title_justify="left", caption="; ".join(notes), caption_justify="left")
    for col in ("phase", "per step", "share", "energy (estimated)")[: 4 if energy else 3]:
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase in ALL_PHASES:
        seconds = s.phase_s.get(phase, 0.0)
        if seconds == 0.0 and phase in ("h2d", "forward", "backward", "optimizer"):
            continue
        label = PHASE_LABELS[phase]
        if phase == "other" and s.source == "inject":
            label = "forward and the rest"
        cells = [label, f"{1e3 * seconds / n:.2f} ms", f"{s.phase_share.get(phase, 0):.1%}"]
        if energy:
            cells.append(f"{s.energy.per_phase_j.get(phase, 0.0):,.1f} J")
        table.add_row(*cells)
    return table


RESOURCE_MEANINGS = {
    "GPU busy": "GPU busy: the share of time a kernel ran (NVML), not how much of the GPU "
                "it used",
    "SM active": "SM active: the share of the GPU's multiprocessors at work (GPM)"}


def _resources_table(s: WatchSummary) -> Table:
    table = Table(title="Machine during the steps", title_justify="left", caption_justify="left")
    table.add_column("reading")
    table.add_column("value", justify="right")
    table.add_column("source")
    e = s.energy
    rows = [("GPU busy", _pct(s.gpu_util_percent), "measured (NVML)"),
            ("SM active", _pct(s.gpu_sm_percent), "measured (NVML GPM)"),
            ("CPU (mean over cores)", _pct(s.cpu_percent), "measured (psutil)"),
            ("I/O wait", _pct(s.iowait_percent), "measured (psutil)"),
            ("operators per step", _num(s.ops_per_step, "{:,.0f}"), "measured"),
            ("time per operator", _num(s.us_per_op, "{:,.1f} us"), "measured"),
            ("one tiny operator on this host", _num(s.dispatch_us, "{:,.1f} us"), "measured"),
            ("energy, whole run", _num(e.job_j, "{:,.0f} J"), _sources(e.sources)),
            ("energy in steps / outside", _pair(e.in_steps_j, e.outside_steps_j), "measured"),
            ("energy waiting for data", _num(e.idle_j, "{:,.1f} J"), "estimated (time share)"),
            ("energy per step", _num(e.per_step_j, "{:,.2f} J"), "measured"),
            ("energy per 1000 samples", _num(e.per_1000_samples_j, "{:,.1f} J"), "measured"),
            ("mean power", _num(e.mean_power_w, "{:,.0f} W"), "measured")]
    for trend in s.memory:
        rows.append((f"{trend.what} memory first -> last {trend.per}",
                     f"{format_bytes(trend.first_bytes)} -> {format_bytes(trend.last_bytes)}",
                     "measured"))
    shown = [(name, value, source) for name, value, source in rows if value != "NA"]
    for name, value, source in shown:  # what is missing is listed, with the reason, below
        table.add_row(name, value, source)
    table.caption = "; ".join(RESOURCE_MEANINGS[name] for name, *_ in shown
                              if name in RESOURCE_MEANINGS) or None
    return table


def _ranks_table(s: WatchSummary) -> Table:
    assert s.ranks is not None
    table = Table(title=f"Ranks (spread of step times {s.ranks.step_spread:.0%}; measured)",
                  title_justify="left", caption_justify="left",
                  caption="medians a step; before sync: all but backward and the optimizer; "
                          "backward includes the wait for slower ranks in the all-reduce")
    for col in ("rank", "steps", "step", "before sync", "data", "backward (incl. wait)"):
        table.add_column(col, justify="right")
    for r in s.ranks.ranks:
        mark = " straggler" if r.rank in s.ranks.stragglers else ""
        table.add_row(f"{r.rank}{mark}", str(r.steps), _ms(r.step_s_median),
                      _ms(r.before_sync_s_median), _ms(r.data_s_median),
                      _ms(r.backward_s_median))
    return table


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


def _pct(value: float | None) -> str:
    return "NA" if value is None else f"{value:.0f}%"


def _num(value: float | None, fmt: str) -> str:
    return "NA" if value is None else fmt.format(value)


def _pair(a: float | None, b: float | None) -> str:
    return "NA" if a is None or b is None else f"{a:,.0f} J / {b:,.0f} J"


def _sources(sources: tuple[str, ...]) -> str:
    return "measured (" + " + ".join(sources) + ")" if sources else ""


def watch_view(answer: WatchAnswer) -> tuple[dict[str, Any], Group]:
    """(JSON record, terminal rendering) of a judged job."""
    return (watch_record(answer.summary, answer.verdict, answer.meta),
            format_watch(answer.summary, answer.verdict, answer.meta))
