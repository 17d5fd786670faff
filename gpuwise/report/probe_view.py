"""Renders `gpuwise probe`'s answer: the measurements, against the spec where it has one."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.probe import ProbeAnswer
from gpuwise.measure.probe.profile import describe_ratios


def probe_view(answer: ProbeAnswer) -> tuple[Any, Any]:
    record = json.loads(answer.profile.to_json())
    record["saved_to"] = str(answer.saved_to)
    record["trusted"] = answer.profile.trusted
    if not answer.profile.trusted:
        record["in_use"] = str(answer.in_use_path) if answer.in_use_path else None
    return record, format_profile(answer.profile, _outcome(answer))


def _outcome(answer: ProbeAnswer) -> str:
    """The one line saying where the probe went and what `--on local` estimates now use."""
    path = answer.saved_to
    if answer.profile.trusted:
        return f"saved to {path}: `--on local` time estimates now use these (source: measured)"
    count = len(answer.profile.warnings)
    kept = (f"keep the profile of {answer.in_use.created_at} ({answer.in_use_path})"
            if answer.in_use else "use datasheet rates until a probe is trusted")
    return (f"not trusted ({count} warning{'s' if count > 1 else ''} above): saved aside to "
            f"{path}; `--on local` time estimates {kept}")


def format_profile(profile: Any, outcome: str) -> Group:
    head = Text(f"Probe of {profile.device} ({profile.backend}, "
                f"{profile.threads or '?'} threads; measured)")
    table = Table(caption="of spec: the reading over the catalogue's figure for this device",
                  caption_justify="left")
    for col in ("measurement", "value", "of spec"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for r in profile.bandwidth + profile.links:
        table.add_row(f"{r.kind} bandwidth", "NA" if r.gbs is None else f"{r.gbs:,.1f} GB/s",
                      _fraction(r.fraction_of_spec))
    for dtype, best in profile.matmul_best.items():
        value = "NA" if best is None else (f"{best.flops_per_s / 1e9:,.1f} GFLOP/s at "
                                           f"{best.m}x{best.n}x{best.k}")
        table.add_row(f"matmul {dtype} (best)", value,
                      _fraction(profile.matmul_fraction_of_spec.get(dtype)))
    for name, seconds in profile.overhead_s.items():
        table.add_row(f"per-op overhead ({name})",
                      "NA" if seconds is None else f"{seconds * 1e6:.1f} us", "")
    rt = profile.runtime or {}
    for key in ("decode_op_s", "training_op_s"):
        if key in rt:
            table.add_row(f"transformers cost per op ({key.split('_')[0]})",
                          f"{rt[key] * 1e6:.1f} us", "")
    if "cold_op_factor" in rt and rt.get("device") != "cuda":  # a GPU's is set to 1, not measured
        table.add_row("  x with the caches cold (as in a model)", f"x{rt['cold_op_factor']:.2f}", "")
    if "decode_vocab_s" in rt:
        table.add_row("generate() logits step (per 1k vocab)",
                      f"{rt['decode_vocab_s'] * 1e9:.1f} us", "")
    for dtype, points in (rt.get("gemv") or {}).items():
        gbs = ", ".join(f"{b / 2**20:.0f} MiB: {r / 1e9:.1f}" for b, r in points)
        table.add_row(f"cold GEMV {dtype} (GB/s)", gbs, "")
    _kernel_rows(table, profile.kernels or {})
    if profile.steadiness:
        table.add_row("at the end against the probe", describe_ratios(profile.steadiness), "")
    lines = [f"missing: {k}: {v}" for k, v in profile.missing.items()]
    lines += [f"note: {n}" for n in profile.notes]
    lines += [f"warning: {w}" for w in getattr(profile, "warnings", ())]
    lines.append(outcome)
    return Group(head, table, Text("\n".join(lines)))


def _fraction(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _kernel_rows(table: Table, kernels: dict[str, Any]) -> None:
    """One line per dtype for each kernel family measured at model shapes."""
    for dtype, grid in kernels.get("linear", {}).items():
        rates = [2 * m * k * n / s for m, k, n, s in grid.get("forward", [])]
        if rates:
            table.add_row(f"linear {dtype} (model shapes)",
                          f"{min(rates) / 1e9:,.1f}-{max(rates) / 1e9:,.1f} GFLOP/s", "")
    for dtype, by_direction in kernels.get("conv", {}).items():
        rates = [2 * p[0] * p[1] * p[2] / p[-1] for key, points in by_direction.items()
                 if key.startswith("forward") for p in points]
        if rates:
            table.add_row(f"conv {dtype} (ResNet's windows and shapes)",
                          f"{min(rates) / 1e9:,.1f}-{max(rates) / 1e9:,.1f} GFLOP/s", "")
    for dtype, modes in kernels.get("sdpa", {}).items():
        prefill = modes.get("prefill") or []
        if prefill:
            q, per_head = prefill[-1]
            rate = 2 * q * q * 2 * 64 / 2 / per_head
            table.add_row(f"sdpa {dtype} causal q={q:.0f}", f"{rate / 1e9:,.1f} GFLOP/s", "")
    for dtype, rates in kernels.get("elementwise", {}).items():
        text = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rates.items())
        table.add_row(f"elementwise {dtype} (GB/s)", text, "")
    fresh = kernels.get("fresh") or {}
    if fresh.get("bytes_per_s"):
        table.add_row("first touch of fresh tensors",
                      f"{fresh['bytes_per_s'] / 1e9:.1f} GB/s", "")
