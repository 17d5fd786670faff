"""How fast the estimators answer, measured side by side in one run.

- one memory estimate (target: under 5 ms) and one time estimate under each runtime
  (target: under 2 ms), in-process;
- a sweep of every catalogue model x catalogue device x weight precision, memory and time
  (target: under 1 s), the ops of each model and shape built once for all devices;
- `gpuwise check MODEL --on h100` from a cold start, as a subprocess (target: under 0.3 s).

Run:  .venv/bin/python benchmarks/estimate_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuwise.catalog import find_hardware, load_hardware, load_models, resolve_model
from gpuwise.errors import GpuwiseError
from gpuwise.estimate import InferencePlan, estimate_inference
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.step import inference_ops
from gpuwise.measure.call_timing import median_call_s
from gpuwise.workload import from_config

PRECISIONS = ("bf16", "fp8", "int8", "int4")


def sweep() -> tuple[float, int]:
    archs = [from_config(e.load_config(), e.id) for e in load_models()]
    devices = []
    for hw in load_hardware():
        try:
            devices.append((hw, rates_from_spec(hw)))
        except GpuwiseError:
            continue
    start = time.perf_counter()
    n = 0
    for arch in archs:
        for hw, rates in devices:
            for p in PRECISIONS:
                plan = InferencePlan(prompt_tokens=2048, new_tokens=256, weights=p)
                estimate_inference(arch, plan, hw)
                estimate_inference_time(arch, plan, rates)
                n += 1
    return time.perf_counter() - start, n


RUNTIMES = (("transformers", "bf16"), ("compiled", "bf16"), ("vllm", "int4"),
            ("llama.cpp", "q4_k_m"))


def cold_check() -> float:
    exe = Path(sys.executable).with_name("gpuwise")
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([str(exe), "check", "llama-3.1-8b", "--on", "h100"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    arch = from_config(resolve_model("llama-3.1-8b").config)
    hw = find_hardware("h100")
    rates = rates_from_spec(hw)
    plan = InferencePlan(prompt_tokens=4096, new_tokens=512)
    memory_s = median_call_s(lambda: estimate_inference(arch, plan, hw), 200)

    def cold_time_estimate(runtime: str, weights: str) -> Callable[[], None]:
        def once() -> None:  # ops built anew, as for a first question
            inference_ops.cache_clear()
            estimate_inference_time(arch, replace(plan, runtime=runtime, weights=weights), rates)

        return once

    times = {rt: median_call_s(cold_time_estimate(rt, w), 200) for rt, w in RUNTIMES}
    sweep_s, n = sweep()
    check_s = cold_check()
    print(
        f"one memory estimate        {memory_s * 1e3:8.3f} ms   target  5 ms   "
        f"({5e-3 / memory_s:6.0f}x under)"
    )
    for rt, time_s in times.items():
        print(f"one time estimate ({rt:12s}) {time_s * 1e3:7.3f} ms   target  2 ms   "
              f"({2e-3 / time_s:6.0f}x under)")
    print(
        f"sweep of {n} plans (memory+time) {sweep_s:6.3f} s    target  1 s    "
        f"({1 / sweep_s:6.1f}x under)"
    )
    print(
        f"`gpuwise check` cold start {check_s:8.3f} s    target  0.3 s  "
        f"({0.3 / check_s:6.1f}x under)"
    )


if __name__ == "__main__":
    main()
