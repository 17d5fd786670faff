"""Validation suite: estimates vs real runs on this machine, for memory or for time.

Each case builds a catalogue model from its config with random weights, runs it (generate()
or training steps) in a fresh process, and compares:

- memory: the estimate's model memory (total minus the runtime baseline) with the measured
  peak above the process baseline. Targets (issue 2): median |error| <= 3%, worst <= 8%.
- time (`--time`, after `gpuwise probe`): prefill, decode seconds per token and training step
  time, medians after a warm-up. Targets (issue 3): median |error| <= 10%, worst <= 25%.

Run:  .venv/bin/python benchmarks/validate_cpu.py [--time] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from gpuwise.catalog import resolve_model
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.measure.probe.profile import STEADY
from gpuwise.measure.probe.run import others_cpu_s
from gpuwise.measure.validation import validate
from gpuwise.workload import from_config

CASES = [
    ("smollm2-135m", InferencePlan(batch=1, prompt_tokens=512, new_tokens=16, weights="fp32")),
    ("smollm2-135m", InferencePlan(batch=4, prompt_tokens=256, new_tokens=8, weights="bf16")),
    ("qwen2.5-0.5b", InferencePlan(batch=1, prompt_tokens=1024, new_tokens=8, weights="bf16")),
    (
        "gpt2",
        InferencePlan(batch=2, prompt_tokens=512, new_tokens=8, weights="fp32", attention="eager"),
    ),
    ("pythia-160m", InferencePlan(batch=1, prompt_tokens=1024, new_tokens=8, weights="fp32")),
    ("tinyllama-1.1b", InferencePlan(batch=1, prompt_tokens=512, new_tokens=4, weights="bf16")),
    ("gpt2", TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")),
    ("smollm2-135m", TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")),
    ("pythia-70m", TrainingPlan(batch=4, seq=256, dtype="fp32", optimizer="sgd")),
    ("smollm2-135m", TrainingPlan(batch=2, seq=256, dtype="mixed-bf16", optimizer="adamw")),
    (
        "smollm2-135m",
        TrainingPlan(batch=2, seq=512, dtype="fp32", optimizer="adamw", checkpointing=True),
    ),
    (
        "gpt2",
        TrainingPlan(batch=1, seq=512, dtype="fp32", optimizer="adafactor", attention="eager"),
    ),
    ("qwen2.5-0.5b", TrainingPlan(batch=1, seq=256, dtype="bf16", optimizer="adamw")),
]


def describe(plan: InferencePlan | TrainingPlan) -> str:
    if isinstance(plan, InferencePlan):
        return (
            f"infer b{plan.batch} p{plan.prompt_tokens}+{plan.new_tokens} {plan.weights} "
            f"{plan.attention}"
        )
    return f"train b{plan.batch} s{plan.seq} {plan.dtype} {plan.optimizer} {plan.attention}" + (
        " ckpt" if plan.checkpointing else ""
    )


TIME_CASES = [
    ("smollm2-135m", InferencePlan(batch=1, prompt_tokens=256, new_tokens=16, weights="fp32")),
    ("smollm2-135m", InferencePlan(batch=4, prompt_tokens=128, new_tokens=16, weights="bf16")),
    ("qwen2.5-0.5b", InferencePlan(batch=1, prompt_tokens=512, new_tokens=8, weights="bf16")),
    (
        "gpt2",
        InferencePlan(batch=2, prompt_tokens=256, new_tokens=16, weights="fp32", attention="eager"),
    ),
    ("pythia-160m", InferencePlan(batch=1, prompt_tokens=512, new_tokens=16, weights="fp32")),
    ("tinyllama-1.1b", InferencePlan(batch=1, prompt_tokens=128, new_tokens=8, weights="bf16")),
    ("gpt2", TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")),
    ("smollm2-135m", TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")),
    ("pythia-70m", TrainingPlan(batch=4, seq=256, dtype="fp32", optimizer="sgd")),
    ("smollm2-135m", TrainingPlan(batch=2, seq=256, dtype="mixed-bf16", optimizer="adamw")),
    (
        "smollm2-135m",
        TrainingPlan(batch=1, seq=512, dtype="fp32", optimizer="adamw", checkpointing=True),
    ),
    ("qwen2.5-0.5b", TrainingPlan(batch=1, seq=128, dtype="bf16", optimizer="adamw")),
]


def _others_share(before: float | None, started: float) -> float | None:
    """Share of the CPUs that other processes used since `started` (timings are only
    comparable on an idle machine: a busy core stalls every two-thread op)."""
    after = others_cpu_s()
    if before is None or after is None:
        return None
    return (after - before) / ((time.perf_counter() - started) * (os.cpu_count() or 1))


def _machine_now() -> dict[str, float]:
    """This machine's speed now, as the probe measured it: read bandwidth (sum over a 440 MB
    fp32 array, best of 5) and 1024^3 fp32 and bf16 matmuls (median of 5)."""
    import torch

    from gpuwise.helpers import median_call_s

    a = torch.ones(110 * 2**20)
    read = a.numel() * 4 / min(median_call_s(a.sum, 1) for _ in range(5))
    x = torch.rand(1024, 1024)
    matmul = 2 * 1024**3 / median_call_s(lambda: x @ x, 5)
    y = x.bfloat16()
    bf16 = 2 * 1024**3 / median_call_s(lambda: y @ y, 5)
    return {"read_gbs": read / 1e9, "matmul_gflops": matmul / 1e9,
            "matmul_bf16_gflops": bf16 / 1e9}  # fmt: skip


def _machine_at_probe() -> dict[str, float]:
    from gpuwise.measure.profile_store import load_profile

    profile = load_profile()
    if profile is None:
        return {}
    read = [b.gbs for b in profile.bandwidth if b.kind == "read"]

    def matmul(dtype: str) -> float:
        rates = [p.m * p.n * p.k * 2 / p.median_s for p in profile.matmul_points
                 if (p.m, p.n, p.k, p.dtype) == (1024, 1024, 1024, dtype) and p.median_s]  # fmt: skip
        return rates[0] / 1e9 if rates else 0.0

    return {"read_gbs": (read[0] or 0.0) if read else 0.0, "matmul_gflops": matmul("fp32"),
            "matmul_bf16_gflops": matmul("bf16")}  # fmt: skip


def _drift(at_probe: dict[str, float]) -> dict[str, float]:
    """The machine now against the probe (1.0: as fast as when probed): this shared host
    drifts by tens of percent within an hour, and an estimate can only follow the probe."""
    now = _machine_now()
    return {k: now[k] / at_probe[k] for k in now if at_probe.get(k)}




def _steady(drift: dict[str, float], plan: str) -> bool:
    """Whether the machine ran as probed on the rates this plan leans on (bf16 matmuls for a
    bf16 plan): only then can an estimate from that probe be held to the suite's targets."""
    keys = ["read_gbs", "matmul_bf16_gflops" if "bf16" in plan else "matmul_gflops"]
    return all(k in drift and abs(drift[k] - 1.0) <= STEADY for k in keys)


def time_suite(cases: list, out: str) -> None:
    rows = []
    at_probe = _machine_at_probe()
    for i, (name, plan) in enumerate(cases, 1):
        model = resolve_model(name)
        arch = from_config(model.config, name)
        drift = _drift(at_probe)
        started, before = time.perf_counter(), others_cpu_s()
        result = validate(model.config, arch, plan, quiet=True, memory=False, timing=True)
        busy = _others_share(before, started)
        for key, r in result["time"].items():
            if r["error"] is None:
                continue
            rows.append({"model": name, "plan": describe(plan), "quantity": key, **r,
                         "source": result["time_source"], "others_cpu_share": busy,
                         "machine_vs_probe": drift})  # fmt: skip
            print(
                f"[{i}/{len(cases)}] {name:15s} {describe(plan):42s} {key:18s} est "
                f"{r['estimated'] * 1e3:9.2f} ms  meas {r['measured'] * 1e3:9.2f} ms  "
                f"err {100 * r['error']:+6.1f}%  (others used {busy or 0:.0%} of the CPUs; "
                f"machine vs probe: read x{drift.get('read_gbs', 0):.2f}, "
                f"matmul x{drift.get('matmul_gflops', 0):.2f}, "
                f"bf16 x{drift.get('matmul_bf16_gflops', 0):.2f})",
                flush=True,
            )
    errors = [abs(r["error"]) for r in rows]
    steady = [abs(r["error"]) for r in rows if _steady(r["machine_vs_probe"], r["plan"])]
    summary = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "quantities": len(rows), "cases": len(cases), "steady_quantities": len(steady),
               "steady_median_abs_error": statistics.median(steady) if steady else None}  # fmt: skip
    print(
        f"median |error| {100 * summary['median_abs_error']:.1f}%  worst "
        f"{100 * summary['worst_abs_error']:.1f}%  over {len(rows)} times in {len(cases)} cases"
    )
    if steady:
        print(f"where the machine ran within {STEADY:.0%} of the probe: median |error| "
              f"{100 * statistics.median(steady):.1f}%, worst {100 * max(steady):.1f}% over "
              f"{len(steady)} times")  # fmt: skip
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="first three cases only")
    parser.add_argument("--time", action="store_true", help="validate times, not memory")
    parser.add_argument("--out", default="")
    parser.add_argument("--train-only", action="store_true", help="time: training cases only")
    args = parser.parse_args()
    if args.time:
        cases = TIME_CASES[:3] if args.quick else TIME_CASES
        if args.train_only:
            cases = [c for c in cases if isinstance(c[1], TrainingPlan)]
        time_suite(cases,
                   args.out or "benchmarks/results/time.json")  # fmt: skip
        return
    args.out = args.out or "benchmarks/results/memory.json"
    cases = CASES[:3] if args.quick else CASES
    rows = []
    for i, (name, plan) in enumerate(cases, 1):
        model = resolve_model(name)
        arch = from_config(model.config, name)
        start = time.perf_counter()
        result = validate(model.config, arch, plan, quiet=True, timing=False)
        row = {
            "model": name,
            "plan": describe(plan),
            "estimated": result["estimated_model_bytes"],
            "measured": result["measured_model_bytes"],
            "error": result["error"],
            "baseline": result["measured_baseline_bytes"],
            "phase": result["estimated_peak_phase"],
            "seconds": time.perf_counter() - start,
            "versions": result["versions"],
        }
        rows.append(row)
        print(
            f"[{i}/{len(cases)}] {name:15s} {row['plan']:42s} est {row['estimated'] / 2**20:8.1f} "
            f"MiB  meas {row['measured'] / 2**20:8.1f} MiB  err {100 * row['error']:+6.2f}%  "
            f"({row['seconds']:.0f} s)",
            flush=True,
        )
    errors = [abs(r["error"]) for r in rows]
    summary = {
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "cases": len(rows),
    }
    print(
        f"median |error| {100 * summary['median_abs_error']:.2f}%  worst "
        f"{100 * summary['worst_abs_error']:.2f}%  over {len(rows)} cases"
    )
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
