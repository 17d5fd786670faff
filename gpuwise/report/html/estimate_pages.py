"""The HTML reports of the estimate commands: check, infer, train, module and probe.

Each page is built from the same record `--json` prints (the views in report/), so the page
shows the numbers the JSON holds, and carries that record (with the per-op tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwise.app.check import CheckAnswer
from gpuwise.app.infer import InferAnswer
from gpuwise.app.probe import ProbeAnswer
from gpuwise.app.roofs import Roof, compute_dtype
from gpuwise.app.train import BatchPoint, TrainAnswer
from gpuwise.report.estimate_views import check_view, infer_view, train_view
from gpuwise.report.html.memory import Bar, bar_of, memory_figure, precision_bars
from gpuwise.report.html.output import Page
from gpuwise.report.html.page import Section
from gpuwise.report.html.probe_roofs import bandwidth_figure, matmul_figure, probe_roofline
from gpuwise.report.html.roofline import roofline_figure
from gpuwise.report.html.speed import batch_figure, decode_precision_figure
from gpuwise.report.html.style import gb, seconds_text, si
from gpuwise.report.module_view import module_view
from gpuwise.report.probe_view import probe_view
from gpuwise.report.records import ops_record

MEMORY_SOURCE = "estimated (gpuwise's memory model of {runtime})"
OPS_HEADER = ("operation", "kind", "count", "FLOP", "bytes", "FLOP/byte", "time", "bound", "timed by")


def _memory_source(memory: Mapping[str, Any]) -> str:
    return MEMORY_SOURCE.format(runtime=memory.get("runtime") or "the runtime")


def _time_source(time: Mapping[str, Any]) -> str:
    """Where the rates came from, short enough for a caption (the section says it in full)."""
    how = str(time.get("rates") or "").split(";")[0].split(" (")[0].strip()
    return f"{time.get('source', 'spec')} rates" + (f" ({how})" if how else "")


def ops_table(ops: Sequence[Mapping[str, Any]], limit: int = 40,
              slowest_first: bool = False) -> tuple[tuple[str, ...], ...]:
    """The per-op table in the plan's order (slowest first, and `limit` rows, past `limit`)."""
    if slowest_first or len(ops) > limit:
        ops = sorted(ops, key=lambda o: -o["seconds"])[:limit]
    shown = ops
    rows = [(str(o["op"]), str(o["kind"]), f"{o['count']:,}", si(o["flops"]), si(o["bytes"], "B"),
             "NA" if not o["bytes"] else f"{o['flops'] / o['bytes']:.3g}", seconds_text(o["seconds"]),
             str(o["bound"]), str(o["timed_by"])) for o in shown]
    return (OPS_HEADER, *rows)


def _memory_text(memory: Mapping[str, Any]) -> str:
    return (f"Peak {gb(memory['total_bytes']):,.2f} GiB ({memory['peak_phase']}) of "
            f"{gb(memory['capacity_bytes']):,.2f} GiB: fits {memory['verdict']}, headroom "
            f"{gb(memory['headroom_bytes']):,.2f} GiB. Source: {memory.get('source', 'estimated')}.")


def check_page(answer: CheckAnswer) -> Page:
    rec, _ = check_view(answer)
    device, runtime = answer.hardware.name, answer.plan.runtime
    rows = rec["precisions"]
    capacity = rows[0].get("capacity_bytes") or answer.hardware.memory_bytes
    figures = [memory_figure(precision_bars(rows), capacity, device,
                             "Memory by weight precision", "Peak memory of each weight precision",
                             f"estimated (gpuwise's memory model of {runtime})")]
    decode = decode_precision_figure(rows, device, runtime, f"estimated from {rec['decode_rates']}")
    table = [("weights", "total GiB", "fits", "largest context", "decode ms/token")]
    for r in rows:
        d = r.get("decode", {})
        table.append((str(r["weights"]), f"{gb(r['total_bytes']):,.2f}", str(r.get("verdict") or r["fits"]),
                      f"{r['max_context']:,}", f"{d['s_per_token'] * 1e3:.3g}" if "s_per_token" in d else "NA"))
    fits = rec["precision_that_fits"]
    sections = [
        Section("Will it fit?", verdict=f"highest weight precision that fits: {fits or 'none'}",
                text=f"{answer.model.name} on {device} under {runtime}: batch {answer.plan.batch}, "
                     f"prompt {answer.plan.prompt_tokens} + {answer.plan.new_tokens} new tokens.",
                figures=tuple(figures), table=tuple(table), notes=tuple(rec["notes"])),
    ]
    if decode:
        sections.append(Section("How fast?", figures=(decode,)))
    return Page(f"gpuwise check: {answer.model.name} on {device}", tuple(sections), rec)


def infer_page(answer: InferAnswer, roofs: Sequence[Roof]) -> Page:
    rec, _ = infer_view(answer, True)
    device, plan, memory, time = answer.hardware.name, answer.plan, rec["memory"], rec["time"]
    label = f"batch {plan.batch}, {plan.prompt_tokens}+{plan.new_tokens} tokens, {plan.weights}"
    sections = [Section("Memory", verdict=f"fits: {memory['verdict']}", text=_memory_text(memory),
                        figures=(memory_figure([bar_of(label, memory)], memory["capacity_bytes"], device,
                                               "Memory at the peak", "Peak memory of the plan",
                                               _memory_source(memory)),),
                        notes=tuple(memory.get("notes", ())))]
    if "ops" in rec:
        curve = time.get("throughput_by_batch") or []
        speed = []
        if curve:
            speed.append(batch_figure(
                curve, "tokens_per_s", "decode tokens/s", "decode_s_per_token", "time per token",
                "Decode throughput and latency against batch",
                "Decode tokens/s (all sequences) and time per token at each batch that fits",
                f"estimated from {_time_source(time)}", plan.batch))
        sections.append(Section(
            "Speed", verdict=f"prefill {seconds_text(time['prefill_s'])}, decode "
                             f"{seconds_text(time['decode_s_per_token'])} a token "
                             f"({time['tokens_per_s']:,.1f} tokens/s)",
            text=f"Estimated under {time.get('runtime')} from {time.get('source')} rates: "
                 f"{time.get('rates')}.", figures=tuple(speed)))
        dtype = compute_dtype(plan.weights)
        sections.append(Section(
            "Roofline", figures=(roofline_figure(roofs, rec["ops"], dtype, device, _time_source(time)),)))
        sections.append(Section("Decode operations (one step)", table=ops_table(rec["ops"]["decode"]),
                                text="Prefill's operations are in the page's JSON (ops)."))
    else:
        sections.append(Section("Speed", text=f"not estimated: {time.get('unavailable')}"))
    return Page(f"gpuwise infer: {answer.model.name} on {device} ({plan.runtime})", tuple(sections), rec)


def train_page(answer: TrainAnswer, roofs: Sequence[Roof], sweep: Sequence[BatchPoint]) -> Page:
    rec, _ = train_view(answer, True)
    device, plan, memory, time = answer.hardware.name, answer.plan, rec["memory"], rec["time"]
    if answer.time is not None:
        t = answer.time  # --json --ops prints the forward's; the page has every phase's
        rec = {**rec, "ops": {"forward": ops_record(t.forward), "backward": ops_record(t.backward),
                              "optimizer": ops_record(t.optimizer)}}
    rec = {**rec, "batch_sweep": [
        {"batch": p.batch, "step_s": p.step_s, "tokens_per_s": p.tokens_per_s,
         "memory": {"total_bytes": p.memory.total_bytes, "breakdown": dict(p.memory.breakdown),
                    "verdict": p.memory.verdict, "margin_bytes": p.memory.margin_bytes}}
        for p in sweep]}
    bars = [Bar(f"batch {p.batch}" + (" (the plan)" if p.batch == plan.batch else ""),
                p.memory.breakdown, p.memory.margin_bytes, p.memory.verdict) for p in sweep]
    what = "Peak memory per device at each batch" if bars else "Peak memory per device of the plan"
    bars = bars or [bar_of(f"batch {plan.batch}", memory)]
    sections = [Section("Memory", verdict=f"fits: {memory['verdict']}", text=_memory_text(memory),
                        figures=(memory_figure(bars, memory["capacity_bytes"], device,
                                               f"Memory per device (seq {plan.seq}, {plan.dtype})", what,
                                               _memory_source(memory)),),
                        notes=tuple(memory.get("notes", ())))]
    if answer.time is not None:
        fitting = [{"batch": p.batch, "tokens_per_s": p.tokens_per_s, "step_s": p.step_s}
                   for p in sweep if p.memory.fits]
        speed = [batch_figure(fitting, "tokens_per_s", "tokens/s", "step_s", "step time",
                              "Training throughput and step time against batch",
                              "Tokens/s (all devices) and step time at each batch that fits",
                              f"estimated from {_time_source(time)}", plan.batch)] if fitting else []
        sections.append(Section(
            "Speed", verdict=f"step {seconds_text(time['step_s'])}, {time['tokens_per_s']:,.0f} "
                             f"tokens/s, MFU {time['mfu']:.0%}",
            text=f"Estimated under {time.get('runtime')} from {time.get('source')} rates: "
                 f"{time.get('rates')}.", figures=tuple(speed)))
        sections.append(Section(
            "Roofline", figures=(roofline_figure(roofs, rec["ops"], compute_dtype(plan.dtype), device,
                                                 _time_source(time)),)))
        sections.append(Section("Forward operations (one step)", table=ops_table(rec["ops"]["forward"]),
                                text="Backward's and the optimizer's are in the page's JSON (ops)."))
    else:
        sections.append(Section("Speed", text=f"not estimated: {time.get('unavailable')}"))
    title = f"gpuwise train: {answer.model.name} on {plan.gpus} x {device}"
    return Page(title, tuple(sections), rec)


def module_page(est: Any, inputs: list[str], roofs: Sequence[Roof]) -> Page:
    rec, _ = module_view(est, inputs, True)
    device, memory, time, traced = est.hardware.name, rec["memory"], rec["time"], rec["module"]
    sections = [Section("Memory", verdict=f"fits: {memory['verdict']}", text=_memory_text(memory),
                        figures=(memory_figure([bar_of(traced["name"], memory)], memory["capacity_bytes"],
                                               device, "Memory at the peak", "Peak memory of the module",
                                               "estimated from the module traced on the meta device"),),
                        notes=tuple(memory.get("notes", ())))]
    if "unavailable" not in time and rec.get("ops"):
        phases = rec["ops"]
        sections.append(Section(
            "Roofline", verdict=f"{time['what']}: {seconds_text(time['seconds'])}",
            text=f"Estimated from {_time_source(time)}; {sum(len(v) for v in phases.values())} aten "
                 "operations traced.",
            figures=(roofline_figure(roofs, phases, compute_dtype(traced["dtype"]), device, _time_source(time)),)))
        sections.append(Section("The slowest forward operations", table=ops_table(phases.get("forward", []), limit=25, slowest_first=True)))
    else:
        sections.append(Section("Speed", text=f"not estimated: {time.get('unavailable')}"))
    return Page(f"gpuwise module: {traced['name']} on {device}", tuple(sections), rec)


def probe_page(answer: ProbeAnswer, spec: Roof | None) -> Page:
    rec, _ = probe_view(answer)
    figures = [f for f in (probe_roofline(rec, spec), matmul_figure(rec, spec), bandwidth_figure(rec, spec)) if f]
    trusted = "trusted: `--on local` estimates use it" if rec["trusted"] else "not trusted (see the warnings)"
    notes = [*(f"warning: {w}" for w in rec.get("warnings", ())), *(f"missing: {k}: {v}" for k, v in rec.get("missing", {}).items())]
    sections = [Section(f"Probe of {rec['device']}", verdict=trusted,
                        text=f"Backend {rec['backend']}, {rec.get('threads') or '?'} threads, probed "
                             f"{rec['created_at']}; saved to {rec['saved_to']}.",
                        figures=tuple(figures), notes=_first(notes, 8))]
    return Page(f"gpuwise probe: {rec['device']}", tuple(sections), rec)


def _first(notes: Sequence[str], count: int) -> tuple[str, ...]:
    """The first `count` notes, and how many more the page's JSON holds."""
    if len(notes) <= count:
        return tuple(notes)
    return (*notes[:count], f"and {len(notes) - count} more (in the page's JSON)")
