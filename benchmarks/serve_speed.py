"""How fast `gpuwise serve` simulates (issue 38's target: 10,000 requests through a 7B model on
one GPU in under 1 s on a 2-core machine; issue 23's was 2 s): wall time, engine steps and simulated seconds per
wall second, at a light, a busy and a saturating load.

Run:  .venv/bin/python benchmarks/serve_speed.py
"""

from __future__ import annotations

import time

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine, rate_ceiling
from gpuwise.estimate.serve.simulate import simulate
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths, poisson_requests

REQUESTS = 10_000
CASES = (("vllm", "h100-sxm", "bf16"), ("sglang", "h100-sxm", "bf16"),
         ("llama.cpp", "rtx-4090", "q4_k_m"))
LOADS = (0.2, 0.8, 1.2)  # of the replica's ceiling


def main() -> None:
    arch = from_config(resolve_model("qwen2.5-7b").config)
    lengths = Lengths(512, 256, "normal", "normal")
    print(f"{REQUESTS:,} requests of ~512 + ~256 tokens, Qwen2.5-7B; target under 1 s each")
    print(f"{'runtime':10s} {'device':9s} {'load':>5s} {'rate/s':>7s} {'wall s':>7s} "
          f"{'steps':>8s} {'simulated s':>12s} {'sim/wall':>9s}")
    for runtime, device, weights in CASES:
        hw = find_hardware(device)
        # llama-server's context: 4 slots of 4096 cells (a normal spread reaches past 1024)
        ctx = 16384 if runtime == "llama.cpp" else None
        plan = InferencePlan(prompt_tokens=512, new_tokens=256, weights=weights, runtime=runtime,
                             context_alloc=ctx)
        engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions())
        ceiling = rate_ceiling(engine, 512, 256)
        for load in LOADS:
            reqs = poisson_requests(load * ceiling, REQUESTS, lengths, seed=1)
            start = time.perf_counter()
            trace = simulate(engine, reqs)
            summary(trace, Slo())
            wall = time.perf_counter() - start
            print(f"{runtime:10s} {device:9s} {load:5.1f} {load * ceiling:7.2f} {wall:7.2f} "
                  f"{trace.steps:8,d} {trace.end_s:12,.0f} {trace.end_s / wall:8,.0f}x")


if __name__ == "__main__":
    main()
