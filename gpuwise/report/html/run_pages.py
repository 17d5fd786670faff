"""The HTML reports of serve, advise, cost, watch --report and repro, each built from the
command's answer and the record `--json` prints (the views in report/), which the page
carries; neither is changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwise.app.cost import AdviceAnswer, CostAnswer
from gpuwise.app.repro import ReproAnswer
from gpuwise.app.serve import ServeAnswer
from gpuwise.app.watch import WatchAnswer
from gpuwise.estimate.serve.sweep import Sweep
from gpuwise.report.cost_view import SHOWN, advice_view, cost_view
from gpuwise.report.html.cost_options import break_even_figure, breakdown_figure, options_figure
from gpuwise.report.html.output import Page
from gpuwise.report.html.page import Section
from gpuwise.report.html.repro_spread import (
    metrics_of,
    runs_record,
    shares_figure,
    spread_figure,
    undrawn_shares,
)
from gpuwise.report.html.serve_curve import kv_figure, percentiles_figure, sweep_figure
from gpuwise.report.html.style import seconds_text
from gpuwise.report.html.watch_timeline import timeline_figure
from gpuwise.report.repro_view import repro_view
from gpuwise.report.serve_view import knee_text, serve_record
from gpuwise.report.watch_view import watch_view


def _sweep_sections(sweep: Sweep, rec: Mapping[str, Any]) -> list[Section]:
    rows = [(f"{p.rate:.3g}", seconds_text(p.summary.ttft_s.p90), seconds_text(p.summary.tpot_s.p90),
             f"{p.summary.output_tokens_per_s:,.0f}", f"{p.summary.slo_met_fraction:.0%}",
             "yes" if p.summary.saturated else "") for p in sweep.curve]
    return [Section("Latency against load", figures=(sweep_figure(rec),), verdict=knee_text(
                sweep, rec["slo"]["ttft_s"] is not None or rec["slo"]["tpot_s"] is not None,
                rec["replicas"])),
            Section("The sweep's points", table=(("requests/s", "TTFT p90", "TPOT p90", "output tok/s",
                                                  "met", "saturated"), *rows))]


def serve_page(answer: ServeAnswer) -> Page:
    rec, s = serve_record(answer), answer.result
    sections = [] if answer.sweep is None else _sweep_sections(answer.sweep, rec)
    figures = [f for f in (percentiles_figure(rec), kv_figure(rec)) if f]
    text = (f"{s.output_tokens_per_s:,.0f} output tokens/s, {s.requests_per_s:,.2f} "
            f"requests/s over {s.duration_s:,.1f} s ({s.requests:,} requests, busy "
            f"{s.busy_fraction:.0%}); KV cache peak {s.kv_peak_fraction:.0%}, "
            f"{s.preemptions:,} preemptions. Simulated (estimated) from {answer.rates_source}.")
    verdict = "saturated: requests arrive faster than the replica answers them" if s.saturated else ""
    if answer.slo.ttft_s is not None or answer.slo.tpot_s is not None:
        verdict = verdict or f"{s.slo_met_fraction:.0%} of requests meet the targets"
    sections.append(Section("The load asked", text=text, verdict=verdict, figures=tuple(figures)))
    title = (f"gpuwise serve: {answer.model.name} on {answer.replicas} x {answer.opts.tp} x "
             f"{answer.hardware.name} ({answer.plan.runtime})")
    return Page(title, tuple(sections), rec)


def advise_page(answer: AdviceAnswer, show_all: bool) -> Page:
    rec, _ = advice_view(answer, show_all, True)
    shown = rec["options"] if show_all else rec["options"][:SHOWN]
    figures = [options_figure(shown, f"{len(shown)} of {len(rec['options'])} options, cheapest first")]
    even = break_even_figure(shown)
    if even:
        figures.append(even)
    choice = rec["recommendation"]
    sections = (Section("Recommendation", verdict=choice["option"] if choice else "no option meets the target",
                        text=rec["workload_text"].replace("\n", "\n\n"), notes=tuple(rec["reasons"])),
                Section("Options", figures=tuple(figures),
                        notes=(f"not considered: {len(rec['not_considered'])} (hardware, precision) "
                               "pairs that do not fit or have no speed figures (in the page's JSON)",)))
    return Page(f"gpuwise advise: {rec['title']}", sections, rec)


def cost_page(answer: CostAnswer) -> Page:
    rec, _ = cost_view(answer, True)
    option = rec["option"]
    figures = [breakdown_figure(option, rec["title"])]
    even = break_even_figure([option])
    if even:
        figures.append(even)
    sections = (Section("Cost", verdict=f"${option['usd_per_month']:,.0f} a month",
                        text=rec["workload_text"].replace("\n", "\n\n"), figures=tuple(figures),
                        notes=tuple(option.get("notes", ()))),)
    return Page(f"gpuwise cost: {rec['title']}", sections, rec)


def watch_page(answer: WatchAnswer) -> Page:
    rec, _ = watch_view(answer)
    verdict = answer.verdict
    figures = (timeline_figure(answer.log, answer.summary, verdict),) if answer.log is not None else ()
    evidence = [f"{f.title}. Evidence: {'; '.join(f.evidence)}."
                + (f" Try: {'; '.join(f.suggestions)}." if f.suggestions else "") for f in verdict.findings]
    first = verdict.findings[0].title if verdict.findings else verdict.bound
    s = answer.summary
    text = (f"{s.steps_total} steps on {s.processes} process(es)"
            + (f", median step {seconds_text(s.step_s_median)}" if s.step_s_median else "")
            + f". Log: {rec.get('log')}. Every reading measured.")
    sections = (Section("Verdict", verdict=first, text=text, figures=figures,
                        notes=tuple(evidence)),)
    return Page("gpuwise watch: " + _command(rec.get("cmd")), sections, rec)


def _command(cmd: Any) -> str:
    if isinstance(cmd, list):
        return " ".join(str(c) for c in cmd)[:120]
    return str(cmd or "the job")


def repro_page(answer: ReproAnswer) -> Page:
    rec, _ = repro_view(answer)
    rec = {**rec, "runs": runs_record(answer.runs)}
    analysis = answer.analysis
    figures = [spread_figure(answer.runs, m) for m in metrics_of(answer.runs)]
    shares = shares_figure(analysis.shares)
    findings = [f.message for f in analysis.findings]
    sections = [Section("Spread per condition", figures=tuple(figures),
                        verdict=findings[0] if findings else "",
                        text=f"{answer.study.runs} run(s) per condition of `{' '.join(answer.study.command)}`.",
                        notes=tuple(findings[1:]))]
    if analysis.shares:
        sections.append(Section("How much is arithmetic noise?", figures=(shares,) if shares else (),
                                notes=tuple(undrawn_shares(analysis.shares)),
                                text="The variance with the seed fixed as a share of the variance with seeds varied: "
                                     "near 1, changing the seed moves results no more than the arithmetic does."))
    return Page("gpuwise repro: " + " ".join(answer.study.command)[:120], tuple(sections), rec)
