"""llama.cpp's time model against real llama.cpp runs on this CPU (docs/speed.md, "llama.cpp
on this CPU").

The probe (`gpuwise probe --runtime llama.cpp`: two small random-weight models per ggml type and
thread count) gives the rates; the cases are other models (benchmarks/measure_llama_cpp.py: S,
M, L in q8_0, q4_0, q4_k_m and f16 at 1 and 2 threads, llama-bench's pp and tg), none of which
the rates were fitted to. By default all run here: the probe before and after the cases, whose
mean timings give the rates (a shared machine drifts over minutes; how far it moved is
recorded), so that probe and cases see the same machine; `--probe FILE` and `--cases FILE`
reuse earlier results instead (a probe with its timings is fitted again, so the comparison
follows the current fit). Each case's time is its median repetition, as the probe's.

Run:  .venv/bin/python benchmarks/validate_llama_cpp.py [--probe FILE] [--cases FILE]
        [--out benchmarks/results/llama_cpp_time.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.measure.llama_cpp.fit import llama_arch, timing_plans
from gpuwise.measure.llama_cpp.probe import probe_llama_cpp, rates_from_timings

ROOT = Path(__file__).resolve().parent
CASES = ROOT / "results" / "llama_cpp_cpu.json"
OUT = ROOT / "results" / "llama_cpp_time.json"


def _cases(path: Path | None) -> dict[str, Any]:
    """The cases: `path`'s, else measured now (measure_llama_cpp.py, its result file)."""
    if path is not None:
        return json.loads(path.read_text())
    subprocess.run([sys.executable, str(ROOT / "measure_llama_cpp.py"), "--quants",
                    "f16,q8_0,q4_0,q4_k_m", "--out", str(CASES)], check=True)  # fmt: skip
    return json.loads(CASES.read_text())


def _rates(probe: dict[str, Any]) -> Any:
    """This CPU's datasheet rates (any catalogue CPU stands in: only llama.cpp's measured
    rates are read) with the probe's llama.cpp rates."""
    spec = rates_from_spec(find_hardware("cpu-cloud-32vcpu"))
    return replace(spec, kind="cpu", compute_units=os.cpu_count() or 1,
                   ggml_measured=probe["rates"], source="measured")  # fmt: skip


def _estimate(case: dict[str, Any], model: dict[str, Any], rates: Any) -> tuple[float, float]:
    cfg, tb = model["config"], model["tensor_bytes"][case["qtype"]]
    arch = llama_arch(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["ffn"],
                      cfg["vocab"])  # fmt: skip
    pp, tg = timing_plans(case["qtype"], tb["total"], tb["token_embd"], case["n_prompt"],
                          case["n_gen"], case["threads"])  # fmt: skip
    prefill = estimate_inference_time(arch, pp, rates).prefill_s
    decode = estimate_inference_time(arch, tg, rates).decode_s_per_token
    return prefill, decode


def bracketed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One probe record from two: each timing the mean of both, the rates fitted to that,
    and how far each timing moved between them."""
    timings, moved = [], []
    for a, b in zip(before["timings"], after["timings"], strict=True):
        mean = {"pp_s": (a["pp_s"] + b["pp_s"]) / 2, "tg_s": (a["tg_s"] + b["tg_s"]) / 2}
        if a.get("decode_steps") and b.get("decode_steps"):
            mean["decode_steps"] = {k: (v + b["decode_steps"][k]) / 2
                                    for k, v in a["decode_steps"].items()}  # fmt: skip
        timings.append({**a, **mean})
        moved += [b["pp_s"] / a["pp_s"] - 1, b["tg_s"] / a["tg_s"] - 1]
    return {**before, "timings": timings, "rates": rates_from_timings(timings, before.get("n_prompt", 256),
                                                                   before.get("n_gen", 32)),
            "moved_between_probes": {"median": statistics.median(moved),
                                     "largest": max(moved, key=abs)}}  # fmt: skip


def compare(cases: dict[str, Any], probe: dict[str, Any]) -> list[dict[str, Any]]:
    rates = _rates(probe)
    rows = []
    for case in cases["runs"]:
        model = cases["models"][case["model_name"]] if "model_name" in case else next(
            m for m in cases["models"].values() if m["size"] == case["size"])  # fmt: skip
        pp_est, tg_est = _estimate(case, model, rates)
        # The median repetition, as the probe takes it: on a few shared cores one stalled
        # repetition moves a mean by a third.
        pp_s = statistics.median(case["pp_samples_s"])
        tg_s = statistics.median(case["tg_samples_s"]) / case["n_gen"]
        for phase, est, measured in (("prefill", pp_est, pp_s), ("decode", tg_est, tg_s)):
            rows.append({"size": case["size"], "qtype": case["qtype"], "threads": case["threads"],
                         "phase": phase, "estimated_s": est, "measured_s": measured,
                         "error": est / measured - 1})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=Path, help="a probe_llama_cpp() record (JSON)")
    parser.add_argument("--cases", type=Path, help="a measure_llama_cpp.py result")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.probe:  # a probe record, or an earlier result holding one: fitted again
        probe = json.loads(args.probe.read_text())
        probe = probe.get("probe", probe)
        if "timings" in probe:
            probe = {**probe, "rates": rates_from_timings(probe["timings"],
                                                          probe.get("n_prompt", 256),
                                                          probe.get("n_gen", 32))}  # fmt: skip
        cases = _cases(args.cases)
    else:  # the machine drifts: probe before and after the cases, and take the mean
        before = probe_llama_cpp(os.cpu_count() or 1)
        cases = _cases(args.cases)
        probe = bracketed(before, probe_llama_cpp(os.cpu_count() or 1))
    rows = compare(cases, probe)
    print(f"{'size':5s} {'type':7s} {'thr':>3s} {'phase':8s} {'estimated':>10s} "
          f"{'measured':>10s} {'error':>7s}")  # fmt: skip
    for r in rows:
        print(f"{r['size']:5s} {r['qtype']:7s} {r['threads']:3d} {r['phase']:8s} "
              f"{r['estimated_s'] * 1e3:8.2f}ms {r['measured_s'] * 1e3:8.2f}ms "
              f"{100 * r['error']:+6.1f}%")  # fmt: skip
    errs = [abs(r["error"]) for r in rows]
    summary = {"cases": len(rows), "median_abs_error": statistics.median(errs),
               "worst": max(rows, key=lambda r: abs(r["error"]))["error"]}  # fmt: skip
    print(f"\n{len(rows)} cases: median |error| {100 * summary['median_abs_error']:.1f}%, "
          f"worst {100 * summary['worst']:+.1f}%")  # fmt: skip
    args.out.write_text(json.dumps({"about": __doc__.splitlines()[0], "probe": probe,
                                    "machine": cases.get("machine"), "summary": summary,
                                    "rows": rows}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
