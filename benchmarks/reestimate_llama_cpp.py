"""llama.cpp's validation (validate_llama_cpp.py) re-estimated from what it saved: the probe's
rates in its results file and the cases' timings, with this tree's time model, nothing timed
again. For a change to the time model, this says how each figure moves on the same machine's
same measurements (docs/speed.md, "llama.cpp on this CPU"); a new validation through
`gpuwise infer` needs a new probe (validate_llama_cpp.py).

Run:  .venv/bin/python benchmarks/reestimate_llama_cpp.py [RESULTS CASES]
        (default: results/llama_cpp_time.json results/llama_cpp_cpu.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwise.catalog import find_hardware
from gpuwise.estimate.speed.device_rates import DeviceRates, rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.measure.llama_cpp.fit import llama_arch
from gpuwise.workload.plans import InferencePlan, StoredWeights

ROOT = Path(__file__).resolve().parent / "results"
FORMAT = {"f16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k_m": "q4_k_m"}
GGML_TYPE = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K"}


def case_errors(run: dict[str, Any], model: dict[str, Any], rates: DeviceRates) -> list[tuple]:
    """(phase, size, type, threads, error) of llama-bench's pp and tg tests of one case."""
    c, stored = model["config"], model["tensor_bytes"][run["qtype"]]
    arch = llama_arch(c["hidden"], c["layers"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"])
    weights = StoredWeights(stored["total"], stored["token_embd"], run["qtype"],
                            GGML_TYPE[run["qtype"]])
    base = InferencePlan(weights=FORMAT[run["qtype"]], runtime="llama.cpp",
                         threads=run["threads"], stored_weights=weights)
    pp = estimate_inference_time(arch, replace(base, prompt_tokens=run["n_prompt"], new_tokens=1),
                                 rates).prefill_s
    tg = estimate_inference_time(arch, replace(base, prompt_tokens=1, new_tokens=run["n_gen"]),
                                 rates).decode_s_per_token
    measured = (statistics.median(run["pp_samples_s"]),
                statistics.median(run["tg_samples_s"]) / run["n_gen"])
    key = (run["size"], run["qtype"], run["threads"])
    return [("prefill", *key, pp / measured[0] - 1), ("decode", *key, tg / measured[1] - 1)]


def main() -> None:
    paths = sys.argv[1:3] or [ROOT / "llama_cpp_time.json", ROOT / "llama_cpp_cpu.json"]
    results, cases = (json.loads(Path(p).read_text()) for p in paths)
    rates = replace(rates_from_spec(find_hardware("cpu-cloud-32vcpu")), compute_units=2,
                    source="measured", ggml_measured=results["probe"]["rates"])
    models = {m["size"]: m for m in cases["models"].values()}
    errors = [e for run in cases["runs"] for e in case_errors(run, models[run["size"]], rates)]
    for e in errors:
        print(*e[:4], f"{e[-1] * 100:+.1f}%")
    for phase in ("prefill", "decode"):
        mid = statistics.median(abs(e[-1]) for e in errors if e[0] == phase)
        print(f"{phase}: median |error| {mid:.1%}")
    worst = max(errors, key=lambda e: abs(e[-1]))[-1]
    print(f"{len(errors)} cases: median |error| "
          f"{statistics.median(abs(e[-1]) for e in errors):.1%}, worst {worst:+.1%}")


if __name__ == "__main__":
    main()
