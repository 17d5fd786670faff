"""`gpuwise plan`'s JSON record and terminal view (renders app/plan.py's answer only)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.plan import PlanAnswer
from gpuwise.estimate.plan.closed_loop import LoadRun
from gpuwise.estimate.plan.frontier import (
    SpeedPoint,
    p90_tpot,
    per_device,
    per_user,
    usd_per_mtok,
)
from gpuwise.estimate.plan.search import Evaluated
from gpuwise.report.records import model_record
from gpuwise.report.serve_view import summary_record
from gpuwise.report.terminal import View, format_seconds

FRONTIER_ROWS = 8


def config_record(e: Evaluated) -> dict[str, Any]:
    c, s = e.config, e.sizing
    return {"label": c.label, "device": c.device, "runtime": c.runtime, "weights": c.weights,
            "kv_dtype": c.kv_dtype, "tp": c.tp, "pp": c.pp, "expert_parallel": c.expert_parallel,
            "disaggregated": c.disagg, "prefill_replicas": s.prefill_replicas if c.disagg else None,
            "max_seqs_share": c.seq_share, "max_batched_tokens_share": c.token_share,
            "replicas": s.replicas, "devices": s.devices, "mode": e.option.cost.mode,
            "usd_per_month": e.cost, "usd_per_million_tokens": usd_per_mtok(e),
            "meets": e.meets, "misses": list(e.option.misses), "p90_ttft_s": s.ttft_s,
            "p90_tpot_s": s.tpot_s, "tokens_per_s_per_device": per_device(e),
            "tokens_per_s_per_user": per_user(e), "source": "estimated"}


def chosen(a: PlanAnswer) -> Evaluated | None:
    """The fleet to run: the search's choice, grown where the re-simulation at clients or a
    trace needed more replicas."""
    return a.chosen if a.chosen is not None else a.best


def _load_record(a: PlanAnswer) -> dict[str, Any]:
    load, asked = a.load, a.asked
    trace = None
    if asked is not None and asked.trace is not None:
        trace = {"path": str(asked.trace), "requests": len(asked.requests),
                 "span_s": asked.span_s}
    return {"kind": asked.kind if asked else "rate", "requests_per_s": load.arrivals_per_s,
            "how": asked.how if asked else "", "concurrency": asked.concurrency if asked else None,
            "trace": trace, "prompt_tokens": load.prompt_tokens,
            "new_tokens": load.output_tokens, "ttft_ms": load.ttft_ms, "tpot_ms": load.tpot_ms,
            "target_utilization": load.max_utilisation}


def _run_record(a: PlanAnswer) -> dict[str, Any] | None:
    r = a.load_run
    if r is None:
        return None
    return {"kind": r.kind, "replicas": r.replicas, "added_replicas": r.added,
            "tried_up_to_replicas": r.tried_up_to, "clients_per_replica": r.clients_per_replica,
            "requests_per_s": r.requests_per_s, "meets": r.meets,
            "run_requests": r.run_requests[0], "run_warmup_requests": r.run_requests[1],
            "rechecked_configurations": r.rechecked, "search_choice": r.search_choice}


def _point_record(e: Evaluated) -> dict[str, Any]:
    """What the cost frontier's plot draws of one sized configuration."""
    return {"label": e.config.label, "device": e.config.device, "runtime": e.config.runtime,
            "usd_per_month": e.cost, "usd_per_million_tokens": usd_per_mtok(e),
            "p90_tpot_s": p90_tpot(e), "p90_ttft_s": e.sizing.ttft_s, "meets": e.meets}


def _knee_record(pt: SpeedPoint) -> dict[str, Any]:
    return {**config_record(pt.evaluated), "knee_requests_per_s": pt.rate,
            "knee_tokens_per_s_per_device": pt.per_device,
            "knee_tokens_per_s_per_user": pt.per_user}


def plan_view(a: PlanAnswer) -> View:
    f = a.found
    best = chosen(a)
    obj: dict[str, Any] = {
        "model": model_record(a.model, a.arch),
        "load": _load_record(a),
        "choice": config_record(best) if best else None,
        "at_load": summary_record(a.at_load, timeline=False) if a.at_load else None,
        "load_run": _run_record(a),
        "command": a.command, "deployment_yaml": a.snippet, "command_note": a.command_note,
        "runners_up": [{**config_record(e), "why": why} for e, why in a.runners_up],
        "speed_frontier": [_knee_record(pt) for pt in a.speed_frontier],
        "speed_points": [_knee_record(pt) for pt in a.speed_points],
        "cost_frontier": [config_record(e) for e in a.cost_frontier],
        "sized": [_point_record(e) for e in f.evaluated],
        "search": {"configurations": f.considered, "sized": len(f.evaluated),
                   "ruled_out": len(f.refused), "left_unsized_by_the_bound": f.unsized,
                   "seconds": a.seconds},
    }
    return obj, Group(*_lines(a))


def _asked_text(a: PlanAnswer) -> str:
    """The load as given, and the rate the search sized at."""
    asked, rate = a.asked, a.load.arrivals_per_s
    if asked is None or asked.kind == "rate":
        return f"{rate:g} requests/s"
    if asked.concurrency is not None:
        return (f"{asked.concurrency:,} clients in a closed loop (searched at {rate:.3g} "
                f"requests/s: {asked.how})")
    return f"the trace {asked.trace} (searched at {rate:.3g} requests/s: {asked.how})"


def _lines(a: PlanAnswer) -> list[Any]:
    load, f, best = a.load, a.found, chosen(a)
    targets = ", ".join(t for t in (
        f"TTFT <= {load.ttft_ms:g} ms" if load.ttft_ms else "",
        f"<= {load.tpot_ms:g} ms per output token" if load.tpot_ms else "") if t)
    out: list[Any] = [Text(
        f"plan {a.model.name}: {_asked_text(a)} of {load.prompt_tokens} "
        f"prompt + {load.output_tokens} new tokens; {targets or 'no latency target'} (p90), "
        f"each replica at most {load.max_utilisation:.0%} of the rate it serves within them")]
    out.append(Text(f"searched {f.considered:,} configurations: {len(f.evaluated)} sized, "
                    f"{len(f.refused)} ruled out (memory, kernels, a request alone too slow), "
                    f"{f.unsized:,} left unsized by the cost bound; {a.seconds:.1f} s "
                    "(estimated: time model + catalogue prices)"))
    if best is None:
        out.append(Text("no configuration meets the targets within the limits; the closest "
                        "are below"))
    else:
        out += [_choice(a, best), _command(a)]
    out.append(_runners_up(a))
    out.append(_frontier(a))
    return out


def _choice(a: PlanAnswer, best: Evaluated) -> Text:
    s = best.sizing
    lines = [f"choice: {best.config.label}, {_replicas(best)} ({s.devices} device(s)), "
             f"{best.option.cost.mode}, ${best.cost:,.0f}/month, "
             f"${usd_per_mtok(best):.3f}/Mtok"]
    r, run = a.at_load, a.load_run
    if r is not None:
        at = _at_text(run)
        for name, p in (("TTFT", r.ttft_s), ("TPOT", r.tpot_s)):
            lines.append(f"  {name} at {at}: p50 {format_seconds(p.p50)}, p90 "
                         f"{format_seconds(p.p90)}, p99 {format_seconds(p.p99)}")
        lines.append(f"  {r.slo_met_fraction:.0%} of requests within the targets; each "
                     f"replica busy {r.busy_fraction:.0%}")
    if run is not None and run.kind != "rate":
        lines.append(f"  {_run_text(run)}")
    return Text("\n".join(lines))


def _replicas(e: Evaluated) -> str:
    s, c = e.sizing, e.config
    width = f"{c.tp}" if c.pp == 1 else f"{c.tp} x {c.pp} stages"
    if c.disagg:
        return (f"{s.prefill_replicas} prefill + {s.replicas - s.prefill_replicas} decode "
                f"replica(s) of {width}")
    return f"{s.replicas} replica(s) of {width}"


def _at_text(run: LoadRun | None) -> str:
    if run is None or run.kind == "rate":
        return "the load"
    if run.clients_per_replica:
        return f"{run.clients_per_replica} clients a replica"
    return "the trace" + (f" (one request in {run.replicas} a replica)" if run.replicas > 1
                          else "")


def _run_text(run: LoadRun) -> str:
    """What the re-simulation at clients or a trace found: the rate sent, replicas added, the
    search's choice where it missed the targets there."""
    sent = (f"the clients sent {run.requests_per_s:.3g} requests/s" if run.clients_per_replica
            else f"the trace's {run.requests_per_s:.3g} requests/s")
    if not run.meets:
        return (f"{sent}; the targets are missed there with up to {run.tried_up_to} "
                f"replica(s) (the search's {run.replicas} shown)")
    out = f"{sent}; {run.replicas} replica(s) meet the targets there"
    if run.added:
        out += f" ({run.added} added to the search's, priced above)"
    if run.search_choice:
        out += (f"; cheaper than the search's choice, {run.search_choice}, once that is grown "
                f"to meet them ({run.rechecked} configurations re-simulated there)")
    return out


def _command(a: PlanAnswer) -> Text:
    text = f"run it:\n  {a.command}"
    if a.command_note:
        text += f"\n  (needs {a.command_note})"
    if a.snippet:
        text += "\n" + a.snippet.rstrip()
    return Text(text)


def _runners_up(a: PlanAnswer) -> Table:
    t = Table(title="runners-up: the next devices and runtimes, and why they lost",
              title_justify="left", show_edge=False)
    t.add_column("configuration", no_wrap=True)
    t.add_column("$/month", justify="right", no_wrap=True)
    t.add_column("p90 TPOT", justify="right", no_wrap=True)
    t.add_column("why not", overflow="fold")
    for e, why in a.runners_up:
        t.add_row(e.config.label, f"{e.cost:,.0f}", format_seconds(p90_tpot(e)), why)
    return t


def _frontier(a: PlanAnswer) -> Table:
    t = Table(title="frontier at each one's knee: tokens/s per device against tokens/s per "
              "user", title_justify="left", show_edge=False)
    t.add_column("configuration", no_wrap=True)
    for col in ("req/s", "tok/s/dev", "tok/s/user", "$/month"):
        t.add_column(col, justify="right", no_wrap=True)
    for pt in a.speed_frontier[:FRONTIER_ROWS]:
        t.add_row(pt.evaluated.config.label, f"{pt.rate:,.2f}", f"{pt.per_device:,.0f}",
                  f"{pt.per_user:,.1f}", f"{pt.evaluated.cost:,.0f}")
    return t
