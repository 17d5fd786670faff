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
    table = Table(title="latency (simulated)", title_justify="left")
    for col in ("", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if not col else "right")
    for label, d in latencies(s):
        table.add_row(label, *(format_seconds(v) for v in (d.p50, d.p90, d.p99)))
    return table


def _energy_line(e: Energy) -> str:
    return (f"energy: {e.per_1000_requests_j / 3.6e3:,.2f} Wh per 1000 requests, "
            f"{e.per_output_token_j:.3g} J an output token, {e.average_w:,.0f} W "
            f"on average (compute-bound {e.busy_w:,.0f} W, memory-bound "
            f"{e.memory_w:,.0f} W, idle {e.idle_w:,.0f} W; "
            f"{e.compute_bound_share:.0%} of the busy time compute-bound)")


def _lines(a: ServeAnswer) -> list[str]:
    s = a.result
    lines = [f"throughput: {s.output_tokens_per_s:,.0f} output tokens/s, "
             f"{s.requests_per_s:,.2f} requests/s over {s.duration_s:,.1f} s "
             f"({s.requests:,} requests; busy {s.busy_fraction:.0%})",
             _no_load_line(a)]
    if a.slo.ttft_s is not None or a.slo.tpot_s is not None:
        lines.append(f"goodput: {s.goodput_requests_per_s:,.2f} requests/s meet the "
                     f"targets ({s.slo_met_fraction:.0%} of requests)")
    lines.append(f"KV cache: peak {s.kv_peak_fraction:.0%} in use; "
                 f"{s.preemptions:,} preemptions")
    if s.energy is not None:
        lines.append(_energy_line(s.energy))
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
    """`2 replicas of 4 x H100`, `4 x H100` (one replica), `H100`."""
    one = f"{tp} x {name}" if tp > 1 else name
    return one if replicas == 1 else f"{replicas} replicas of {one}"


def _curve_table(sweep: Sweep) -> Table:
    table = Table(title="latency against load (--sweep)", title_justify="left")
    for col in ("requests/s", "TTFT p90", "TPOT p90", "output tok/s", "met", "saturated"):
        table.add_column(col, justify="right")
    for p in sweep.curve:
        s = p.summary
        table.add_row(f"{p.rate:.3g}", format_seconds(s.ttft_s.p90),
                      format_seconds(s.tpot_s.p90), f"{s.output_tokens_per_s:,.0f}",
                      f"{s.slo_met_fraction:.0%}", "yes" if s.saturated else "")
    return table


def knee_text(sweep: Sweep) -> str:
    knee = sweep.max_rate_meeting_slo
    return (f"highest rate meeting the targets for {sweep.attainment:.0%} of requests: "
            + (f"{knee:.3g} requests/s" if knee else "none of the rates tried"))


def load_text(a: ServeAnswer) -> str:
    load = a.load
    return (f"{load.rate:g} requests/s" if load.rate else
            f"{load.concurrency} clients" if load.concurrency else f"trace {load.trace}")


def serve_view(a: ServeAnswer) -> View:
    load = a.load.lengths
    title = (f"{a.model.name} served by {a.plan.runtime} on "
             f"{devices_text(a.replicas, a.opts.tp, a.hardware.name)}: {load_text(a)}, prompt {load.prompt} + {load.output} new "
             f"tokens ({a.rates_source})")
    parts: list[Any] = [Text(title), _latency_table(a.result), Text("\n".join(_lines(a)))]
    if a.sweep is not None:
        parts += [_curve_table(a.sweep), Text(knee_text(a.sweep))]
    return serve_record(a), Group(*parts)
