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

Every estimate is what `gpuwise infer|train MODEL --on local ... --json` answers (time: from
the profile `gpuwise probe` saved, loaded by the command as users' is; `GPUWISE_CACHE_DIR`
may point at a folder of the benchmark's own); the runs are measured in fresh processes.

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

from public_cli import gpuwise_json

from gpuwise.app.validate import LIVE_ALLOCATOR, MEMORY_PASSES, machine_vs_probe, plan_kwargs
from gpuwise.catalog import resolve_model
from gpuwise.measure.probe.profile import STEADY
from gpuwise.measure.probe.run import others_cpu_s
from gpuwise.measure.runs import memory_run
from gpuwise.measure.runs import time_run as timerun
from gpuwise.measure.runs.module_run import NO_FAULTS_ENV
from gpuwise.workload.plans import InferencePlan, TrainingPlan


def _i(batch: int, prompt: int, new: int, weights: str, attention: str = "sdpa") -> InferencePlan:
    return InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new, weights=weights,
                         attention=attention)


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


def cli_options(plan: InferencePlan | TrainingPlan) -> list[str]:
    """The plan as `gpuwise infer` or `train` options."""
    if isinstance(plan, InferencePlan):
        return ["--batch", str(plan.batch), "--prompt", str(plan.prompt_tokens),
                "--new-tokens", str(plan.new_tokens), "--weights", plan.weights,
                "--attention", plan.attention, "--allocator", plan.allocator,
                *(["--kv-dtype", plan.kv_dtype] if plan.kv_dtype else [])]
    return ["--batch", str(plan.batch), "--seq", str(plan.seq), "--dtype", plan.dtype,
            "--optimizer", plan.optimizer, "--attention", plan.attention,
            "--finetune", plan.finetune, "--lora-rank", str(plan.lora_rank),
            "--lora-targets", ",".join(plan.lora_targets), "--allocator", plan.allocator,
            *(["--checkpointing"] if plan.checkpointing else [])]


def estimate(name: str, plan: InferencePlan | TrainingPlan) -> dict[str, Any]:
    """`gpuwise infer|train NAME --on local OPTIONS --json`: the answer."""
    command = "infer" if isinstance(plan, InferencePlan) else "train"
    return gpuwise_json(command, name, "--on", "local", *cli_options(plan))


def estimated_times(answer: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each timed quantity's estimate, its estimate charging no page fault, and (a training
    step) the top of its range at the probe's slow first touch: from the answer's time record."""
    t = answer["time"]
    if "unavailable" in t:
        return {}
    if "step_s" in t:
        return {"step_s": {"estimated": t["step_s"],
                           "estimated_without_faults": t["step_s"] - t["page_faults_s"],
                           "estimated_slow_faults": t["step_s_slow_page_faults"]}}
    faults = t["page_faults_s"] or {"prefill": 0.0, "decode": 0.0}
    return {"prefill_s": {"estimated": t["prefill_s"],
                          "estimated_without_faults": t["prefill_s"] - faults["prefill"]},
            "decode_s_per_token": {"estimated": t["decode_s_per_token"],
                                   "estimated_without_faults":
                                   t["decode_s_per_token"] - faults["decode"]}}


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


def _without_faults(config: dict, plan: InferencePlan | TrainingPlan,
                    estimates: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each quantity's estimate with no page fault charged, and its time measured under an
    allocator that faults nothing in after the warm-up (`NO_FAULTS_ENV`): the model less its
    faults against runs without them, and what the faults cost against what is charged."""
    kwargs = plan_kwargs(plan, "cpu")
    if isinstance(plan, InferencePlan):
        m = timerun.time_inference(config, malloc_env=NO_FAULTS_ENV, **kwargs)
        measured = {"prefill_s": m.prefill_s, "decode_s_per_token": m.decode_s_per_token}
    else:
        m = timerun.time_training(config, malloc_env=NO_FAULTS_ENV, **kwargs)
        measured = {"step_s": m.step_s}
    return {key: {"estimated_without_faults": estimates[key]["estimated_without_faults"],
                  "measured_without_faults": meas}
            for key, meas in measured.items() if meas and key in estimates}


def _print_without_faults(row: dict, quiet: dict[str, float]) -> None:
    est, meas = quiet["estimated_without_faults"], quiet["measured_without_faults"]
    print(f"      without page faults: est {est * 1e3:9.2f} ms  meas {meas * 1e3:9.2f} ms  "
          f"err {100 * (est / meas - 1):+6.1f}%;  the faults: charged "
          f"{1e3 * (row['estimated'] - est):7.1f} ms, cost {1e3 * (row['measured'] - meas):7.1f} ms",
          flush=True)


def estimated_run_s(plan: InferencePlan | TrainingPlan, answer: dict[str, Any],
                    repeats: int = 5) -> float | None:
    """Seconds the estimate gives a timed run of the case: a warm-up and `repeats` calls
    (inference: a one-token and a full generate() each); None without a time estimate."""
    t = answer["time"]
    if "unavailable" in t:
        return None
    if isinstance(plan, TrainingPlan):
        return (1 + repeats) * t["step_s"]
    full = t["prefill_s"] + (plan.new_tokens - 1) * t["decode_s_per_token"]
    return (1 + repeats) * (t["prefill_s"] + full)


def _within_budget(cases: list, budget_s: float) -> tuple[list, list[dict]]:
    """The cases whose run the estimate puts within `budget_s`, and the others (printed)."""
    if budget_s == math.inf:
        return cases, []
    kept, skipped = [], []
    for name, plan in cases:
        run_s = estimated_run_s(plan, estimate(name, plan))
        if run_s is None or run_s <= budget_s:
            kept.append((name, plan))
            continue
        print(f"skipped: {name} {describe(plan)}: its run is estimated at {run_s:.0f} s, over "
              f"the {budget_s:.0f} s a case may take (--case-budget-s)", flush=True)
        skipped.append({"model": name, "plan": describe(plan), "estimated_run_s": run_s})
    return kept, skipped


def measured_times(config: dict, plan: InferencePlan | TrainingPlan,
                   repeats: int = 5) -> tuple[dict[str, float | None], Any]:
    """The case's times in a fresh process: prefill and decode, or the training step."""
    kwargs = plan_kwargs(plan, "cpu")
    if isinstance(plan, InferencePlan):
        m = timerun.time_inference(config, repeats=repeats, **kwargs)
        return {"prefill_s": m.prefill_s, "decode_s_per_token": m.decode_s_per_token}, m
    m = timerun.time_training(config, repeats=repeats, **kwargs)
    return {"step_s": m.step_s}, m


def time_rows(name: str, plan: InferencePlan | TrainingPlan, answer: dict[str, Any],
              measured: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Each quantity's estimate (from the command's answer) against its measurement."""
    rows = {}
    for key, est in estimated_times(answer).items():
        value = measured.get(key)
        guess = est["estimated"]
        row = {"estimated": guess, "measured": value,
               "error": None if guess is None or not value else guess / value - 1}
        if est.get("estimated_slow_faults") is not None:
            row["estimated_slow_faults"] = est["estimated_slow_faults"]
        rows[key] = row
    return rows


def _time_case(i: int, cases: list, name: str, plan: InferencePlan | TrainingPlan,
               split: bool = False) -> list[dict]:
    """One real run of a case (in a fresh process), its rows: one per timed quantity; with
    `split`, a second run under an allocator that faults nothing in."""
    config = resolve_model(name).config
    answer = estimate(name, plan)
    source = answer["time"].get("source")
    drift = machine_vs_probe() if source == "measured" else {}  # as `gpuwise validate` does
    started, before = time.perf_counter(), others_cpu_s()
    measured, _ = measured_times(config, plan)
    busy = _others_share(before, started)
    result = {"time": time_rows(name, plan, answer, measured), "time_source": source}
    quiet = _without_faults(config, plan, estimated_times(answer)) if split else {}
    rows = []
    for key, r in result["time"].items():
        if r["error"] is None:
            continue
        rows.append({"model": name, "plan": describe(plan), "quantity": key, **r,
                     "source": result["time_source"], "others_cpu_share": busy,
                     "machine_vs_probe": drift, **quiet.get(key, {})})
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
                  flush=True)
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
               "machine_vs_probe_passes": [r["machine_vs_probe"] for r in same]}
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
          f"touch: {inside} of {len(ranged)} ({below} faster than the estimate)")
    return {"steps_in_fault_range": inside, "steps_below_estimate": below,
            "steps_with_fault_range": len(ranged)}


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
           "fault_s_measured": sum(r["measured"] - r["measured_without_faults"] for r in split)}
    print(f"without page faults (estimate less its faults, runs that fault nothing in): median "
          f"|error| {100 * out['median_abs_error_without_faults']:.1f}%  worst "
          f"{100 * out['worst_abs_error_without_faults']:.1f}% over {len(split)} times; the "
          f"faults cost {out['fault_s_measured']:.2f} s measured, {out['fault_s_estimated']:.2f} s "
          f"charged")
    return out


def time_suite(cases: list, out: str, passes: int = 1, split: bool = False,
               budget_s: float = math.inf) -> None:
    cases, skipped = _within_budget(cases, budget_s)
    runs = []
    for n in range(passes):
        if passes > 1:
            print(f"pass {n + 1} of {passes}", flush=True)
        runs.append([row for i, (name, plan) in enumerate(cases, 1)
                     for row in _time_case(i, cases, name, plan, split)])
    rows = runs[0] if passes == 1 else _over_passes(runs)
    errors = [abs(r["error"]) for r in rows]
    steady = [abs(r["error"]) for r in rows if ran_as_probed(r["machine_vs_probe"], r["plan"])]
    summary = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "quantities": len(rows), "cases": len(cases), "steady_quantities": len(steady),
               "steady_median_abs_error": statistics.median(steady) if steady else None,
               "passes": passes, "skipped_cases": skipped}
    if passes > 1:
        each = [[abs(r["error"]) for r in run] for run in runs]
        summary["per_pass"] = [{"median_abs_error": statistics.median(e),
                                "worst_abs_error": max(e)} for e in each]
        for k, e in enumerate(each, 1):
            print(f"pass {k}: median |error| {100 * statistics.median(e):.1f}%  worst "
                  f"{100 * max(e):.1f}%")
        print(f"each row's median over the {passes} passes against its estimate:")
    print(
        f"median |error| {100 * summary['median_abs_error']:.1f}%  worst "
        f"{100 * summary['worst_abs_error']:.1f}%  over {len(rows)} times in {len(cases)} cases"
    )
    if steady and passes == 1:
        print(f"where the machine ran within {STEADY:.0%} of the probe: median |error| "
              f"{100 * statistics.median(steady):.1f}%, worst {100 * max(steady):.1f}% over "
              f"{len(steady)} times")
    summary.update(_range_summary(rows))
    summary.update(_split_summary(rows))
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


def memory_estimate(name: str, plan: InferencePlan | TrainingPlan) -> dict[str, Any]:
    """The command's memory answer: the model's bytes (the runtime baseline left out), its
    allocator row, the live tensors (the model less that row) and the phase of the peak."""
    memory = estimate(name, plan)["memory"]
    slack = memory["breakdown"].get("allocator", 0)
    return {"estimated": memory["model_bytes"], "estimated_allocator": slack,
            "live_estimated": memory["model_bytes"] - slack, "phase": memory["peak_phase"]}


def measured_memory(config: dict, plan: InferencePlan | TrainingPlan,
                    passes: int) -> dict[str, Any]:
    """The median of `passes` fresh processes under the plan's allocator, and one more under
    glibc pinned (the live tensors: a diagnostic)."""
    measure = (memory_run.measure_inference if isinstance(plan, InferencePlan)
               else memory_run.measure_training)
    kwargs = plan_kwargs(plan, "cpu")
    runs = sorted((measure(config, allocator=plan.allocator, **kwargs) for _ in range(passes)),
                  key=lambda m: m.model_bytes)
    median = runs[len(runs) // 2]
    live = (measure(config, allocator=LIVE_ALLOCATOR, **kwargs).model_bytes
            if plan.allocator != LIVE_ALLOCATOR else None)
    return {"measured": median.model_bytes, "measured_passes": [m.model_bytes for m in runs],
            "live_measured": live, "baseline": median.baseline_bytes, "malloc": median.malloc,
            "versions": {"torch": median.torch_version,
                         "transformers": median.transformers_version}}


def with_errors(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its errors: the model's bytes, and the live tensors where measured."""
    live = row["live_measured"]
    return {**row, "error": row["estimated"] / row["measured"] - 1,
            "live_error": row["live_estimated"] / live - 1 if live else None}


def _memory_row(i: int, cases: list, name: str, plan: InferencePlan | TrainingPlan,
                passes: int) -> dict:
    """One case: the estimate against the median of `passes` fresh processes with the default
    allocator, and the live-tensor reading (glibc pinned) beside it."""
    start = time.perf_counter()
    est = memory_estimate(name, plan)
    row = with_errors({"model": name, "plan": describe(plan), **est,
                       **measured_memory(resolve_model(name).config, plan, passes)})
    row["seconds"] = time.perf_counter() - start
    spread = (max(row["measured_passes"]) - min(row["measured_passes"])) / 2**20
    print(f"[{i}/{len(cases)}] {name:13s} {row['plan']:40s} est {row['estimated'] / 2**20:8.1f} "
          f"MiB (allocator {row['estimated_allocator'] / 2**20:5.1f})  meas "
          f"{row['measured'] / 2**20:8.1f} MiB (spread {spread:4.1f})  err "
          f"{100 * row['error']:+6.2f}%  live: err {100 * (row['live_error'] or 0):+6.2f}%  "
          f"({row['seconds']:.0f} s)", flush=True)
    return row


def reestimate(out: str) -> None:
    """The estimates of `out`'s rows made again with the code as it is now, against the
    measurements stored there (a model change checked without rerunning the processes; the
    file says which run measured them)."""
    data = json.loads(Path(out).read_text())
    plans = {(name, describe(plan)): (name, plan) for name, plan in CASES}
    rows = []
    for row in data["rows"]:
        name, plan = plans[(row["model"], row["plan"])]
        rows.append(with_errors({**row, **memory_estimate(name, plan)}))
        r = rows[-1]
        print(f"{name:13s} {row['plan']:40s} est {r['estimated'] / 2**20:8.1f} MiB (allocator "
              f"{r['estimated_allocator'] / 2**20:5.1f})  meas {row['measured'] / 2**20:8.1f} MiB  "
              f"err {100 * r['error']:+6.2f}%")
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
               "live_worst_abs_error": max(live) if live else None}
    print(f"default process: median |error| {100 * summary['median_abs_error']:.2f}%  worst "
          f"{100 * summary['worst_abs_error']:.2f}%  over {len(rows)} cases (median of "
          f"{passes} processes each)")
    if live:
        print(f"live tensors (glibc pinned, diagnostic): median |error| {100 * statistics.median(live):.2f}%  "
              f"worst {100 * max(live):.2f}%")
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="first three cases only")
    parser.add_argument("--time", action="store_true", help="validate times, not memory")
    parser.add_argument("--out", default="")
    parser.add_argument("--train-only", action="store_true", help="time: training cases only")
    parser.add_argument("--passes", type=int, default=0,
                        help="time: run the suite N times, each row's median against its "
                        "estimate (default 1); memory: fresh processes a case (default 3)")
    parser.add_argument("--case-budget-s", type=float, default=300.0,
                        help="time: skip a case whose run the estimate puts over this")
    parser.add_argument("--allocator-split", action="store_true",
                        help="time: each case again under an allocator that faults nothing in")
    parser.add_argument("--reestimate", action="store_true",
                        help="memory: the estimates made again against the stored measurements")
    args = parser.parse_args()
    if args.time:
        cases = TIME_CASES[:3] if args.quick else TIME_CASES
        if args.train_only:
            cases = [c for c in cases if isinstance(c[1], TrainingPlan)]
        time_suite(cases, args.out or "benchmarks/results/cpu_time.json", max(1, args.passes),
                   args.allocator_split, args.case_budget_s)
        return
    args.out = args.out or "benchmarks/results/cpu_memory.json"
    if args.reestimate:
        reestimate(args.out)
        return
    memory_suite(CASES[:3] if args.quick else CASES, args.out, args.passes or MEMORY_PASSES)
    sys.exit(0)


if __name__ == "__main__":
    main()
