"""`gpuwise serve`'s JSON record and terminal tables (renders app/serve.py's answer only)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.serve import ServeAnswer
from gpuwise.estimate.serve.metrics import Energy, Percentiles, ServeSummary
from gpuwise.estimate.serve.sweep import Sweep
from gpuwise.report.records import hardware_record, model_record
from gpuwise.report.terminal import View, format_seconds

# The summary's keys `--json` gives a serve run (docs/serve.md), in their order; a sweep's
# points have all but the KV timeline, after their rate.
SUMMARY_KEYS = ("requests", "duration_s", "ttft_s", "tpot_s", "itl_s", "e2e_s",
                "output_tokens_per_s", "requests_per_s", "goodput_requests_per_s",
                "slo_met_fraction", "preemptions", "kv_peak_fraction", "busy_fraction", "steps",
                "saturated", "kv_timeline", "energy", "steady_state", "warmup_requests")
SWEEP_KEYS = ("curve", "max_rate_meeting_slo", "attainment", "rate_ceiling")


def latencies(s: ServeSummary) -> tuple[tuple[str, Percentiles], ...]:
    return (("time to first token", s.ttft_s), ("time per output token", s.tpot_s),
            ("inter-token latency", s.itl_s), ("end to end", s.e2e_s))


def summary_record(s: ServeSummary, timeline: bool = True) -> dict[str, Any]:
    """The summary under its JSON keys: no `energy` without a power model, no steady-state
    joules without one, no KV timeline where `timeline` is false (a sweep's points)."""
    left_out = {"energy"} if s.energy is None else set()
    left_out |= set() if timeline else {"kv_timeline"}
    rec = {k: v for k, v in asdict(s).items() if k not in left_out}
    rec["steady_state"] = {k: v for k, v in rec["steady_state"].items()
                           if k != "per_output_token_j" or v is not None}
    return rec


def sweep_record(sw: Sweep) -> dict[str, Any]:
    return {"curve": [{"rate": p.rate, **summary_record(p.summary, timeline=False)}
                      for p in sw.curve],
            "max_rate_meeting_slo": sw.max_rate_meeting_slo, "attainment": sw.attainment,
            "rate_ceiling": sw.rate_ceiling}


def serve_record(a: ServeAnswer) -> dict[str, Any]:
    """`gpuwise serve --json`: a new dict each call, made from the answer."""
    load = a.load
    stream = ("trace" if load.trace else "closed loop" if load.concurrency else "poisson")
    rec = {"model": model_record(a.model, a.arch), "hardware": hardware_record(a.hardware),
           "plan": asdict(a.plan), "runtime": a.plan.runtime, "tp": a.opts.tp,
           "replicas": a.replicas, "rates": a.rates_source, "source_kind": "estimated",
           "load": {"stream": stream, "rate": load.rate, "concurrency": load.concurrency,
                    "trace": str(load.trace) if load.trace else None,
                    "prompt": load.lengths.prompt, "new_tokens": load.lengths.output,
                    "prompt_dist": load.lengths.prompt_dist,
                    "output_dist": load.lengths.output_dist, "seed": load.seed},
           "slo": {"ttft_s": a.slo.ttft_s, "tpot_s": a.slo.tpot_s},
           "no_load": {"ttft_s": a.no_load.ttft_s, "tpot_s": a.no_load.tpot_s,
                       "decode_step_s": a.no_load.decode_step_s,
                       "token_host_s": a.no_load.token_host_s},
           **summary_record(a.result), "kv_cache_tokens": a.kv_cache_tokens}
    return rec if a.sweep is None else {**rec, **sweep_record(a.sweep)}


def _latency_table(s: ServeSummary) -> Table:
    after = f" after the first {s.warmup_requests:,} (a warm-up)" if s.warmup_requests else ""
    table = Table(title="latency (simulated)", title_justify="left", caption_justify="left",
                  caption=f"p50, p90, p99: percentiles over the requests{after}; time per output "
                          "token: a request's time after its first token, a token")
    for col in ("", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if not col else "right")
    for label, d in latencies(s):
        table.add_row(label, *(format_seconds(v) for v in (d.p50, d.p90, d.p99)))
    return table


def _energy_line(e: Energy, each: str = "") -> str:
    return (f"energy: {e.per_1000_requests_j / 3.6e3:,.2f} Wh per 1000 requests, "
            f"{e.per_output_token_j:.3g} J an output token, {e.average_w:,.0f} W "
            f"on average{each} (compute-bound {e.busy_w:,.0f} W, memory-bound "
            f"{e.memory_w:,.0f} W, idle {e.idle_w:,.0f} W; "
            f"{e.compute_bound_share:.0%} of the busy time compute-bound)")


def _lines(a: ServeAnswer) -> list[str]:
    s = a.result
    # one replica is simulated: its requests, time, busy share, KV cache and power
    each = f" a replica, of {a.replicas}" if a.replicas > 1 else ""
    lines = [f"throughput: {s.output_tokens_per_s:,.0f} output tokens/s, "
             f"{s.requests_per_s:,.2f} requests/s over {s.duration_s:,.1f} s "
             f"({s.requests:,} requests{each}); busy {s.busy_fraction:.0%}: the share of the "
             f"time {'each' if a.replicas > 1 else 'the'} replica runs steps",
             _no_load_line(a)]
    if a.slo.ttft_s is not None or a.slo.tpot_s is not None:
        lines.append(f"goodput: {s.goodput_requests_per_s:,.2f} requests/s meet the "
                     f"targets ({s.slo_met_fraction:.0%} of requests)")
    whose = " (a replica's)" if a.replicas > 1 else ""
    lines.append(f"KV cache{whose}: peak {s.kv_peak_fraction:.0%} in use; "
                 f"{s.preemptions:,} preemptions")
    if s.energy is not None:
        lines.append(_energy_line(s.energy, " a replica" if a.replicas > 1 else ""))
    else:
        lines.append(f"energy: not estimated: {a.hardware.name}'s power is not known (a "
                     "catalogue device has its TDP)")
    if s.saturated:
        lines.append("saturated: requests arrive faster than the replica answers them; the "
                     "queue grows without bound and so do the latencies (lower --rate, or "
                     "more --gpus)")
    return lines


def _no_load_line(a: ServeAnswer) -> str:
    """One request alone; its time a token is infer's decode step plus the server's host
    work a token, said where the runtime has any."""
    n = a.no_load
    line = (f"no load: time to first token {format_seconds(n.ttft_s)}, "
            f"{format_seconds(n.tpot_s)} a token")
    if n.token_host_s and n.tpot_s:
        line += (f" (the decode step {format_seconds(n.decode_step_s)}, as `gpuwise infer` "
                 f"gives it, + {format_seconds(n.token_host_s)} of the server's host work)")
    return line


def devices_text(replicas: int, tp: int, name: str) -> str:
    """`H100`, `H100, 2 devices (tensor parallel)`, `H100, 4 devices: 2 replicas of 2 devices
    each (tensor parallel)`: the name first, so that a line starting with it keeps it whole."""
    if replicas == 1:
        return name if tp == 1 else f"{name}, {tp} devices (tensor parallel)"
    each = "one device each" if tp == 1 else f"{tp} devices each (tensor parallel)"
    return f"{name}, {replicas * tp} devices: {replicas} replicas of {each}"


def _curve_table(sweep: Sweep, targets: bool, replicas: int) -> Table:
    one = f"; one replica's, of {replicas}: its requests/s and output tok/s" if replicas > 1 else ""
    notes = ["met: the share of requests within the targets"] if targets else []
    notes.append("saturated: the queue grows without bound")
    table = Table(title=f"latency against load (--sweep{one})", title_justify="left",
                  caption="; ".join(notes), caption_justify="left")
    columns = ("requests/s", "TTFT p90", "TPOT p90", "output tok/s", *(("met",) if targets
                                                                      else ()), "saturated")
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for p in sweep.curve:
        s = p.summary
        met = (f"{s.slo_met_fraction:.0%}",) if targets else ()
        table.add_row(f"{p.rate:.3g}", format_seconds(s.ttft_s.p90),
                      format_seconds(s.tpot_s.p90), f"{s.output_tokens_per_s:,.0f}", *met,
                      "yes" if s.saturated else "")
    return table


def knee_text(sweep: Sweep, targets: bool = True, replicas: int = 1) -> str:
    """The highest rate that meets the targets (without targets: that keeps up), said as a
    floor where the highest rate tried met them too."""
    knee = sweep.max_rate_meeting_slo
    what = (f"highest rate meeting the targets for {sweep.attainment:.0%} of requests"
            if targets else "highest rate not saturated (no latency targets given)")
    if not knee:
        return f"{what}: none of the rates tried"
    last = sweep.curve[-1].summary if sweep.curve else None
    floor = (last is not None and not last.saturated
             and last.slo_met_fraction >= sweep.attainment)
    fleet = f" for the {replicas} replicas" if replicas > 1 else ""
    return (f"{what}: {'at least ' if floor else ''}{knee:.3g} requests/s{fleet}"
            + (" (the highest rate tried)" if floor else ""))


def load_text(a: ServeAnswer) -> str:
    load = a.load
    return (f"{load.rate:g} requests/s" if load.rate else
            f"{load.concurrency} clients" if load.concurrency else f"trace {load.trace}")


def serve_view(a: ServeAnswer) -> View:
    load = a.load.lengths
    title = (f"{a.model.name} served by {a.plan.runtime}: {load_text(a)}, prompt {load.prompt} "
             f"+ {load.output} new tokens ({a.rates_source})\n"
             f"on {devices_text(a.replicas, a.opts.tp, a.hardware.name)}")
    parts: list[Any] = [Text(title), _latency_table(a.result), Text("\n".join(_lines(a)))]
    if a.sweep is not None:
        targets = a.slo.ttft_s is not None or a.slo.tpot_s is not None
        parts += [_curve_table(a.sweep, targets, a.replicas),
                  Text(knee_text(a.sweep, targets, a.replicas))]
    return serve_record(a), Group(*parts)
