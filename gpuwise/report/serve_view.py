"""`gpuwise serve`'s JSON record and terminal tables (renders app/serve.py's answer only)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.serve import ServeAnswer
from gpuwise.report.records import hardware_record, model_record
from gpuwise.report.terminal import View, format_seconds

LATENCIES = (("time to first token", "ttft_s"), ("time per output token", "tpot_s"),
             ("inter-token latency", "itl_s"), ("end to end", "e2e_s"))  # fmt: skip


def serve_record(a: ServeAnswer) -> dict[str, Any]:
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
           "no_load": {"ttft_s": a.no_load[0], "tpot_s": a.no_load[1]}, **a.result}  # fmt: skip
    if a.sweep is not None:
        rec.update(a.sweep)
    return rec


def _latency_table(rec: dict[str, Any]) -> Table:
    table = Table(title="latency (simulated)", title_justify="left")
    for col in ("", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if not col else "right")
    for label, key in LATENCIES:
        table.add_row(label, *(format_seconds(rec[key][p]) for p in ("p50", "p90", "p99")))
    return table


def _lines(a: ServeAnswer, rec: dict[str, Any]) -> list[str]:
    lines = [f"throughput: {rec['output_tokens_per_s']:,.0f} output tokens/s, "
             f"{rec['requests_per_s']:,.2f} requests/s over {rec['duration_s']:,.1f} s "
             f"({rec['requests']:,} requests; busy {rec['busy_fraction']:.0%})",
             f"no load: time to first token {format_seconds(a.no_load[0])}, "
             f"{format_seconds(a.no_load[1])} a token"]  # fmt: skip
    if a.slo.ttft_s is not None or a.slo.tpot_s is not None:
        lines.append(f"goodput: {rec['goodput_requests_per_s']:,.2f} requests/s meet the "
                     f"targets ({rec['slo_met_fraction']:.0%} of requests)")  # fmt: skip
    lines.append(f"KV cache: peak {rec['kv_peak_fraction']:.0%} in use; "
                 f"{rec['preemptions']:,} preemptions")  # fmt: skip
    if "energy" in rec:
        e = rec["energy"]
        lines.append(f"energy: {e['per_1000_requests_j'] / 3.6e3:,.2f} Wh per 1000 requests, "
                     f"{e['per_output_token_j']:.3g} J an output token, {e['average_w']:,.0f} W "
                     f"on average (compute-bound {e['busy_w']:,.0f} W, memory-bound "
                     f"{e['memory_w']:,.0f} W, idle {e['idle_w']:,.0f} W; "
                     f"{e['compute_bound_share']:.0%} of the busy time compute-bound)")  # fmt: skip
    if "energy" not in rec:
        lines.append(f"energy: not estimated: {a.hardware.name}'s power is not known (a "
                     "catalogue device has its TDP)")  # fmt: skip
    if rec["saturated"]:
        lines.append("saturated: requests arrive faster than the replica answers them; the "
                     "queue grows without bound and so do the latencies (lower --rate, or "
                     "more --gpus)")  # fmt: skip
    return lines


def _curve_table(sweep: dict[str, Any]) -> Table:
    table = Table(title="latency against load (--sweep)", title_justify="left")
    for col in ("requests/s", "TTFT p90", "TPOT p90", "output tok/s", "met", "saturated"):
        table.add_column(col, justify="right")
    for p in sweep["curve"]:
        table.add_row(f"{p['rate']:.3g}", format_seconds(p["ttft_s"]["p90"]),
                      format_seconds(p["tpot_s"]["p90"]), f"{p['output_tokens_per_s']:,.0f}",
                      f"{p['slo_met_fraction']:.0%}", "yes" if p["saturated"] else "")  # fmt: skip
    return table


def serve_view(a: ServeAnswer) -> View:
    rec = serve_record(a)
    load = rec["load"]
    what = (f"{load['rate']:g} requests/s" if load["rate"] else
            f"{load['concurrency']} clients" if load["concurrency"] else f"trace {load['trace']}")  # fmt: skip
    title = (f"{a.model.name} served by {a.plan.runtime} on {a.replicas} x {a.opts.tp} x "
             f"{a.hardware.name}: {what}, prompt {load['prompt']} + {load['new_tokens']} new "
             f"tokens ({a.rates_source})")  # fmt: skip
    parts: list[Any] = [Text(title), _latency_table(rec), Text("\n".join(_lines(a, rec)))]
    if a.sweep is not None:
        knee = a.sweep["max_rate_meeting_slo"]
        parts += [_curve_table(a.sweep), Text(
            f"highest rate meeting the targets for {a.sweep['attainment']:.0%} of requests: "
            + (f"{knee:.3g} requests/s" if knee else "none of the rates tried"))]
    return rec, Group(*parts)
