"""Claim: memory decides what runs. The experiment: what of the model catalogue fits this
machine's memory, at which weight precision (the estimate `gpuwise` prints, for a 2K-token
prompt and 256 new tokens at batch 1), against the memory detected here."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import runtime_for, use
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, RatesUsed, Verdict
from gpuwise.app.local import LOCAL_PRECISIONS, this_machine
from gpuwise.units import format_bytes

ID = "memory"
TITLE = "Memory decides what runs"
CLAIM = ("A model runs on a device only if its weights, KV cache, activations and the "
         "runtime's own buffers fit in that device's memory; precision moves the line.")


def rule(widest: str = LOCAL_PRECISIONS[0]) -> str:
    return (f"holds when the memory estimate rules out at least one catalogue model at the "
            f"widest precision ({widest}): what runs here is then decided by memory")


RULE = rule()


def judge(fits_by_precision: dict[str, dict[str, bool]],
          widest: str = LOCAL_PRECISIONS[0]) -> Verdict:
    """`fits_by_precision[model][precision]`: whether the model fits here at that precision;
    `widest`, the widest precision estimated."""
    if not fits_by_precision:
        return Verdict(None, "no catalogue model was estimated", rule(widest))
    total = len(fits_by_precision)
    at_widest = sum(bool(p.get(widest)) for p in fits_by_precision.values())
    rescued = sum(not p.get(widest) and any(p.values()) for p in fits_by_precision.values())
    never = sum(not any(p.values()) for p in fits_by_precision.values())
    counts = (f"{at_widest} of {total} catalogue models fit at {widest}, {rescued} more only at "
              f"a narrower precision, {never} at none")
    return Verdict(at_widest < total, counts if at_widest < total else
                   f"all {total} catalogue models fit at {widest}: memory rules nothing out "
                   "on this machine", rule(widest))


def run(ctx: Context) -> ClaimResult:
    ctx.step("catalogue memory estimates", 0.0)
    local = this_machine()
    hw = local.hardware
    fits: dict[str, dict[str, bool]] = {}
    needed: dict[str, dict[str, int]] = {}
    params: dict[str, int] = {}
    for row in local.rows:
        fits.setdefault(row.model, {})[row.weights] = row.fits
        needed.setdefault(row.model, {})[row.weights] = int(row.total_bytes)
        params[row.model] = row.params
    # the precisions `gpuwise` estimates here, widest first
    precisions = tuple(dict.fromkeys(row.weights for row in local.rows)) or LOCAL_PRECISIONS
    verdict = judge(fits, precisions[0])
    order = sorted(needed, key=lambda m: params[m])
    fitting = Counter(w for m in fits for w, ok in fits[m].items() if ok)
    table: list[tuple[str, ...]] = [("model", "params", *precisions)]
    for m in order:
        table.append((m, f"{params[m] / 1e9:.2f}B",
                      *(_cell(needed[m][p], fits[m][p]) for p in precisions)))
    series: dict[str, Any] = {
        "memory_bytes": hw.memory_bytes, "models": order, "params": [params[m] for m in order],
        "precisions": list(precisions),
        "needed_bytes": {p: [needed[m][p] for m in order] for p in precisions},
        "fits": {p: [fits[m][p] for m in order] for p in precisions},
    }
    plan = local.plan
    judged = JudgedOn(
        (use(runtime_for("decode", hw.kind), ("generation memory",), plan.runtime,
             ", ".join(precisions), "the estimate is the one `gpuwise` prints"),),
        RatesUsed("detected", f"{format_bytes(hw.memory_bytes)} of {hw.name} detected"))
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"The memory estimate of every catalogue model ({len(order)}) on this machine's "
        f"{hw.name} with {format_bytes(hw.memory_bytes)}, at {', '.join(precisions)} "
        f"weights under {plan.runtime}, for a {plan.prompt_tokens}-token prompt and "
        f"{plan.new_tokens} new tokens at batch {plan.batch} (what `gpuwise` prints).",
        verdict,
        f"{fitting.get(precisions[0], 0)}/{len(order)} fit at {precisions[0]}, "
        f"{fitting.get(precisions[-1], 0)}/{len(order)} at {precisions[-1]} "
        f"({format_bytes(hw.memory_bytes)})",
        (Measurement("device memory", hw.memory_bytes, "bytes", "detected", hw.name),
         *(Measurement(f"models that fit at {p}", fitting.get(p, 0), "models", "estimated")
           for p in precisions)),
        series, tuple(table),
        ("memory of each model: weights, KV cache, activations and the runtime's buffers as "
         "`gpuwise check MODEL` gives them (estimated); checked against real runs by "
         "`gpuwise validate`",),
        judged_on=judged,
    )


def _cell(nbytes: int, fits: bool) -> str:
    return f"{format_bytes(nbytes)} {'fits' if fits else 'no'}"
