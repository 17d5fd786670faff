"""Validation on a GPU: probe it, time and size real runs, and compare the estimates.

A GPU machine is lent for minutes at a time, so the work is split in two:

- `measure` (on the GPU machine): `gpuwise probe` as users run it (saved into the cache folder,
  `GPUWISE_CACHE_DIR` or DIR/cache, and copied to DIR/probe.json), then every case's real run
  in a fresh process: prefill, decode seconds per token or training step time (medians of 5
  after a warm-up), and for `MEMORY_CASES` the peak memory too; beside each run, what
  `gpuwise infer|train --on local --json` estimates from that saved probe (`probed`). Written
  after each case to DIR/gpu_measured.json, so a run cut short keeps what it measured.
- `estimate RECORD` (on the GPU machine, after `measure --no-runs`): the `probed` estimates
  of an earlier record's cases from the probe just saved, without running them again.
- `compare` (anywhere): the estimates of `gpuwise infer|train --on DEVICE --json` for the
  catalogue's device, from its datasheet with the default efficiencies (`spec`), and the
  `probed` ones the record holds, against those runs; a table and a JSON record of the errors.
  A record measured before the probed estimates were taken on the GPU has no `probed` column:
  `--on local` reads this machine's probe, so it can only be asked on the GPU machine.

Every estimate is a command's answer (benchmarks/public_cli.py), as users run it.

Run:  python benchmarks/validate_gpu.py measure --out DIR [--no-probe | --no-runs] [--quick]
      python benchmarks/validate_gpu.py estimate DIR/gpu_measured.json
      python benchmarks/validate_gpu.py compare DIR/gpu_measured.json [--device h200]
          [--out benchmarks/results/gpu_h200/compare.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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
from gpuwise.workload.plans import InferencePlan, TrainingPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_cli import gpuwise_json  # noqa: E402
from validate_cpu import cli_options, describe  # noqa: E402

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
                           attention="eager")),
    ("llama-3.2-1b", TrainingPlan(batch=8, seq=1024, dtype="mixed-bf16", optimizer="adamw")),
    ("qwen2.5-0.5b", TrainingPlan(batch=16, seq=1024, dtype=BF16, optimizer="adamw")),
    ("llama-3.2-3b", TrainingPlan(batch=4, seq=2048, dtype="mixed-bf16", optimizer="adamw",
                                  checkpointing=True)),
    ("gpt2", TrainingPlan(batch=8, seq=1024, dtype="fp32", optimizer="adamw")),
    ("llama-3.1-8b", TrainingPlan(batch=4, seq=1024, dtype=BF16, optimizer="adamw",
                                  finetune="lora", lora_rank=16)),
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
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _probe(out: Path) -> None:
    """`gpuwise probe --json`, saved where users' is (GPUWISE_CACHE_DIR, else DIR/cache), and
    copied to DIR/probe.json."""
    started = time.perf_counter()
    answer = gpuwise_json("probe")
    shutil.copyfile(answer["saved_to"], out / "probe.json")
    print(f"probe: {time.perf_counter() - started:.0f} s; missing: {answer.get('missing')}; "
          f"trusted: {answer.get('trusted')}", flush=True)


def estimate(name: str, plan: InferencePlan | TrainingPlan, on: str) -> dict[str, Any]:
    """`gpuwise infer|train NAME --on ON --json`: the figures compared, None where there is no
    time estimate."""
    command = "infer" if isinstance(plan, InferencePlan) else "train"
    answer = gpuwise_json(command, name, "--on", on, *cli_options(plan))
    t, m = answer["time"], answer["memory"]
    return {"prefill_s": t.get("prefill_s"), "decode_s_per_token": t.get("decode_s_per_token"),
            "step_s": t.get("step_s"), "time_rates": t.get("rates") or t.get("unavailable"),
            "model_bytes": m["model_bytes"], "total_bytes": m["total_bytes"],
            "device": answer["hardware"]["id"]}


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
          flush=True)
    return record


def measure(out: Path, probe: bool, runs: bool, quick: bool) -> None:
    from gpuwise.measure.runs import memory_run as realrun
    from gpuwise.measure.runs import time_run as timerun

    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GPUWISE_CACHE_DIR", str(out / "cache"))  # the probe's, for `probed`
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
               "time": _run("time", partial(timer, config, repeats=5, timeout_s=240, **kwargs)),
               "probed": estimate(name, plan, "local")}
        if i in MEMORY_CASES:
            meter = (realrun.measure_inference if isinstance(plan, InferencePlan)
                     else realrun.measure_training)
            row["memory"] = _run("memory", partial(meter, config, timeout_s=240, **kwargs))
        record["cases"].append(row)
        path.write_text(json.dumps(record, indent=1) + "\n")


def estimate_probed(record_path: Path) -> None:
    """Each case of the record with what `--on local` estimates from this machine's saved
    probe (`probed`): run on the GPU machine the record measured, after its probe."""
    record = json.loads(record_path.read_text())
    for case in record["cases"]:
        case["probed"] = estimate(case["model"], row_plan(case), "local")
        print(f"{case_id(case['model'], row_plan(case))}: {case['probed']}", flush=True)
    record_path.write_text(json.dumps(record, indent=1) + "\n")


# ---------------------------------------------------------------- compare (anywhere)


def row_plan(row: dict[str, Any]) -> InferencePlan | TrainingPlan:
    return (InferencePlan if row["kind"] == "InferencePlan" else TrainingPlan)(**row["plan"])


def memory_row(name: str, plan: Any, est: dict[str, Any], measured: dict) -> dict[str, Any]:
    return {"case": case_id(name, plan), "estimated_model_bytes": est["model_bytes"],
            "measured_model_bytes": measured["model_bytes"],
            "estimated_total_bytes": est["total_bytes"], "measured_peak_bytes": measured["peak_bytes"],
            "error": est["model_bytes"] / measured["model_bytes"] - 1}


def error_summary(errors: list[float]) -> dict[str, float | int | None]:
    if not errors:
        return {"median_abs_error": None, "worst_abs_error": None, "count": 0}
    absolute = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(absolute), "worst_abs_error": max(absolute),
            "count": len(errors)}


def time_rows(name: str, plan: Any, result: dict, estimates: dict[str, dict]) -> list[dict]:
    """Each measured quantity against each source's estimate of it."""
    rows = []
    for key in ("prefill_s", "decode_s_per_token", "step_s"):
        if not result.get(key):
            continue
        row = {"case": case_id(name, plan), "quantity": key, "measured": result[key]}
        for source, est in estimates.items():
            if est.get(key) is not None:
                row[source] = est[key]
                row[f"{source}_error"] = est[key] / result[key] - 1
        rows.append(row)
    return rows


def compare(measured_path: Path, device: str, out: Path | None) -> dict:
    measured = json.loads(measured_path.read_text())
    rows, memory, device_id = [], [], device
    for case in measured["cases"]:
        name, plan = case["model"], row_plan(case)
        spec = estimate(name, plan, device)
        device_id = spec["device"]
        estimates = {"spec": spec, **({"probed": case["probed"]} if case.get("probed") else {})}
        if case["time"].get("result"):
            rows += time_rows(name, plan, case["time"]["result"], estimates)
        if (case.get("memory") or {}).get("result"):
            memory.append(memory_row(name, plan, spec, case["memory"]["result"]))
    sources = [s for s in ("spec", "probed") if any(s in r for r in rows)]
    summary = {s: error_summary([r[f"{s}_error"] for r in rows if s in r]) for s in sources}
    summary["memory"] = error_summary([r["error"] for r in memory])
    if "probed" not in sources:
        print("no probed estimates in this record: `measure` takes them on the GPU machine "
              "(`--on local` reads the probe saved there)")
    _print(rows, memory, summary, sources)
    record = {"environment": measured["environment"], "device": device_id, "summary": summary,
              "time": rows, "memory": memory}
    if out is not None:
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def _print(rows: list[dict], memory: list[dict], summary: dict, sources: list[str]) -> None:
    head = "".join(f" {s + ' est':>13s} {'err':>7s}" for s in sources)
    print(f"{'case':58s} {'quantity':18s} {'measured':>10s}{head}")
    for r in rows:
        cells = "".join(f" {r[s] * 1e3:11.2f}ms {100 * r[f'{s}_error']:+6.1f}%" if s in r
                        else f" {'-':>13s} {'-':>7s}" for s in sources)
        print(f"{r['case']:58s} {r['quantity']:18s} {r['measured'] * 1e3:8.2f}ms{cells}")
    for source in sources:
        s = summary[source]
        if s["count"]:
            print(f"time from {source} rates: median |error| {100 * s['median_abs_error']:.1f}%, "
                  f"worst {100 * s['worst_abs_error']:.1f}% over {s['count']} times")
    for r in memory:
        print(f"memory {r['case']:58s} est {r['estimated_model_bytes'] / 2**30:7.2f} GiB  meas "
              f"{r['measured_model_bytes'] / 2**30:7.2f} GiB  err {100 * r['error']:+6.2f}%")
    if summary["memory"]["count"]:
        m = summary["memory"]
        print(f"memory: median |error| {100 * m['median_abs_error']:.2f}%, worst "
              f"{100 * m['worst_abs_error']:.2f}% over {m['count']} cases")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on the GPU machine: probe, then the real runs")
    m.add_argument("--out", type=Path, required=True, help="folder for probe.json and gpu_measured.json")
    m.add_argument("--no-probe", action="store_true", help="the real runs only")
    m.add_argument("--no-runs", action="store_true", help="the probe only")
    m.add_argument("--quick", action="store_true", help="the first two cases only")
    e = sub.add_parser("estimate", help="on the GPU machine: an earlier record's cases "
                       "estimated from the probe saved here (--on local)")
    e.add_argument("record", type=Path)
    c = sub.add_parser("compare", help="estimates against a measure run's record")
    c.add_argument("measured", type=Path)
    c.add_argument("--device", default="h200", help="catalogue device the runs were on")
    c.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, not args.no_probe, not args.no_runs, args.quick)
    elif args.command == "estimate":
        estimate_probed(args.record)
    else:
        compare(args.measured, args.device, args.out)


if __name__ == "__main__":
    main()
