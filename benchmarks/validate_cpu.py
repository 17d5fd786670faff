"""Validation suite: estimates vs real runs on this machine, for memory or for time.

Each case builds a catalogue model from its config with random weights, runs it (generate()
or training steps) in a fresh process, and compares:

- memory: the estimate's model memory (total minus the runtime baseline, the allocator's row
  included) with the peak resident set above the process baseline, as users run it (glibc's
  default allocator), the median of three fresh processes; beside it the live tensors alone
  (glibc pinned at a 64 KiB mmap threshold) against the estimate less its allocator row.
  Targets (issue 24): median |error| <= 3%, worst <= 8%.
- time (`--time`, after `gpuwise probe`): prefill, decode seconds per token and training step
  time, medians after a warm-up. Targets (issue 3): median |error| <= 10%, worst <= 25%.

Run:  .venv/bin/python benchmarks/validate_cpu.py [--passes N] [--quick] [--out FILE]
      .venv/bin/python benchmarks/validate_cpu.py --time [--passes N] [--allocator-split]

The results go to benchmarks/results/cpu_memory.json (memory) or cpu_time.json (`--time`)
unless `--out` names another file.

With `--allocator-split` each case is timed again under an allocator that faults nothing in
after the warm-up (`module_run.NO_FAULTS_ENV`): the estimate less its page faults is checked
against that run, and the faults' charged cost against their measured one.

A time case whose run the estimate puts over `--case-budget-s` (a warm-up and five repeats)
is not run: it is listed as skipped, with its estimate (on a CPU without bf16 instructions,
one bf16 training step of Qwen2.5-0.5B is estimated at minutes).

With `--passes N` the time suite runs N times over; each row is then the median of its N
measurements against the estimate, and every pass's own median and worst are printed too
(a host whose speed moves within minutes is measured at its typical speed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpuwise.app.validate import MEMORY_PASSES, plan_kwargs, validate
from gpuwise.catalog import resolve_model
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.roofline import without_faults
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.measure.hardware.detect import detect_local
from gpuwise.measure.probe.profile import STEADY
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.measure.probe.run import others_cpu_s
from gpuwise.measure.runs import time_run as timerun
from gpuwise.measure.runs.module_run import NO_FAULTS_ENV
from gpuwise.workload import Architecture, from_config


def _i(batch: int, prompt: int, new: int, weights: str, attention: str = "sdpa") -> InferencePlan:
    return InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new, weights=weights,
                         attention=attention)  # fmt: skip


def _t(batch: int, seq: int, dtype: str, optimizer: str = "adamw", **more: Any) -> TrainingPlan:
    return TrainingPlan(batch=batch, seq=seq, dtype=dtype, optimizer=optimizer, **more)


# The default-process suite (issue 24): four families, inference and training, fp32 and bf16,
# sdpa and eager, AdamW, SGD and Adafactor, checkpointing and LoRA; small enough that three
# processes a case (and one for the live-tensor reading) run in about a quarter of an hour on
# two cores.
CASES = [
    ("smollm2-135m", _i(1, 512, 16, "fp32")),
    ("smollm2-135m", _i(4, 256, 8, "bf16")),
    ("smollm2-135m", _i(1, 256, 8, "fp32", "eager")),
    ("smollm2-360m", _i(1, 512, 8, "bf16")),
    ("qwen2.5-0.5b", _i(1, 512, 8, "bf16")),
    ("qwen2.5-0.5b", _i(1, 256, 8, "fp32")),
    ("gpt2", _i(2, 512, 8, "fp32", "eager")),
    ("gpt2", _i(1, 256, 16, "bf16")),
    ("pythia-160m", _i(1, 1024, 8, "fp32")),
    ("pythia-70m", _i(4, 512, 8, "fp32", "eager")),
    ("gpt2", _t(2, 256, "fp32")),
    ("gpt2", _t(1, 512, "fp32", "adafactor", attention="eager")),
    ("gpt2", _t(2, 256, "fp32", "sgd", checkpointing=True)),
    ("smollm2-135m", _t(2, 256, "fp32")),
    ("smollm2-135m", _t(2, 256, "mixed-bf16")),
    ("smollm2-135m", _t(2, 512, "fp32", checkpointing=True)),
    ("smollm2-135m", _t(1, 256, "bf16", "sgd")),
    ("smollm2-135m", _t(2, 256, "fp32", finetune="lora")),
    ("pythia-70m", _t(4, 256, "fp32", "sgd")),
    ("pythia-160m", _t(2, 256, "fp32", attention="eager")),
    ("qwen2.5-0.5b", _t(1, 128, "bf16")),
    ("qwen2.5-0.5b", _t(1, 256, "bf16", finetune="lora", checkpointing=True)),
]


def describe(plan: InferencePlan | TrainingPlan) -> str:
    if isinstance(plan, InferencePlan):
        return (
            f"infer b{plan.batch} p{plan.prompt_tokens}+{plan.new_tokens} {plan.weights} "
            f"{plan.attention}"
        )
    return f"train b{plan.batch} s{plan.seq} {plan.dtype} {plan.optimizer} {plan.attention}" + (
        " ckpt" if plan.checkpointing else ""
    ) + (f" {plan.finetune} r{plan.lora_rank}" if plan.finetune != "full" else "")


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
    # fp32 twins of bf16 cases: a CPU without bf16 instructions skips those (half a minute a
    # 512-token prefill, minutes a step), and still runs 12 cases
    ("qwen2.5-0.5b", InferencePlan(batch=1, prompt_tokens=512, new_tokens=8, weights="fp32")),
    ("qwen2.5-0.5b", TrainingPlan(batch=1, seq=128, dtype="fp32", optimizer="adamw")),
    ("pythia-160m", TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")),
]


def _others_share(before: float | None, started: float) -> float | None:
    """Share of the CPUs that other processes used since `started` (timings are only
    comparable on an idle machine: a busy core stalls every two-thread op)."""
    after = others_cpu_s()
    if before is None or after is None:
        return None
    return (after - before) / ((time.perf_counter() - started) * (os.cpu_count() or 1))


def ran_as_probed(drift: dict[str, float], plan: str) -> bool:
    """Whether the machine ran as probed on the rates this plan leans on (bf16 matmuls for a
    bf16 plan): only then can an estimate from that probe be held to the suite's targets."""
    keys = ["read", "matmul_bf16" if "bf16" in plan else "matmul_fp32"]
    return all(k in drift and abs(drift[k] - 1.0) <= STEADY for k in keys)


def _without_faults(config: dict, arch: Architecture,
                    plan: InferencePlan | TrainingPlan) -> dict[str, dict[str, float]]:  # fmt: skip
    """Each quantity's estimate with no page fault charged, and its time measured under an
    allocator that faults nothing in after the warm-up (`NO_FAULTS_ENV`): the model less its
    faults against runs without them, and what the faults cost against what is charged."""
    rates, _ = rates_for(detect_local(use_torch=True).best_device())
    if rates is None or rates.kernels is None:
        return {}
    quiet = without_faults(rates)
    kwargs = plan_kwargs(plan, "cpu")
    if isinstance(plan, InferencePlan):
        m = timerun.time_inference(config, malloc_env=NO_FAULTS_ENV, **kwargs)
        t = estimate_inference_time(arch, plan, quiet)
        pairs = {"prefill_s": (t.prefill_s, m.prefill_s),
                 "decode_s_per_token": (t.decode_s_per_token, m.decode_s_per_token)}  # fmt: skip
    else:
        m = timerun.time_training(config, malloc_env=NO_FAULTS_ENV, **kwargs)
        pairs = {"step_s": (estimate_training_time(arch, plan, quiet).step_s, m.step_s)}
    return {key: {"estimated_without_faults": est, "measured_without_faults": meas}
            for key, (est, meas) in pairs.items() if meas}  # fmt: skip


def _print_without_faults(row: dict, quiet: dict[str, float]) -> None:
    est, meas = quiet["estimated_without_faults"], quiet["measured_without_faults"]
    print(f"      without page faults: est {est * 1e3:9.2f} ms  meas {meas * 1e3:9.2f} ms  "
          f"err {100 * (est / meas - 1):+6.1f}%;  the faults: charged "
          f"{1e3 * (row['estimated'] - est):7.1f} ms, cost {1e3 * (row['measured'] - meas):7.1f} ms",
          flush=True)  # fmt: skip


def estimated_run_s(arch: Architecture, plan: InferencePlan | TrainingPlan,
                    rates: DeviceRates, repeats: int = 5) -> float:  # fmt: skip
    """Seconds the estimate gives a timed run of the case: a warm-up and `repeats` calls
    (inference: a one-token and a full generate() each)."""
    if isinstance(plan, TrainingPlan):
        return (1 + repeats) * estimate_training_time(arch, plan, rates).step_s
    t = estimate_inference_time(arch, plan, rates)
    full = t.prefill_s + (plan.new_tokens - 1) * t.decode_s_per_token
    return (1 + repeats) * (t.prefill_s + full)


def _within_budget(cases: list, budget_s: float) -> tuple[list, list[dict]]:
    """The cases whose run the estimate puts within `budget_s`, and the others (printed)."""
    rates, _ = rates_for(detect_local(use_torch=True).best_device())
    if rates is None or budget_s == math.inf:
        return cases, []
    kept, skipped = [], []
    for name, plan in cases:
        run_s = estimated_run_s(from_config(resolve_model(name).config, name), plan, rates)
        if run_s <= budget_s:
            kept.append((name, plan))
            continue
        print(f"skipped: {name} {describe(plan)}: its run is estimated at {run_s:.0f} s, over "
              f"the {budget_s:.0f} s a case may take (--case-budget-s)", flush=True)  # fmt: skip
        skipped.append({"model": name, "plan": describe(plan), "estimated_run_s": run_s})
    return kept, skipped


def _time_case(i: int, cases: list, name: str, plan: InferencePlan | TrainingPlan,
               split: bool = False) -> list[dict]:  # fmt: skip
    """One real run of a case (in a fresh process), its rows: one per timed quantity; with
    `split`, a second run under an allocator that faults nothing in."""
    model = resolve_model(name)
    arch = from_config(model.config, name)
    started, before = time.perf_counter(), others_cpu_s()
    result = validate(model.config, arch, plan, quiet=True, memory=False, timing=True)
    busy = _others_share(before, started)
    drift = result.get("time_machine_vs_probe") or {}
    quiet = _without_faults(model.config, arch, plan) if split else {}
    rows = []
    for key, r in result["time"].items():
        if r["error"] is None:
            continue
        rows.append({"model": name, "plan": describe(plan), "quantity": key, **r,
                     "source": result["time_source"], "others_cpu_share": busy,
                     "machine_vs_probe": drift, **quiet.get(key, {})})  # fmt: skip
        print(
            f"[{i}/{len(cases)}] {name:15s} {describe(plan):42s} {key:18s} est "
            f"{r['estimated'] * 1e3:9.2f} ms  meas {r['measured'] * 1e3:9.2f} ms  "
            f"err {100 * r['error']:+6.1f}%  (others used {busy or 0:.0%} of the CPUs; "
            f"machine vs probe: read x{drift.get('read', 0):.2f}, "
            f"matmul x{drift.get('matmul_fp32', 0):.2f}, "
            f"bf16 x{drift.get('matmul_bf16', 0):.2f})",
            flush=True,
        )
        slow = r.get("estimated_slow_faults")
        if slow:
            print(f"      page faults at the probe's slow first touch: est {slow * 1e3:9.2f} "
                  f"ms; measured {'within' if r['measured'] <= slow else 'past'} the range",
                  flush=True)  # fmt: skip
        if key in quiet:
            _print_without_faults(r, quiet[key])
    return rows


def _over_passes(passes: list[list[dict]]) -> list[dict]:
    """Each row measured in every pass: its median measurement against the estimate (the
    first pass's row, with the passes' measurements, errors and machine checks added)."""
    merged = []
    for same in zip(*passes, strict=True):
        measured = statistics.median(r["measured"] for r in same)
        estimated = same[0]["estimated"]
        row = {**same[0], "measured": measured, "error": estimated / measured - 1,
               "measured_passes": [r["measured"] for r in same],
               "error_passes": [r["error"] for r in same],
               "machine_vs_probe_passes": [r["machine_vs_probe"] for r in same]}  # fmt: skip
        if all("measured_without_faults" in r for r in same):
            row["measured_without_faults"] = statistics.median(
                r["measured_without_faults"] for r in same)
        merged.append(row)
    return merged


def _range_summary(rows: list[dict]) -> dict[str, int]:
    """How many training steps ran between their estimate's two first-touch rates."""
    ranged = [r for r in rows if r.get("estimated_slow_faults")]
    if not ranged:
        return {}
    inside = sum(r["estimated"] <= r["measured"] <= r["estimated_slow_faults"] for r in ranged)
    below = sum(r["measured"] < r["estimated"] for r in ranged)
    print(f"training steps between the estimate and its faults at the probe's slow first "
          f"touch: {inside} of {len(ranged)} ({below} faster than the estimate)")  # fmt: skip
    return {"steps_in_fault_range": inside, "steps_below_estimate": below,
            "steps_with_fault_range": len(ranged)}  # fmt: skip


def _split_summary(rows: list[dict]) -> dict[str, float]:
    """The model less its faults against fault-free runs, and the faults' cost: charged
    against measured (the default allocator's time less the fault-free one), summed."""
    split = [r for r in rows if r.get("measured_without_faults")]
    if not split:
        return {}
    errors = [abs(r["estimated_without_faults"] / r["measured_without_faults"] - 1) for r in split]
    out = {"median_abs_error_without_faults": statistics.median(errors),
           "worst_abs_error_without_faults": max(errors),
           "fault_s_estimated": sum(r["estimated"] - r["estimated_without_faults"] for r in split),
           "fault_s_measured": sum(r["measured"] - r["measured_without_faults"] for r in split)}  # fmt: skip
    print(f"without page faults (estimate less its faults, runs that fault nothing in): median "
          f"|error| {100 * out['median_abs_error_without_faults']:.1f}%  worst "
          f"{100 * out['worst_abs_error_without_faults']:.1f}% over {len(split)} times; the "
          f"faults cost {out['fault_s_measured']:.2f} s measured, {out['fault_s_estimated']:.2f} s "
          f"charged")  # fmt: skip
    return out


def time_suite(cases: list, out: str, passes: int = 1, split: bool = False,
               budget_s: float = math.inf) -> None:  # fmt: skip
    cases, skipped = _within_budget(cases, budget_s)
    runs = []
    for n in range(passes):
        if passes > 1:
            print(f"pass {n + 1} of {passes}", flush=True)
        runs.append([row for i, (name, plan) in enumerate(cases, 1)
                     for row in _time_case(i, cases, name, plan, split)])  # fmt: skip
    rows = runs[0] if passes == 1 else _over_passes(runs)
    errors = [abs(r["error"]) for r in rows]
    steady = [abs(r["error"]) for r in rows if ran_as_probed(r["machine_vs_probe"], r["plan"])]
    summary = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "quantities": len(rows), "cases": len(cases), "steady_quantities": len(steady),
               "steady_median_abs_error": statistics.median(steady) if steady else None,
               "passes": passes, "skipped_cases": skipped}  # fmt: skip
    if passes > 1:
        each = [[abs(r["error"]) for r in run] for run in runs]
        summary["per_pass"] = [{"median_abs_error": statistics.median(e),
                                "worst_abs_error": max(e)} for e in each]  # fmt: skip
        for k, e in enumerate(each, 1):
            print(f"pass {k}: median |error| {100 * statistics.median(e):.1f}%  worst "
                  f"{100 * max(e):.1f}%")  # fmt: skip
        print(f"each row's median over the {passes} passes against its estimate:")
    print(
        f"median |error| {100 * summary['median_abs_error']:.1f}%  worst "
        f"{100 * summary['worst_abs_error']:.1f}%  over {len(rows)} times in {len(cases)} cases"
    )
    if steady and passes == 1:
        print(f"where the machine ran within {STEADY:.0%} of the probe: median |error| "
              f"{100 * statistics.median(steady):.1f}%, worst {100 * max(steady):.1f}% over "
              f"{len(steady)} times")  # fmt: skip
    summary.update(_range_summary(rows))
    summary.update(_split_summary(rows))
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


def _memory_row(i: int, cases: list, name: str, plan: InferencePlan | TrainingPlan,
                passes: int) -> dict:  # fmt: skip
    """One case: the estimate against the median of `passes` fresh processes with the default
    allocator, and the live-tensor reading (glibc pinned) beside it."""
    model = resolve_model(name)
    arch = from_config(model.config, name)
    start = time.perf_counter()
    result = validate(model.config, arch, plan, quiet=True, timing=False, memory_passes=passes)
    live = result.get("live") or {}
    row = {"model": name, "plan": describe(plan), "estimated": result["estimated_model_bytes"],
           "measured": result["measured_model_bytes"], "error": result["error"],
           "estimated_allocator": result["estimated_allocator_bytes"],
           "measured_passes": result["measured_passes_model_bytes"],
           "live_estimated": live.get("estimated"), "live_measured": live.get("measured"),
           "live_error": live.get("error"), "baseline": result["measured_baseline_bytes"],
           "malloc": result["measured_malloc"], "phase": result["estimated_peak_phase"],
           "seconds": time.perf_counter() - start, "versions": result["versions"]}  # fmt: skip
    spread = (max(row["measured_passes"]) - min(row["measured_passes"])) / 2**20
    print(f"[{i}/{len(cases)}] {name:13s} {row['plan']:40s} est {row['estimated'] / 2**20:8.1f} "
          f"MiB (allocator {row['estimated_allocator'] / 2**20:5.1f})  meas "
          f"{row['measured'] / 2**20:8.1f} MiB (spread {spread:4.1f})  err "
          f"{100 * row['error']:+6.2f}%  live: err {100 * (row['live_error'] or 0):+6.2f}%  "
          f"({row['seconds']:.0f} s)", flush=True)  # fmt: skip
    return row


def reestimate(out: str) -> None:
    """The estimates of `out`'s rows made again with the code as it is now, against the
    measurements stored there (a model change checked without rerunning the processes; the
    file says which run measured them)."""
    data = json.loads(Path(out).read_text())
    hw = detect_local(use_torch=False).best_device()
    plans = {(name, describe(plan)): (name, plan) for name, plan in CASES}
    rows = []
    for row in data["rows"]:
        name, plan = plans[(row["model"], row["plan"])]
        arch = from_config(resolve_model(name).config, name)
        est = (estimate_inference if isinstance(plan, InferencePlan) else estimate_training)(
            arch, plan, hw)  # fmt: skip
        slack = est.breakdown.get("allocator", 0)
        live = est.model_bytes - slack
        rows.append({**row, "estimated": est.model_bytes, "estimated_allocator": slack,
                     "error": est.model_bytes / row["measured"] - 1, "live_estimated": live,
                     "live_error": live / row["live_measured"] - 1 if row["live_measured"] else None,
                     "phase": est.peak_phase})  # fmt: skip
        print(f"{name:13s} {row['plan']:40s} est {est.model_bytes / 2**20:8.1f} MiB (allocator "
              f"{slack / 2**20:5.1f})  meas {row['measured'] / 2**20:8.1f} MiB  err "
              f"{100 * rows[-1]['error']:+6.2f}%")  # fmt: skip
    measured_at = data["summary"].get("measured_at") or data["summary"].get("date", "")
    _write_memory(rows, out, data["summary"]["passes"], measured_at or "an earlier run")


def memory_suite(cases: list, out: str, passes: int) -> None:
    """Every case's row, the median and worst |error| of the default process (and of the
    live-tensor reading), written to `out`."""
    rows = [_memory_row(i, cases, name, plan, passes) for i, (name, plan) in enumerate(cases, 1)]
    _write_memory(rows, out, passes, time.strftime("%Y-%m-%d"))


def _write_memory(rows: list[dict], out: str, passes: int, measured_at: str) -> None:
    errors = [abs(r["error"]) for r in rows]
    live = [abs(r["live_error"]) for r in rows if r["live_error"] is not None]
    summary = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "cases": len(rows), "passes": passes, "allocator": "glibc (default settings)",
               "measured_at": measured_at, "estimated_at": time.strftime("%Y-%m-%d"),
               "live_median_abs_error": statistics.median(live) if live else None,
               "live_worst_abs_error": max(live) if live else None}  # fmt: skip
    print(f"default process: median |error| {100 * summary['median_abs_error']:.2f}%  worst "
          f"{100 * summary['worst_abs_error']:.2f}%  over {len(rows)} cases (median of "
          f"{passes} processes each)")  # fmt: skip
    if live:
        print(f"live tensors (glibc pinned, diagnostic): median |error| {100 * statistics.median(live):.2f}%  "
              f"worst {100 * max(live):.2f}%")  # fmt: skip
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="first three cases only")
    parser.add_argument("--time", action="store_true", help="validate times, not memory")
    parser.add_argument("--out", default="")
    parser.add_argument("--train-only", action="store_true", help="time: training cases only")
    parser.add_argument("--passes", type=int, default=0,
                        help="time: run the suite N times, each row's median against its "
                        "estimate (default 1); memory: fresh processes a case (default 3)")  # fmt: skip
    parser.add_argument("--case-budget-s", type=float, default=300.0,
                        help="time: skip a case whose run the estimate puts over this")  # fmt: skip
    parser.add_argument("--allocator-split", action="store_true",
                        help="time: each case again under an allocator that faults nothing in")  # fmt: skip
    parser.add_argument("--reestimate", action="store_true",
                        help="memory: the estimates made again against the stored measurements")  # fmt: skip
    args = parser.parse_args()
    if args.time:
        cases = TIME_CASES[:3] if args.quick else TIME_CASES
        if args.train_only:
            cases = [c for c in cases if isinstance(c[1], TrainingPlan)]
        time_suite(cases, args.out or "benchmarks/results/cpu_time.json", max(1, args.passes),
                   args.allocator_split, args.case_budget_s)  # fmt: skip
        return
    args.out = args.out or "benchmarks/results/cpu_memory.json"
    if args.reestimate:
        reestimate(args.out)
        return
    memory_suite(CASES[:3] if args.quick else CASES, args.out, args.passes or MEMORY_PASSES)
    sys.exit(0)


if __name__ == "__main__":
    main()
