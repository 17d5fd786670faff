"""`gpuwise advise` and `gpuwise cost`: priced options as a rich table and a JSON record."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.cost import AdviceAnswer, CostAnswer, Header
from gpuwise.catalog.costs import CostAssumptions
from gpuwise.estimate.cost.advise import ROWS_SHOWN, Option
from gpuwise.report.terminal import View, fits_text

SHOWN = ROWS_SHOWN  # rows of the options table unless --all


def _num(value: float | None, fmt: str = ",.0f", none: str = "NA") -> str:
    return none if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    if value is None:
        return "NA"
    if value > 1:
        return "never"
    if value < 0.01:
        return f"{value:.2%}"
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def option_record(o: Option) -> dict[str, Any]:
    c, s = o.cost, o.sizing
    rec: dict[str, Any] = {
        "option": o.label, "mode": c.mode, "meets_target": o.meets,
        "usd_per_month": c.usd_per_month, "cost_breakdown_usd": dict(c.breakdown_usd),
        "usd_per_million_tokens": c.usd_per_million_tokens,
        "usd_per_1000_requests": c.usd_per_1000_requests,
        "tokens_per_month": c.tokens_per_month, "wall_kw": c.wall_kw,
        "kwh_per_month": c.kwh_per_month, "kwh_per_1000_requests": c.kwh_per_1000_requests,
        "co2_kg_per_month": c.co2_kg_per_month, "break_even_utilisation": o.break_even,
        "misses": list(o.misses), "miss_ratio": o.miss_ratio,
        "notes": list(c.notes), "source": "estimated",
    }
    if s is not None:
        hw = s.candidate.hw
        rec.update({
            "hardware": hw.id, "hardware_name": hw.name, "kind": hw.kind,
            "precision": s.precision, "devices": s.devices,
            "devices_per_replica": s.devices_per_replica, "replicas": s.replicas,
            "batch": s.batch,
            "ttft_s": s.ttft_s, "time_per_output_token_s": s.tpot_s,
            "slo_attainment": s.attainment, "simulated_requests": s.run_requests[0],
            "warmup_requests": s.run_requests[1],
            "tokens_per_s_per_replica": s.tokens_per_s, "job_hours": s.job_hours,
            "busy_hours_per_device_month": s.usage.busy_hours,
            "held_hours_per_device_month": s.usage.held_hours,
            "utilisation": s.usage.utilisation, "rates": s.candidate.rates_how,
            "rates_source": s.candidate.rates.source if s.candidate.rates else None,
            "prices": {"list_price_usd": hw.list_price_usd,
                       "cloud_usd_per_hour": hw.cloud_usd_per_hour,
                       "price_source": hw.price_source, "price_date": hw.price_date},
        })
    return rec


def header_record(h: Header) -> dict[str, Any]:
    """The header under its JSON keys (the workload's fields as the load has them)."""
    return {"model": h.model, "workload": dict(vars(h.workload)),
            "workload_kind": h.workload_kind, "target": h.target, "title": h.title,
            "workload_text": h.workload_text}


def assumptions_record(a: CostAssumptions) -> list[dict[str, Any]]:
    return [asdict(x) for x in a.listed()]


def _meets(o: Option) -> Any:
    s = o.sizing
    if s is None:
        return Text("n/c", style="yellow")  # the vendor's latency: not checked
    if o.misses:
        return Text("no: " + ", ".join(o.misses), style="red")
    return fits_text(True)


def _speed(o: Option, training: bool) -> list[str]:
    s = o.sizing
    if training:
        return [_num(s.job_hours, ",.1f") if s else "NA"]
    tpot = s.tpot_s * 1e3 if s and s.tpot_s else None
    ttft = s.ttft_s * 1e3 if s and s.ttft_s else None
    return [_num(tpot, ",.1f"), _num(ttft)]


NARROW = 110  # columns below which the table keeps its first six columns (the rest: --json)


def _options_table(options: tuple[Option, ...], training: bool, title: str) -> Table:
    """One line an option at any width: below NARROW columns without $/Mtok, kWh/mo and kW
    (in the JSON and in `gpuwise cost`), the caption says so."""
    narrow = shutil.get_terminal_size().columns < NARROW
    notes = [] if training else [
        "p90 ms/tok, p90 TTFT: at the load, each replica simulated in steady state"]
    notes.append("busy: the share of the service's hours a device runs steps")
    if narrow:
        notes.append("$/Mtok, kWh/mo, kW: --json, or a terminal of 110 columns")
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False,
                  caption="; ".join(notes), caption_justify="left")
    speed = ("job h",) if training else ("p90 ms/tok", "p90 TTFT")
    wide = () if narrow else ("$/Mtok", "kWh/mo", "kW")
    for col in ("option", "meets", *speed, "busy", "$/month", *wide):
        table.add_column(col, justify="left" if col in ("option", "meets") else "right",
                         no_wrap=col == "option")
    for o in options:
        c, s = o.cost, o.sizing
        cells = [_num(c.usd_per_million_tokens, ",.3f"), _num(c.kwh_per_month),
                 _num(c.wall_kw, ",.2f")]
        table.add_row(Text(o.label), _meets(o), *_speed(o, training),
                      _pct(s.usage.utilisation) if s else "NA", _num(c.usd_per_month),
                      *cells[:len(wide)])
    return table


def _detail(o: Option, training: bool) -> str:
    """The figures the table leaves out, for one option."""
    c, s = o.cost, o.sizing
    out = [f"{k} ${v:,.2f}" for k, v in c.breakdown_usd.items()]
    line = f"cost/month: {', '.join(out)} = ${c.usd_per_month:,.2f}"
    if not training and c.usd_per_1000_requests is not None:
        line += (f"; per 1000 requests ${c.usd_per_1000_requests:,.4f}, "
                 f"{_num(c.kwh_per_1000_requests, ',.4f')} kWh")
    line += f"\nCO2: {_num(c.co2_kg_per_month, ',.1f')} kg/month"
    if s is not None:
        rates = s.candidate.rates.source if s.candidate.rates else "NA"
        line += (f"; {s.replicas} replica(s) of {s.devices_per_replica} device(s), batch "
                 f"{s.batch}; speed from {rates} rates ({s.candidate.rates_how})")
        line += f"\nbuy-vs-rent break-even: {_pct(o.break_even)} of the month's hours"
        hw = s.candidate.hw
        line += (f"\nprices ({hw.id}): list ${hw.list_price_usd:,.0f}, cloud "
                 f"${hw.cloud_usd_per_hour:g}/h; {hw.price_source or 'no source'} "
                 f"({hw.price_date or 'undated'})")
    return "\n".join([line, *c.notes])


def _assumptions_table(a: CostAssumptions) -> Table:
    table = Table(title="assumptions (override with the flag)", title_justify="left",
                  show_edge=False)
    for col in ("assumption", "value", "flag", "source", "date"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for x in a.listed():
        table.add_row(Text(x.name), f"{x.value:g}", x.flag, Text(x.source), x.date)
    return table


def _assumptions(a: CostAssumptions, shown: bool) -> Any:
    """The assumptions table, or the line that says how to see it."""
    if shown:
        return _assumptions_table(a)
    changed = [f"{x.flag} {x.value:g}" for x in a.listed() if x.source.startswith("your ")]
    said = f"; set by you: {', '.join(dict.fromkeys(changed))}" if changed else ""
    return Text(f"assumptions: {len(a.listed())}, each with its source{said} (--assumptions "
                "lists them)")


def advice_view(answer: AdviceAnswer, show_all: bool, show_assumptions: bool = False) -> View:
    """The options table, the recommendation with its reasons, and (with --assumptions, and
    always in the JSON record) the assumptions."""
    header, advice, a, training = answer.header, answer.advice, answer.assumptions, answer.training
    obj = {**header_record(header), "options": [option_record(o) for o in advice.options],
           "recommendation": option_record(advice.choice) if advice.choice else None,
           "reasons": list(advice.reasons),
           "closest": [option_record(o) for o in advice.closest],
           "not_considered": [{"hardware": n, "reason": r} for n, r in advice.skipped],
           "not_sized": [{"hardware": n, "usd_per_month_at_least": c} for n, c in advice.unsized],
           "assumptions": assumptions_record(a)}
    shown = advice.options if show_all else advice.options[:SHOWN]
    title = (f"{header.title} - {len(shown)} of {len(advice.options)} options (estimated: "
             "time model + catalogue prices; 'rates' says spec or measured)")
    parts: list[Any] = [Text(header.workload_text), _options_table(shown, training, title)]
    if advice.closest:
        parts.append(_options_table(advice.closest, training, "closest options"))
    lines = [f"- {r}" for r in advice.reasons]
    if advice.choice is not None:
        lines.append(_detail(advice.choice, training))
    if advice.skipped:
        lines.append(f"not considered: {len(advice.skipped)} (hardware, precision) pairs that "
                     "do not fit or have no speed figures (--json: not_considered)")
    if advice.unsized:
        least = min(c for _, c in advice.unsized)
        lines.append(f"not sized: {len(advice.unsized)} (hardware, precision) pairs whose fewest "
                     f"devices cost more (${least:,.0f}/month or more) than the options shown "
                     "and change no reason (--all sizes every one; --json: not_sized)")
    parts += [Text("recommendation:\n" + "\n".join(lines)), _assumptions(a, show_assumptions)]
    return obj, Group(*parts)


def cost_view(answer: CostAnswer, show_assumptions: bool = False) -> View:
    """One option in detail: its cost breakdown, power, energy and the break-even; the
    assumptions with --assumptions (always in the JSON record)."""
    header, option, a, training = answer.header, answer.option, answer.assumptions, answer.training
    rec = option_record(option)
    obj = {**header_record(header), "option": rec, "assumptions": assumptions_record(a)}
    lines = _detail(option, training)
    table = _options_table((option,), training, header.title)
    return obj, Group(Text(header.workload_text), table, Text(lines),
                      _assumptions(a, show_assumptions))
