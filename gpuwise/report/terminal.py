"""Terminal rendering with rich. `format_*` builds a renderable; the CLI prints it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
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


class ByWidth:
    """`wide` where the console is as wide as `wide` at its narrowest (`least_width`), else
    `narrow(columns)`: chosen as it is printed, so a table keeps whole names at 80 columns
    and every column at 200. `columns` is the width `wide` needs, for the line that says
    where the columns left out are."""

    def __init__(self, wide: Table, narrow: Callable[[int], Any]) -> None:
        self.wide, self.narrow = wide, narrow

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        need = least_width(console, options, self.wide)
        yield self.wide if need <= options.max_width else self.narrow(need)


def least_width(console: Console, options: ConsoleOptions, table: Table) -> int:
    """The width `table` takes with its no_wrap cells on one line and the others wrapped at
    their longest word (rich measures every cell as if it could wrap)."""
    wide = options.update_width(10_000)
    _, right, _, left = table.padding
    total = (left + right) * len(table.columns) - (0 if table.pad_edge else left + right)
    if table.box is not None:
        total += len(table.columns) - 1 + (2 if table.show_edge else 0)
    for col in table.columns:
        sizes = [Measurement.get(console, wide, cell) for cell in (col.header, *col.cells)]
        total += max(col.min_width or 0,
                     *(m.maximum if col.no_wrap else m.minimum for m in sizes))
    return total


def left_out(columns: tuple[str, ...], need: int, what: str = "{}") -> str:
    """The line under a narrowed table: which columns are left out (`what` with their names),
    and where they are."""
    return f"{what.format(', '.join(columns))}: --json, or a terminal of {need} columns"


def fits_text(fits: bool) -> Text:
    return Text("yes", style="green") if fits else Text("no", style="red")


def format_hardware_line(hw: Hardware) -> str:
    bw = f", {hw.memory_bandwidth_gbs:,.0f} GB/s" if hw.memory_bandwidth_gbs else ""
    return f"{hw.name} ({format_bytes(hw.memory_bytes)}{bw}; {hw.source})"


def format_memory(title: str, est: MemoryEstimate, hw: Hardware, extra: dict[str, str]) -> Group:
    table = Table(show_edge=False, caption="share: of the total", caption_justify="left")
    table.add_column("component", no_wrap=True)
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
    head = "headroom" if est.headroom_bytes >= 0 else "short by"
    verdict = {"yes": "yes", "tight": "tight", "no": "NO"}[est.verdict]
    host = "" if est.host_fits else (
        f"; host memory short by {format_bytes(est.host_needed_bytes - est.host_capacity_bytes)}"
        f" of {format_bytes(est.host_capacity_bytes)}")
    lines.append(f"fits:      {verdict} ({head} "
                 f"{format_bytes(abs(est.headroom_bytes))} of {format_bytes(est.capacity_bytes)}"
                 f"{host})")
    lines += [f"{k + ':':<10} {v}" for k, v in extra.items()]
    lines += [f"note:      {n}" for n in est.notes]
    return Group(Text(title), table, Text("\n".join(lines)))


HEAD_CONTEXT = "max context\n(batch 1)"
CHECK_OPTIONAL = ("weight memory", "headroom")  # left out below the table's natural width


def format_check(name: str, hw: Hardware, rows: list[PrecisionRow], context: str) -> Group:
    """The model and its context on a line, the device on the next (its name whole at 80
    columns), then a row a precision: every column where the terminal is wide enough, without
    weight memory and headroom where it is not (said under the table)."""
    head = Text(f"{name}, {context}\non {format_hardware_line(hw)}")
    return Group(head, ByWidth(_check_table(rows, ()), lambda need: _check_table(
        rows, CHECK_OPTIONAL, left_out(CHECK_OPTIONAL, need))))


def _check_table(rows: list[PrecisionRow], without: tuple[str, ...], note: str = "") -> Table:
    notes = ["max context: the longest prompt + new tokens that fit at batch 1"]
    if any(r.device_layers[1] and r.fits for r in rows):
        notes.append("yes, N/M layers: the runtime keeps N of the M layers on the device, "
                     "the rest in host memory")
    table = Table(caption="; ".join([*notes, *([note] if note else [])]),
                  caption_justify="left")
    columns = [c for c in ("weights", "weight memory", "total", "fits", "headroom",
                           "max context", "decode") if c not in without]
    for col in columns:
        table.add_column(col.replace(" ", "\n") if col != "max context" else HEAD_CONTEXT,
                         justify="left" if col == "weights" else "right", no_wrap=True)
    for r in rows:
        cells: dict[str, str | Text] = {
            "weights": r.weights, "weight memory": format_bytes(r.weight_bytes),
            "total": format_bytes(r.total_bytes), "fits": _fits_cell(r),
            "headroom": format_bytes(r.headroom_bytes),
            "max context": _context_cell(r.max_context, r.model_max_context),
            "decode": _decode_cell(r.decode)}
        table.add_row(*(cells[c] for c in columns))
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


# what the memory column holds, by runtime: llama.cpp's is what llama-server takes up front
LOCAL_MEMORY = {"llama.cpp": "memory: what llama-server takes at its default context (--fit: "
                             "the model's, cut to leave 1 GiB free)"}


def format_local(machine_lines: list[str], rows: list[PrecisionRow], context: str,
                 runtime: str = "transformers") -> Group:
    title = f"What runs here ({context}; estimated, {runtime} runtime)"
    memory = LOCAL_MEMORY.get(runtime, "memory: the peak")
    return Group(Text("\n".join(machine_lines)), ByWidth(
        _local_table(rows, title, (), memory=memory),
        lambda need: _local_table(rows, title, ("params",), left_out(("params",), need),
                                  memory)))


def _local_table(rows: list[PrecisionRow], title: str, without: tuple[str, ...],
                 note: str = "", memory: str = "memory: the peak") -> Table:
    caption = "; ".join([f"{memory}; max context: the longest prompt + new tokens that "
                         "fit at batch 1", *([note] if note else [])])
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns = [c for c in ("model", "params", "weights", "memory", "fits", "max context")
               if c not in without]
    for col in columns:
        table.add_column(HEAD_CONTEXT if col == "max context" else col, no_wrap=True,
                         justify="left" if col in ("model", "weights") else "right")
    for r in rows:
        cells: dict[str, str | Text] = {
            "model": r.model, "params": format_count(r.params), "weights": r.weights,
            "memory": format_bytes(r.total_bytes), "fits": fits_text(r.fits),
            "max context": _context_cell(r.max_context, r.model_max_context)}
        table.add_row(*(cells[c] for c in columns))
    return table


HARDWARE_MEANINGS = ("GiB: memory; GB/s: memory bandwidth; TFLOP/s: the dense matrix peak; "
                     "$/h cloud: a device's on-demand price an hour")
WIDE = "--wide's columns ({})"
WIDE_HARDWARE = ("name", "fp8", "TDP W", "link", "list $")


def format_hardware_table(devices: tuple[Hardware, ...], wide: bool = False) -> Any:
    """The catalogue's devices. Ids and aliases are never cut (they are what `--on` takes);
    the narrow table fits 80 columns, `wide` adds the name, fp8, TDP, link and list price
    where the terminal is wide enough for them on one line each (else the narrow table, with
    a line saying so)."""
    if not wide:
        return _hardware_table(devices, False, HARDWARE_MEANINGS)
    return ByWidth(_hardware_table(devices, True, HARDWARE_MEANINGS), lambda need: _hardware_table(
        devices, False, f"{HARDWARE_MEANINGS}; {left_out(WIDE_HARDWARE, need, WIDE)}"))


def _hardware_table(devices: tuple[Hardware, ...], wide: bool, caption: str) -> Table:
    table = Table(title="Hardware catalogue (spec values; dense peaks)", title_justify="left",
                  show_edge=False, caption=caption, caption_justify="left")
    # each id with its aliases under it: as wide as the longest of either, so none is cut
    width = max((len(n) for hw in devices for n in (hw.id, *hw.aliases)), default=0)
    table.add_column("id\naliases (also taken by --on)", overflow="fold", min_width=width,
                     max_width=width)
    if wide:
        table.add_column("name", no_wrap=True)
    for col in ("GiB", "GB/s", "bf16\nTFLOP/s", *(("fp8", "TDP W") if wide else ()), "$/h\ncloud"):
        table.add_column(col, justify="right", no_wrap=True)
    if wide:
        table.add_column("link", max_width=20)
        table.add_column("list $", justify="right", no_wrap=True)
    for hw in devices:
        pk = hw.peak_tflops
        named = Text(hw.id)
        if hw.aliases:
            named.append("\n" + ", ".join(hw.aliases), style="dim")
        cells = [named, *((hw.name,) if wide else ()), f"{hw.memory_gib:,.1f}",
                 f"{hw.memory_bandwidth_gbs:,.0f}", _num(pk.get("bf16"))]
        if wide:
            cells += [_num(pk.get("fp8")), _num(hw.tdp_w)]
        cells.append(_num(hw.cloud_usd_per_hour, 2))
        if wide:
            cells += [hw.interconnect, _num(hw.list_price_usd)]
        table.add_row(*cells)
    return table


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if not value else f"{value:,.{digits}f}"


MODEL_MEANINGS = ("params: every weight; active: the weights a token uses, where fewer "
                  "(mixture of experts)")
WIDE_MODELS = ("hub id", "family", "attention")


def format_models_table(entries: list[tuple[ModelEntry, int, int, str]],
                        wide: bool = False) -> Any:
    """The catalogue's models. Ids and aliases are never cut (they are what MODEL takes); the
    narrow table fits 80 columns, `wide` adds the hub id, family and attention where the
    terminal is wide enough for them (else the narrow table, with a line saying so)."""
    if not wide:
        return _models_table(entries, False, MODEL_MEANINGS)
    return ByWidth(_models_table(entries, True, MODEL_MEANINGS), lambda need: _models_table(
        entries, False, f"{MODEL_MEANINGS}; {left_out(WIDE_MODELS, need, WIDE)}"))


def _models_table(entries: list[tuple[ModelEntry, int, int, str]], wide: bool,
                  caption: str) -> Table:
    table = Table(title="Model catalogue (Hugging Face config.json facts)", title_justify="left",
                  show_edge=False, caption=caption, caption_justify="left")
    table.add_column("id", no_wrap=True)
    if wide:
        table.add_column("hub id", no_wrap=True)
        table.add_column("family", no_wrap=True)
    table.add_column("params", justify="right", no_wrap=True)
    table.add_column("active", justify="right", no_wrap=True)
    if wide:
        table.add_column("attention", no_wrap=True)
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
                  title_justify="left", caption="error: estimated over measured, less 1",
                  caption_justify="left")
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


OPS_MEANINGS = ("x: times a step runs it; FLOP/B: FLOPs a byte moved; share: of the phase's "
                "time; bound: the roof that sets its time (compute or memory)")
OPS_OPTIONAL = (("GFLOP", "MB moved"), ("GFLOP", "MB moved", "kind"))


def format_ops(title: str, phase: Any) -> Any:
    """The per-operation roofline table of one phase: each operation's name whole on its
    line; without GFLOP and MB moved where the terminal is too narrow, and without the kind
    too where the names are long (said under it)."""
    full = _ops_table(phase, ())

    def narrower(need: int, level: int = 0) -> Any:
        without = OPS_OPTIONAL[level]
        table = _ops_table(phase, without, left_out(without, need))
        if level + 1 == len(OPS_OPTIONAL):
            return table
        return ByWidth(table, lambda _: narrower(need, level + 1))

    return Group(Text(title), ByWidth(full, narrower))


def _ops_table(phase: Any, without: tuple[str, ...], note: str = "") -> Table:
    table = Table(show_edge=False, caption="; ".join([OPS_MEANINGS, *([note] if note else [])]),
                  caption_justify="left")
    columns = [c for c in ("op", "kind", "x", "GFLOP", "MB moved", "FLOP/B", "time", "share",
                           "bound") if c not in without]
    for col in columns:
        table.add_column(col, justify="left" if col in ("op", "kind", "bound") else "right",
                         no_wrap=True)
    total = phase.seconds or 1.0

    def add(cells: dict[str, str]) -> None:
        table.add_row(*(cells.get(c, "") for c in columns))

    for t in phase.ops:
        op = t.op
        add({"op": op.name, "kind": op.kind, "x": str(op.count),
             "GFLOP": f"{op.flops * op.count / 1e9:,.2f}",
             "MB moved": f"{op.bytes * op.count / 1e6:,.1f}", "FLOP/B": f"{op.intensity:,.1f}",
             "time": format_seconds(t.seconds), "share": f"{100 * t.seconds / total:.0f}%",
             "bound": t.bound})
    latency = phase.ops_s - sum(t.seconds for t in phase.ops)
    if latency > 0:
        add({"op": "kernel latency", "kind": "fixed", "time": format_seconds(latency),
             "share": f"{100 * latency / total:.0f}%"})
    add({"op": "dispatch overhead", "kind": "fixed", "time": format_seconds(phase.overhead_s),
         "share": f"{100 * phase.overhead_s / total:.0f}%"})
    return table
