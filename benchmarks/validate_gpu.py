"""Validation on a GPU: probe it, time and size real runs, and compare the estimates.

A GPU machine is lent for minutes at a time, so the work is split in two:

- `measure` (on the GPU machine): `gpuwise probe` (saved, and copied to DIR/probe.json),
  then every case's real run in a fresh process: prefill, decode seconds per token or
  training step time (medians of 5 after a warm-up), and for `MEMORY_CASES` the peak
  memory too. Measurements only, written after each case to DIR/gpu_measured.json, so a
  run cut short keeps what it measured.
- `compare` (anywhere): the estimates for the catalogue's device, from its datasheet with
  the default efficiencies (`spec`) and from the probe's profile (`probed`), against those
  runs; a table and a JSON record of the errors.

Run:  python benchmarks/validate_gpu.py measure --out DIR [--no-probe | --no-runs] [--quick]
      python benchmarks/validate_gpu.py compare DIR/gpu_measured.json --profile DIR/probe.json
          [--device h200] [--out benchmarks/results/gpu_h200/compare.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from gpuwise.app.validate import plan_kwargs
from gpuwise.catalog import resolve_model
from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import DeviceRates, rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload import from_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_cpu import describe  # noqa: E402

BF16 = "bf16"
DEVICE = "cuda"  # where `measure` runs the cases
# Sized for a one-GPU H200 (141 GB) and a few minutes of device time: small models whose
# decode is the host's dispatch, 7-14B ones whose decode streams the weights, prefills
# large enough to be compute-bound, and training steps of 0.1-0.5 s.
TIME_CASES: list[tuple[str, InferencePlan | TrainingPlan]] = [
    ("qwen2.5-0.5b", InferencePlan(batch=1, prompt_tokens=512, new_tokens=32, weights=BF16)),
    ("llama-3.2-1b", InferencePlan(batch=1, prompt_tokens=2048, new_tokens=32, weights=BF16)),
    ("llama-3.1-8b", InferencePlan(batch=1, prompt_tokens=1024, new_tokens=32, weights=BF16)),
    ("llama-3.1-8b", InferencePlan(batch=32, prompt_tokens=512, new_tokens=16, weights=BF16)),
    ("qwen2.5-7b", InferencePlan(batch=8, prompt_tokens=2048, new_tokens=16, weights=BF16)),
    ("qwen2.5-14b", InferencePlan(batch=1, prompt_tokens=4096, new_tokens=16, weights=BF16)),
    # p512: GPT-2 has 1024 positions (p1024+16 ran past them: a device-side assert on CUDA)
    ("gpt2", InferencePlan(batch=8, prompt_tokens=512, new_tokens=16, weights="fp32",
                           attention="eager")),  # fmt: skip
    ("llama-3.2-1b", TrainingPlan(batch=8, seq=1024, dtype="mixed-bf16", optimizer="adamw")),
    ("qwen2.5-0.5b", TrainingPlan(batch=16, seq=1024, dtype=BF16, optimizer="adamw")),
    ("llama-3.2-3b", TrainingPlan(batch=4, seq=2048, dtype="mixed-bf16", optimizer="adamw",
                                  checkpointing=True)),  # fmt: skip
    ("gpt2", TrainingPlan(batch=8, seq=1024, dtype="fp32", optimizer="adamw")),
    ("llama-3.1-8b", TrainingPlan(batch=4, seq=1024, dtype=BF16, optimizer="adamw",
                                  finetune="lora", lora_rank=16)),  # fmt: skip
]
# Peak memory too (indices into TIME_CASES): one of each kind, small to large.
MEMORY_CASES = (0, 2, 3, 5, 7, 9, 11)


def case_id(name: str, plan: InferencePlan | TrainingPlan) -> str:
    return f"{name} {describe(plan)}"


# ---------------------------------------------------------------- measure (on the GPU)


def _environment() -> dict[str, Any]:
    import torch
    import transformers

    gpu = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if gpu else None
    return {"gpu": props.name if props else None,
            "gpu_memory_bytes": int(props.total_memory) if props else None,
            "gpus": torch.cuda.device_count() if gpu else 0, "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "transformers": transformers.__version__,
            "python": platform.python_version(), "host": platform.node(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}  # fmt: skip


def _probe(out: Path) -> None:
    from gpuwise.measure.probe.machine import probe_machine
    from gpuwise.measure.probe.store import save_profile

    started = last = time.perf_counter()

    def progress(label: str, done: float) -> None:
        nonlocal last
        if time.perf_counter() - last > 5 or done >= 1:
            print(f"  probe {done:4.0%} {label} ({time.perf_counter() - started:.0f} s)", flush=True)
            last = time.perf_counter()

    profile = probe_machine(False, progress)
    save_profile(profile)
    (out / "probe.json").write_text(profile.to_json())
    print(f"probe: {time.perf_counter() - started:.0f} s; missing: {profile.missing}", flush=True)


def _run(what: str, fn: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = fn()
        record = {"result": asdict(result)}
    except Exception as exc:  # one case failing must not lose the others
        traceback.print_exc()
        record = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    record["seconds"] = time.perf_counter() - started
    print(f"  {what}: {record.get('result') or record['error']} ({record['seconds']:.0f} s)",
          flush=True)  # fmt: skip
    return record


def measure(out: Path, probe: bool, runs: bool, quick: bool) -> None:
    from gpuwise.measure.runs import memory_run as realrun
    from gpuwise.measure.runs import time_run as timerun

    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"environment": _environment(), "cases": []}
    path = out / "gpu_measured.json"
    if probe:
        _probe(out)
    cases = (TIME_CASES[:2] if quick else TIME_CASES) if runs else []
    for i, (name, plan) in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case_id(name, plan)}", flush=True)
        config, kwargs = resolve_model(name).config, plan_kwargs(plan, DEVICE)
        timer = timerun.time_inference if isinstance(plan, InferencePlan) else timerun.time_training
        row = {"model": name, "plan": asdict(plan), "kind": type(plan).__name__,
               "time": _run("time", partial(timer, config, repeats=5, timeout_s=240, **kwargs))}  # fmt: skip
        if i in MEMORY_CASES:
            meter = (realrun.measure_inference if isinstance(plan, InferencePlan)
                     else realrun.measure_training)  # fmt: skip
            row["memory"] = _run("memory", partial(meter, config, timeout_s=240, **kwargs))
        record["cases"].append(row)
        path.write_text(json.dumps(record, indent=1) + "\n")


# ---------------------------------------------------------------- compare (anywhere)


def row_plan(row: dict[str, Any]) -> InferencePlan | TrainingPlan:
    return (InferencePlan if row["kind"] == "InferencePlan" else TrainingPlan)(**row["plan"])


def _times(arch: Any, plan: InferencePlan | TrainingPlan, rates: DeviceRates) -> dict[str, float]:
    if isinstance(plan, InferencePlan):
        t = estimate_inference_time(arch, plan, rates)
        return {"prefill_s": t.prefill_s, "decode_s_per_token": t.decode_s_per_token}
    return {"step_s": estimate_training_time(arch, plan, rates).step_s}


def memory_row(name: str, arch: Any, plan: Any, hw: Any, measured: dict) -> dict[str, Any]:
    est = (estimate_inference if isinstance(plan, InferencePlan) else estimate_training)(arch, plan, hw)
    return {"case": case_id(name, plan), "estimated_model_bytes": est.model_bytes,
            "measured_model_bytes": measured["model_bytes"],
            "estimated_total_bytes": est.total_bytes, "measured_peak_bytes": measured["peak_bytes"],
            "error": est.model_bytes / measured["model_bytes"] - 1}  # fmt: skip


def error_summary(errors: list[float]) -> dict[str, float | int | None]:
    if not errors:
        return {"median_abs_error": None, "worst_abs_error": None, "count": 0}
    absolute = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(absolute), "worst_abs_error": max(absolute),
            "count": len(errors)}  # fmt: skip


def compare(measured_path: Path, profile_path: Path | None, device: str, out: Path | None) -> dict:
    from gpuwise.measure.probe import Profile
    from gpuwise.measure.probe.rates_source import profile_rates

    measured = json.loads(measured_path.read_text())
    hw = find_hardware(device)
    rates = {"spec": rates_from_spec(hw)}
    if profile_path is not None:
        found = profile_rates(Profile.from_json(profile_path.read_text()), hw)
        if found is not None:
            rates["probed"] = found
    rows, memory = [], []
    for case in measured["cases"]:
        name, plan = case["model"], row_plan(case)
        arch = from_config(resolve_model(name).config, name)
        result = case["time"].get("result")
        if result:
            estimates = {source: _times(arch, plan, r) for source, r in rates.items()}
            for key in ("prefill_s", "decode_s_per_token", "step_s"):
                if result.get(key):
                    row = {"case": case_id(name, plan), "quantity": key, "measured": result[key]}
                    for source, est in estimates.items():
                        row[source] = est[key]
                        row[f"{source}_error"] = est[key] / result[key] - 1
                    rows.append(row)
        if (case.get("memory") or {}).get("result"):
            memory.append(memory_row(name, arch, plan, hw, case["memory"]["result"]))
    summary = {source: error_summary([r[f"{source}_error"] for r in rows]) for source in rates}
    summary["memory"] = error_summary([r["error"] for r in memory])
    _print(rows, memory, summary, list(rates))
    record = {"environment": measured["environment"], "device": hw.id, "summary": summary,
              "time": rows, "memory": memory}  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def _print(rows: list[dict], memory: list[dict], summary: dict, sources: list[str]) -> None:
    head = "".join(f" {s + ' est':>13s} {'err':>7s}" for s in sources)
    print(f"{'case':58s} {'quantity':18s} {'measured':>10s}{head}")
    for r in rows:
        cells = "".join(f" {r[s] * 1e3:11.2f}ms {100 * r[f'{s}_error']:+6.1f}%" for s in sources)
        print(f"{r['case']:58s} {r['quantity']:18s} {r['measured'] * 1e3:8.2f}ms{cells}")
    for source in sources:
        s = summary[source]
        if s["count"]:
            print(f"time from {source} rates: median |error| {100 * s['median_abs_error']:.1f}%, "
                  f"worst {100 * s['worst_abs_error']:.1f}% over {s['count']} times")  # fmt: skip
    for r in memory:
        print(f"memory {r['case']:58s} est {r['estimated_model_bytes'] / 2**30:7.2f} GiB  meas "
              f"{r['measured_model_bytes'] / 2**30:7.2f} GiB  err {100 * r['error']:+6.2f}%")  # fmt: skip
    if summary["memory"]["count"]:
        m = summary["memory"]
        print(f"memory: median |error| {100 * m['median_abs_error']:.2f}%, worst "
              f"{100 * m['worst_abs_error']:.2f}% over {m['count']} cases")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on the GPU machine: probe, then the real runs")
    m.add_argument("--out", type=Path, required=True, help="folder for probe.json and gpu_measured.json")
    m.add_argument("--no-probe", action="store_true", help="the real runs only")
    m.add_argument("--no-runs", action="store_true", help="the probe only")
    m.add_argument("--quick", action="store_true", help="the first two cases only")
    c = sub.add_parser("compare", help="estimates against a measure run's record")
    c.add_argument("measured", type=Path)
    c.add_argument("--profile", type=Path, help="the probe.json of the same run")
    c.add_argument("--device", default="h200", help="catalogue device the runs were on")
    c.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, not args.no_probe, not args.no_runs, args.quick)
    else:
        compare(args.measured, args.profile, args.device, args.out)


if __name__ == "__main__":
    main()
