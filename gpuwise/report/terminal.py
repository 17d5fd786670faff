"""Terminal rendering with rich. `format_*` builds a renderable; the CLI prints it."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ModelEntry
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.check_rows import DecodeCell, PrecisionRow
from gpuwise.units import format_bytes, format_count, format_tokens

ORDER = ("weights", "gradients", "optimizer", "kv_cache", "activations", "logits", "workspace",
         "fsdp_unsharded", "cublas_workspace", "allocator_slack", "nccl_buffers",
         "overhead")

# What a command hands the CLI to print: (its JSON-able record, a rich renderable)
View = tuple[Any, Any]


def fits_text(fits: bool) -> Text:
    return Text("yes", style="green") if fits else Text("no", style="red")


def format_hardware_line(hw: Hardware) -> str:
    bw = f", {hw.memory_bandwidth_gbs:,.0f} GB/s" if hw.memory_bandwidth_gbs else ""
    return f"{hw.name} ({format_bytes(hw.memory_bytes)}{bw}; {hw.source})"


def format_memory(title: str, est: MemoryEstimate, hw: Hardware, extra: dict[str, str]) -> Group:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("component")
    table.add_column("memory", justify="right")
    table.add_column("share", justify="right")
    for key in ORDER + tuple(k for k in est.breakdown if k not in ORDER):
        if key in est.breakdown and (est.breakdown[key] or key in ("weights", "activations")):
            value = est.breakdown[key]
            table.add_row(key, format_bytes(value), f"{100 * value / est.total_bytes:.1f}%")
    table.add_row(Text("total (estimated)", style="bold"),
                  Text(format_bytes(est.total_bytes), style="bold"), "")
    lines = [
        f"on:        {format_hardware_line(hw)}",
        f"runtime:   {est.runtime}; peak during {est.peak_phase}",
    ]
    head = "headroom" if est.fits else "short by"
    verdict = {"yes": "yes", "tight": "tight", "no": "NO"}[est.verdict]
    lines.append(f"fits:      {verdict} ({head} "
                 f"{format_bytes(abs(est.headroom_bytes))} of {format_bytes(est.capacity_bytes)})")
    lines += [f"{k + ':':<10} {v}" for k, v in extra.items()]
    lines += [f"note:      {n}" for n in est.notes]
    return Group(table, Text("\n".join(lines)))


def format_check(name: str, hw: Hardware, rows: list[PrecisionRow], context: str) -> Table:
    table = Table(title=f"{name} on {format_hardware_line(hw)}, {context}", title_justify="left")
    for col in ("weights", "weight memory", "total", "fits", "headroom", "max context (batch 1)",
                "decode"):
        table.add_column(col, justify="left" if col == "weights" else "right")
    for r in rows:
        table.add_row(r.weights, format_bytes(r.weight_bytes), format_bytes(r.total_bytes),
                      _fits_cell(r), format_bytes(r.headroom_bytes),
                      _context_cell(r.max_context, r.model_max_context), _decode_cell(r.decode))
    return table


def _fits_cell(row: PrecisionRow) -> Text:
    """yes/no, and where the runtime fit it by moving layers off the device, how many stay."""
    on, of = row.device_layers
    if not of or not row.fits:
        return fits_text(row.fits)
    return Text(f"yes, {on}/{of} layers", style="yellow")


def _decode_cell(decode: DecodeCell | None) -> str:
    """A decode step's time under the runtime ("-" where it cannot run this precision)."""
    seconds = decode.s_per_token if decode else None
    return "-" if seconds is None else format_seconds(seconds)


def _context_cell(ctx: int, model_max: int) -> str:
    if ctx == 0:
        return "-"
    if model_max and ctx >= model_max:
        return f"{format_tokens(model_max)} (model limit)"
    return format_tokens(ctx)


def format_local(machine_lines: list[str], rows: list[PrecisionRow], context: str) -> Group:
    table = Table(title=f"What runs here ({context}; estimated, transformers runtime)",
                  title_justify="left")
    for col in ("model", "params", "weights", "memory", "fits", "max context (batch 1)"):
        table.add_column(col, justify="left" if col in ("model", "weights") else "right")
    for r in rows:
        table.add_row(r.model, format_count(r.params), r.weights, format_bytes(r.total_bytes),
                      fits_text(r.fits), _context_cell(r.max_context, r.model_max_context))
    return Group(Text("\n".join(machine_lines)), table)


def format_hardware_table(devices: tuple[Hardware, ...], wide: bool = False) -> Table:
    """The catalogue's devices. Ids and aliases are never cut (they are what `--on` takes);
    the narrow table fits 80 columns, `wide` adds the name, fp8, TDP, link and list price."""
    table = Table(title="Hardware catalogue (spec values; dense peaks)", title_justify="left",
                  show_edge=False)
    table.add_column("id", no_wrap=True)
    if wide:
        table.add_column("name", overflow="fold")
    for col in ("GiB", "GB/s", "bf16\nTFLOP/s", *(("fp8", "TDP W") if wide else ()), "$/h\ncloud"):
        table.add_column(col, justify="right", overflow="fold")
    if wide:
        table.add_column("link", overflow="fold")
        table.add_column("list $", justify="right", overflow="fold")
    table.add_column("aliases (also taken by --on)", overflow="fold",
                     min_width=max((len(a) for hw in devices for a in hw.aliases), default=0))
    for hw in devices:
        pk = hw.peak_tflops
        cells = [hw.id, *((hw.name,) if wide else ()), f"{hw.memory_gib:,.1f}",
                 f"{hw.memory_bandwidth_gbs:,.0f}", _num(pk.get("bf16"))]
        if wide:
            cells += [_num(pk.get("fp8")), _num(hw.tdp_w)]
        cells.append(_num(hw.cloud_usd_per_hour, 2))
        if wide:
            cells += [hw.interconnect, _num(hw.list_price_usd)]
        table.add_row(*cells, ", ".join(hw.aliases))
    return table


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if not value else f"{value:,.{digits}f}"


def format_models_table(entries: list[tuple[ModelEntry, int, int, str]],
                        wide: bool = False) -> Table:
    """The catalogue's models. Ids and aliases are never cut (they are what MODEL takes); the
    narrow table fits 80 columns, `wide` adds the hub id, family and attention."""
    table = Table(title="Model catalogue (Hugging Face config.json facts)", title_justify="left",
                  show_edge=False)
    table.add_column("id", no_wrap=True)
    if wide:
        table.add_column("hub id", overflow="fold")
        table.add_column("family", overflow="fold")
    table.add_column("params", justify="right", no_wrap=True)
    table.add_column("active", justify="right", no_wrap=True)
    if wide:
        table.add_column("attention")
    table.add_column("aliases (also taken as MODEL)", overflow="fold",
                     min_width=max((len(a) for e, *_ in entries for a in e.aliases), default=0))
    for entry, total, active, attention in entries:
        cells = [entry.id, *((entry.hf_id, entry.family) if wide else ()), format_count(total),
                 format_count(active) if active != total else ""]
        if wide:
            cells.append(attention)
        table.add_row(*cells, ", ".join(entry.aliases))
    return table


def format_validation(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Estimate vs measured on this machine (model memory = total minus "
                  "the runtime baseline; times are medians after a warm-up)",
                  title_justify="left")
    for col in ("quantity", "estimated", "measured", "error"):
        table.add_column(col, justify="left" if col == "quantity" else "right")
    for r in rows:
        err = r.get("error")
        fmt = format_seconds if r.get("unit") == "seconds" else format_bytes
        table.add_row(r["quantity"], fmt(r["estimated"]), fmt(r["measured"]),
                      "" if err is None else f"{100 * err:+.1f}%")
    return table


def format_seconds(s: float | None) -> str:
    if s is None:
        return "NA"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def format_ops(title: str, phase: Any) -> Table:
    """The per-operation roofline table of one phase."""
    table = Table(title=title, title_justify="left", show_edge=False)
    for col in ("op", "kind", "x", "GFLOP", "MB moved", "FLOP/B", "time", "share", "bound"):
        table.add_column(col, justify="left" if col in ("op", "kind", "bound") else "right")
    total = phase.seconds or 1.0
    for t in phase.ops:
        op = t.op
        table.add_row(op.name, op.kind, str(op.count), f"{op.flops * op.count / 1e9:,.2f}",
                      f"{op.bytes * op.count / 1e6:,.1f}", f"{op.intensity:,.1f}",
                      format_seconds(t.seconds), f"{100 * t.seconds / total:.0f}%", t.bound)
    latency = phase.ops_s - sum(t.seconds for t in phase.ops)
    if latency > 0:
        table.add_row("kernel latency", "fixed", "", "", "", "", format_seconds(latency),
                      f"{100 * latency / total:.0f}%", "")
    table.add_row("dispatch overhead", "fixed", "", "", "", "", format_seconds(phase.overhead_s),
                  f"{100 * phase.overhead_s / total:.0f}%", "")
    return table
