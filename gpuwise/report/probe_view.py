"""`gpuwise probe`: run the probe with a progress bar (on a terminal), save it, show it."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text


def probe_view(quick: bool, quiet: bool) -> tuple[Any, Any]:
    from gpuwise.measure.probe import run_probe
    from gpuwise.measure.profile_store import save_profile

    if quiet or not sys.stderr.isatty():
        profile = run_probe(quick)
    else:
        columns = (TextColumn("{task.description:<40}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("probing", total=1.0)
            profile = run_probe(quick, lambda what, done: bar.update(
                task, description=what[:40], completed=done))  # fmt: skip
    profile = _with_runtime(profile)
    path = save_profile(profile)
    record = json.loads(profile.to_json())
    record["saved_to"] = str(path)
    return record, format_profile(profile, str(path))


def _with_runtime(profile: Any) -> Any:
    """Add the transformers runtime's measured costs when torch and transformers are here."""
    import dataclasses

    try:
        from gpuwise.measure.runtime_probe import measure_gemv, measure_runtime_overhead

        runtime: dict[str, Any] = dict(measure_runtime_overhead())
        runtime["gemv"] = measure_gemv()
    except ImportError as exc:
        return dataclasses.replace(profile, missing={**profile.missing,
                                                     "runtime": f"needs transformers ({exc})"})  # fmt: skip
    except Exception as exc:  # a reading that fails is NA with its reason, never a crash
        return dataclasses.replace(profile, missing={**profile.missing, "runtime": repr(exc)})
    return dataclasses.replace(profile, runtime=runtime)


def format_profile(profile: Any, path: str) -> Group:
    table = Table(title=f"Probe of {profile.device} ({profile.backend}, "
                  f"{profile.threads or '?'} threads; measured)", title_justify="left")  # fmt: skip
    for col in ("measurement", "value", "of spec"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for r in profile.bandwidth + profile.links:
        table.add_row(f"{r.kind} bandwidth", "NA" if r.gbs is None else f"{r.gbs:,.1f} GB/s",
                      _fraction(r.fraction_of_spec))  # fmt: skip
    for dtype, best in profile.matmul_best.items():
        value = "NA" if best is None else (f"{best.flops_per_s / 1e9:,.1f} GFLOP/s at "
                                           f"{best.m}x{best.n}x{best.k}")  # fmt: skip
        table.add_row(f"matmul {dtype} (best)", value,
                      _fraction(profile.matmul_fraction_of_spec.get(dtype)))  # fmt: skip
    for name, seconds in profile.overhead_s.items():
        table.add_row(f"per-op overhead ({name})",
                      "NA" if seconds is None else f"{seconds * 1e6:.1f} us", "")  # fmt: skip
    rt = profile.runtime or {}
    for key in ("decode_op_s", "training_op_s"):
        if key in rt:
            table.add_row(f"transformers cost per op ({key.split('_')[0]})",
                          f"{rt[key] * 1e6:.1f} us", "")  # fmt: skip
    for dtype, points in (rt.get("gemv") or {}).items():
        gbs = ", ".join(f"{b / 2**20:.0f} MiB: {r / 1e9:.1f}" for b, r in points)
        table.add_row(f"cold GEMV {dtype} (GB/s)", gbs, "")
    lines = [f"missing: {k}: {v}" for k, v in profile.missing.items()]
    lines += [f"note: {n}" for n in profile.notes]
    lines.append(f"saved to {path}: `--on local` time estimates now use these (source: measured)")
    return Group(table, Text("\n".join(lines)))


def _fraction(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"
