"""GPU memory check (issue 24): estimates against real runs on a lent GPU, three ways.

- `measure` (on the GPU machine, a few minutes): each case in a fresh process
  (`gpu_memory_child`, gpuwise.measure.runs' child protocol; models built from their configs
  with random weights as `gpuwise validate` builds them): `torch.cuda.max_memory_reserved()`
  and `max_memory_allocated()` over the measured run, and the process's used memory as
  nvidia-smi lists it, read at the end of the run while the caching allocator still holds
  its pool. Then, for `SEARCHES`, the largest batch that runs without CUDA out-of-memory: each
  try a fresh process running the plan once, the step doubling away from the estimator's own
  largest batch until a try runs and one fails, then bisection; a search out of time keeps
  its bracket. Written after every case and try to DIR/gpu_memory.json.
- `compare` (anywhere, no torch): the estimates for the catalogue device matched from the GPU
  name (or `--device`): `memory.model_bytes` against max_memory_reserved (as
  validate_gpu.py compares), `memory.allocated_bytes` against max_memory_allocated,
  `memory.total_bytes` (the CUDA context row included) against nvidia-smi's used memory; the
  largest batch `gpuwise infer|train` reports against the measured one, and the verdict at the
  measured largest batch (yes or tight expected) and one above it (no or tight expected).

Run:  python benchmarks/gpu_memory_check.py measure --out DIR [--quick] [--budget-s 360]
      python benchmarks/gpu_memory_check.py compare DIR/gpu_memory.json [--device h100]
          [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gpuwise.app.validate import plan_kwargs
from gpuwise.catalog import resolve_model
from gpuwise.catalog.hardware import Hardware, find_hardware
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.memory import fits
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.measure.hardware.catalogue_match import match_catalogue
from gpuwise.measure.runs.child_process import run_child
from gpuwise.measure.runs.jobs import inference_job, training_job
from gpuwise.workload import from_config

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from batch_search import is_out_of_memory, largest_batch  # noqa: E402
from gpu_memory_child import bitsandbytes_problem, environment  # noqa: E402
from validate_gpu import BF16, DEVICE, case_id, error_summary, memory_row, row_plan  # noqa: E402

Plan = InferencePlan | TrainingPlan
CHILD = "gpu_memory_child"  # benchmarks/gpu_memory_child.py, found through PYTHONPATH
ADAMW, MIXED = "adamw", "mixed-bf16"
# Sized for an 80 GB H100 (all under 62 GiB; the H200 runs of validate_gpu.py measured the
# 8B LoRA and 3B checkpointed steps at 61.2 and 60.5 GiB) and ~16 s a process (validate_gpu's
# H200 cases: 15-19 s each, mostly imports and the build).
CASES: list[tuple[str, Plan]] = [
    ("qwen2.5-0.5b", InferencePlan(batch=1, prompt_tokens=512, new_tokens=32, weights=BF16)),
    ("llama-3.2-1b", InferencePlan(batch=1, prompt_tokens=2048, new_tokens=32, weights=BF16)),
    ("llama-3.1-8b", InferencePlan(batch=1, prompt_tokens=1024, new_tokens=32, weights=BF16)),
    ("llama-3.1-8b", InferencePlan(batch=16, prompt_tokens=4096, new_tokens=16, weights=BF16)),
    ("llama-3.2-1b", TrainingPlan(batch=8, seq=1024, dtype=MIXED, optimizer=ADAMW)),
    ("llama-3.2-1b", TrainingPlan(batch=8, seq=1024, dtype=MIXED, optimizer=ADAMW,
                                  checkpointing=True)),
    ("llama-3.2-3b", TrainingPlan(batch=4, seq=2048, dtype=MIXED, optimizer=ADAMW,
                                  checkpointing=True)),
    ("llama-3.1-8b", TrainingPlan(batch=4, seq=1024, dtype=BF16, optimizer=ADAMW,
                                  finetune="lora", lora_rank=16)),
    # QLoRA saves random weights and loads them quantized (model_build): 1B keeps that short.
    ("llama-3.2-1b", TrainingPlan(batch=4, seq=1024, dtype=BF16, optimizer=ADAMW,
                                  finetune="qlora", lora_rank=16)),
]
# The largest batch (the plans' own batch is not used). Long sequences keep it small (the
# estimator says 43, 9 and 9 on an H100; about twice that on an H200), so few tries settle it.
SEARCHES: list[tuple[str, Plan]] = [
    ("llama-3.2-3b", InferencePlan(batch=1, prompt_tokens=8192, new_tokens=16, weights=BF16)),
    ("llama-3.2-1b", TrainingPlan(batch=1, seq=2048, dtype=MIXED, optimizer=ADAMW)),
    ("llama-3.2-1b", TrainingPlan(batch=1, seq=2048, dtype=BF16, optimizer=ADAMW,
                                  finetune="lora", lora_rank=16)),
]
BUDGET_S = 360  # the whole measure step; the searches share what the cases leave
SEARCH_BUDGET_S = 60  # one search at most
MIN_SEARCH_S = 20  # a search is not started with less than this left
CASE_TIMEOUT_S = 180
TRY_TIMEOUT_S = 150
TRY_KEEP = ("max_memory_reserved_bytes", "max_memory_allocated_bytes", "smi_used_bytes",
            "cuda_total_bytes")


# ---------------------------------------------------------------- measure (on the GPU)


def _job(name: str, plan: Plan, once: bool) -> dict:
    config, kwargs = resolve_model(name).config, plan_kwargs(plan, DEVICE)
    job = inference_job(config, **kwargs) if isinstance(plan, InferencePlan) else training_job(config, **kwargs)
    return {**job, "once": once}


def _attempt(name: str, plan: Plan, once: bool, timeout_s: float) -> dict:
    """The plan run in a fresh process: {"result": the child's} or {"error": why not}."""
    started = time.perf_counter()
    try:  # a job refused before the run (peft missing) is an error too
        job = _job(name, plan, once)
        record: dict[str, Any] = {"result": run_child(job, timeout_s, allocator_env=False, child=CHILD)}
    except (RuntimeError, ValueError) as exc:  # one case failing must not lose the others
        record = {"error": str(exc)[:2000]}
    record["seconds"] = time.perf_counter() - started
    return record


def _measure_case(name: str, plan: Plan, qlora_problem: str | None) -> dict:
    if isinstance(plan, TrainingPlan) and plan.finetune == "qlora" and qlora_problem:
        return {"skipped": f"QLoRA needs bitsandbytes: {qlora_problem}"}
    return _attempt(name, plan, False, CASE_TIMEOUT_S)


def _try_batch(name: str, plan: Plan, batch: int) -> dict:
    record = _attempt(name, replace(plan, batch=batch), True, TRY_TIMEOUT_S)
    if "result" in record:
        return {"outcome": "ok", "seconds": record["seconds"],
                **{k: record["result"].get(k) for k in TRY_KEEP}}
    outcome = "oom" if is_out_of_memory(record["error"]) else "error"
    return {"outcome": outcome, "seconds": record["seconds"], "error": record["error"][:400]}


def estimated_largest_batch(arch: Any, plan: Plan, hw: Hardware) -> int:
    """The largest batch `gpuwise infer|train` reports for the plan on `hw`."""
    if isinstance(plan, InferencePlan):
        return fits.max_inference_batch(arch, plan, hw)
    return fits.max_training_batch(arch, plan, hw)


def _arch(name: str) -> Any:
    return from_config(resolve_model(name).config, name)


def measure(out: Path, quick: bool, budget_s: float) -> None:
    deadline = time.monotonic() + budget_s
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCHMARKS), os.environ.get("PYTHONPATH")) if p)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_memory.json"
    problem = bitsandbytes_problem()
    record: dict[str, Any] = {"environment": environment(problem), "cases": [], "searches": []}
    print(f"environment: {record['environment']}", flush=True)

    def save() -> None:
        path.write_text(json.dumps(record, indent=1) + "\n")

    cases, searches = (CASES[:2], SEARCHES[:1]) if quick else (CASES, SEARCHES)
    for i, (name, plan) in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case_id(name, plan)}", flush=True)
        late = time.monotonic() > deadline
        row = _row(name, plan) | ({"skipped": f"past the {budget_s:g} s budget"} if late
                                  else _measure_case(name, plan, problem))
        record["cases"].append(row)
        save()
        print(f"  {_brief(row)}", flush=True)
    env = record["environment"]
    hw = match_catalogue(env["gpu"] or "", env["gpu_memory_bytes"] or 0)
    for i, (name, plan) in enumerate(searches):
        record["searches"].append(row := _row(name, plan))
        left = deadline - time.monotonic()
        if left < MIN_SEARCH_S:
            row["skipped"] = f"{left:.0f} s left of the {budget_s:g} s budget"
        else:
            _search(row, hw, min(SEARCH_BUDGET_S, left / (len(searches) - i)), save)
        save()


def _row(name: str, plan: Plan) -> dict[str, Any]:
    return {"model": name, "plan": asdict(plan), "kind": type(plan).__name__}


def _search(row: dict, hw: Hardware | None, budget_s: float, save: Callable[[], None]) -> None:
    """The largest batch of `row`'s plan, from the estimator's (from 1 on an unknown GPU);
    `row` updated and saved after every try."""
    name, plan = row["model"], row_plan(row)
    start = estimated_largest_batch(_arch(name), plan, hw) if hw else 1
    print(f"largest batch {case_id(name, plan)}: from {start}, {budget_s:.0f} s", flush=True)
    row["budget_s"] = budget_s

    def keep(state: dict) -> None:
        row.update(state)
        save()

    state = largest_batch(_printed_try(name, plan), start, budget_s, on_try=keep)
    row.update(state)
    print(f"  largest {state['largest_ok']}, smallest failed {state['smallest_failed']} "
          f"({state['stopped']}, {len(state['tries'])} tries)", flush=True)


def _printed_try(name: str, plan: Plan) -> Callable[[int], dict]:
    def run(batch: int) -> dict:
        result = _try_batch(name, plan, batch)
        why = f": {_first_line(result['error'])}" if result["outcome"] != "ok" else ""
        print(f"    b{batch}: {result['outcome']} ({result['seconds']:.0f} s){why}", flush=True)
        return result

    return run


def _brief(row: dict) -> str:
    if "result" in row:
        r = row["result"]
        return (f"reserved {r['max_memory_reserved_bytes'] / 2**30:.2f} GiB, allocated "
                f"{r['max_memory_allocated_bytes'] / 2**30:.2f} GiB, nvidia-smi "
                f"{(r['smi_used_bytes'] or 0) / 2**30:.2f} GiB ({row['seconds']:.0f} s)")
    return _first_line(str(row.get("skipped") or row.get("error")))


def _first_line(text: str) -> str:
    return (text.splitlines() or [""])[0][:300]


# ---------------------------------------------------------------- compare (anywhere)


def device_for(env: dict, override: str | None = None) -> Hardware:
    """The catalogue device the runs were on: `override`, or the entry the GPU name matches
    (gpuwise.measure.hardware.catalogue_match, as `--on local` borrows a datasheet)."""
    if override:
        return find_hardware(override)
    hw = match_catalogue(env.get("gpu") or "", env.get("gpu_memory_bytes") or 0)
    if hw is None:
        raise ValueError(f"no catalogue device matches {env.get('gpu')!r}: name one with --device")
    return hw


def _estimate(arch: Any, plan: Plan, hw: Hardware) -> Any:
    return (estimate_inference if isinstance(plan, InferencePlan) else estimate_training)(arch, plan, hw)


def _ratio(estimated: float, measured: float | None) -> float | None:
    return estimated / measured - 1 if measured else None


def case_row(case: dict, hw: Hardware) -> dict[str, Any]:
    """One measured case against its estimate: reserved, allocated and nvidia-smi."""
    name, plan, r = case["model"], row_plan(case), case["result"]
    arch = _arch(name)
    est = _estimate(arch, plan, hw)
    figures = {"model_bytes": est.model_bytes, "total_bytes": est.total_bytes}
    row = memory_row(name, plan, figures, r)  # memory.model_bytes vs max_memory_reserved
    smi = r.get("smi_used_bytes")
    return {**row, "reserved_error": row["error"],
            "estimated_allocated_bytes": est.allocated_bytes,
            "measured_allocated_bytes": r["max_memory_allocated_bytes"],
            "allocated_error": _ratio(est.allocated_bytes, r["max_memory_allocated_bytes"]),
            "measured_smi_bytes": smi, "smi_how": r.get("smi_how"),
            "smi_error": _ratio(est.total_bytes, smi),
            "estimated_context_bytes": est.breakdown.get("overhead", 0),
            "measured_context_bytes": smi - r["memory_reserved_at_end_bytes"] if smi else None}


def search_row(search: dict, hw: Hardware, cuda_total: int | None) -> dict[str, Any]:
    """One largest-batch search against the estimator's largest batch and verdicts."""
    name, plan = search["model"], row_plan(search)
    arch = _arch(name)
    ok, failed, exact = search["largest_ok"], search["smallest_failed"], search["stopped"] == "exact"
    estimated = estimated_largest_batch(arch, plan, hw)
    above = ok + 1 if exact else failed
    at_ok = _estimate(arch, replace(plan, batch=ok), hw).verdict if ok else None
    at_above = _estimate(arch, replace(plan, batch=above), hw).verdict if above else None
    at_cuda = estimated_largest_batch(arch, plan, replace(hw, memory_bytes=cuda_total)) if cuda_total else None
    return {"case": case_id(name, replace(plan, batch=1)).replace(" b1 ", " b* ", 1),
            "measured_largest_batch": ok, "smallest_failed_batch": failed, "exact": exact,
            "stopped": search["stopped"], "tries": len(search["tries"]),
            "estimated_largest_batch": estimated, "estimated_at_cuda_total": at_cuda,
            "error": _ratio(estimated, ok) if exact else None,
            "estimate_in_bracket": ok <= estimated and (failed is None or estimated < failed),
            "verdict_at_largest": at_ok, "verdict_above": at_above, "above_batch": above,
            "verdicts_ok": at_ok in ("yes", "tight") and at_above in ("no", "tight")}


def _cuda_total(measured: dict) -> int | None:
    """The device's total as cudaMemGetInfo reports it (below the datasheet's), from any run."""
    runs = [c.get("result") or {} for c in measured["cases"]]
    runs += [t for s in measured["searches"] for t in s.get("tries", [])]
    return next((r["cuda_total_bytes"] for r in runs if r.get("cuda_total_bytes")), None)


def _searched(search: dict) -> bool:
    """Whether a search learnt anything: a try that ran or one that ran out of memory."""
    return bool(search.get("largest_ok") or search.get("smallest_failed"))


def _why_not(row: dict) -> str:
    tries = row.get("tries") or [{}]
    return _first_line(str(row.get("skipped") or row.get("error") or tries[-1].get("error")))


def _not_run(measured: dict) -> list[dict[str, str]]:
    rows = [c for c in measured["cases"] if "result" not in c]
    rows += [s for s in measured["searches"] if not _searched(s)]
    return [{"case": case_id(r["model"], row_plan(r)), "why": _why_not(r)} for r in rows]


def compare(measured_path: Path, device: str | None = None, out: Path | None = None) -> dict:
    measured = json.loads(measured_path.read_text())
    hw = device_for(measured["environment"], device)
    cases = [case_row(c, hw) for c in measured["cases"] if "result" in c]
    cuda_total = _cuda_total(measured)
    searches = [search_row(s, hw, cuda_total) for s in measured["searches"] if _searched(s)]
    summary = {stat: error_summary([r[f"{stat}_error"] for r in cases if r[f"{stat}_error"] is not None])
               for stat in ("reserved", "allocated", "smi")}
    summary["largest_batch"] = error_summary([r["error"] for r in searches if r["error"] is not None])
    summary["verdicts_ok"] = f"{sum(r['verdicts_ok'] for r in searches)} of {len(searches)}"
    record = {"environment": measured["environment"], "device": hw.id, "summary": summary,
              "cases": cases, "searches": searches,
              "not_run": _not_run(measured)}
    _print(record)
    if out is not None:
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def _cell(estimated: int, measured: int | None, error: float | None) -> str:
    if measured is None or error is None:
        return f" {estimated / 2**30:6.2f}/     -        "
    return f" {estimated / 2**30:6.2f}/{measured / 2**30:6.2f} {100 * error:+6.1f}%"


def _found(search: dict) -> str:
    """The measured largest batch, or the bracket a search out of time or tries left."""
    if search["exact"]:
        return str(search["measured_largest_batch"])
    failed = search["smallest_failed_batch"]
    return f"{search['measured_largest_batch']}..{failed - 1 if failed else '?'} ({search['stopped']})"


def _print(record: dict) -> None:
    print(f"device {record['device']}; GiB estimated/measured and error")
    print(f"{'case':56s}{'max_memory_reserved':>22s}{'max_memory_allocated':>22s}{'nvidia-smi':>22s}")
    for r in record["cases"]:
        print(f"{r['case']:56s}{_cell(r['estimated_model_bytes'], r['measured_model_bytes'], r['reserved_error'])}"
              f"{_cell(r['estimated_allocated_bytes'], r['measured_allocated_bytes'], r['allocated_error'])}"
              f"{_cell(r['estimated_total_bytes'], r['measured_smi_bytes'], r['smi_error'])}")
    for r in record["not_run"]:
        print(f"{r['case']:56s} not run: {str(r['why'])[:120]}")
    for r in record["searches"]:
        found = _found(r)
        error = f"{100 * r['error']:+.1f}%" if r["error"] is not None else "-"
        print(f"largest batch {r['case']:50s} measured {found} estimated {r['estimated_largest_batch']} "
              f"({r['estimated_at_cuda_total']} at cudaMemGetInfo's total) {error}; verdict "
              f"{r['verdict_at_largest']} at it, {r['verdict_above']} at {r['above_batch']}"
              f"{'' if r['verdicts_ok'] else '  <- not as expected'}")
    for stat, s in record["summary"].items():
        if isinstance(s, dict) and s["count"]:
            print(f"{stat}: median |error| {100 * s['median_abs_error']:.2f}%, worst "
                  f"{100 * s['worst_abs_error']:.2f}% over {s['count']}")
    print(f"verdicts as expected: {record['summary']['verdicts_ok']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on the GPU machine: the cases, then the largest batches")
    m.add_argument("--out", type=Path, required=True, help="folder for gpu_memory.json")
    m.add_argument("--quick", action="store_true", help="two cases and one search")
    m.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole step's time")
    c = sub.add_parser("compare", help="estimates against a measure run's record")
    c.add_argument("measured", type=Path)
    c.add_argument("--device", help="catalogue device (default: matched from the GPU name)")
    c.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, args.quick, args.budget_s)
    else:
        try:
            compare(args.measured, args.device, args.out)
        except ValueError as exc:  # no catalogue device for the GPU's name
            parser.error(str(exc))


if __name__ == "__main__":
    main()
