"""Issue 38's targets ("the estimators stay fast"), each measured as a user meets it and
printed beside its target: best of 5 runs, each under /tmp/gpuwise-timing.lock so that timing
runs on a shared machine do not overlap.

- `gpuwise check MODEL --on DEVICE`, a fresh process: its wall time, and the work after
  import (the wall time less a process that only imports the command's modules); target
  under 0.3 s of work;
- bare `gpuwise` (the main job: this machine and the catalogue on it): target under 1 s;
- `gpuwise advise` (docs/cost.md's example): target under 1 s;
- one estimate, warm: `estimate_inference` and `estimate_inference_time` of one plan, in
  process: target under 0.3 ms.

Before/after on one machine: run it once with PYTHONPATH pointing at the older tree (the
subprocesses inherit it), once without. The subprocesses run with `-P`, so that the directory
they start in (the repository's root) does not come before PYTHONPATH.

The processes load compiled bytecode, as a user's do (pip compiles a package's modules when
it installs them): the benchmark compiles gpuwise first and runs its processes without
PYTHONDONTWRITEBYTECODE, which some shells set and which would time compiling every module.

Run:  .venv/bin/python benchmarks/speed_targets.py [--quick]
"""

from __future__ import annotations

import compileall
import fcntl
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LOCK = "/tmp/gpuwise-timing.lock"
RUNS = 5
CHECKS = (("llama-3.1-8b", "rtx-4090"), ("qwen2.5-7b", "h100"), ("llama-3.1-70b", "a100-sxm-40gb"),
          ("gpt2", "t4"))
ADVISE = ("advise", "qwen2.5-7b", "--no-local", "--requests-per-day", "100000", "--prompt", "512",
          "--new-tokens", "256", "--latency-ms", "50", "--ttft-ms", "1000")
CLI = "import sys; from gpuwise.cli import main; sys.argv[0] = 'gpuwise'; main()"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
IMPORTS = "import gpuwise.cli, gpuwise.app.check, gpuwise.app.local, gpuwise.app.cost"


@contextmanager
def timing_lock() -> Iterator[None]:
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def best_wall(argv: list[str], runs: int = RUNS) -> float:
    """Best wall time of a fresh process over `runs` runs, each under the lock."""
    best = float("inf")
    for _ in range(runs):
        with timing_lock():
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=ENV)
            best = min(best, time.perf_counter() - start)
    return best


def gpuwise(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", CLI, *args]


def best_call(fn: Callable[[], object], calls: int = 2000) -> float:
    """Best time of one warm call, in process."""
    fn()
    best = float("inf")
    with timing_lock():
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return best


def one_estimate() -> float:
    from gpuwise.catalog import find_hardware, resolve_model
    from gpuwise.estimate import InferencePlan, estimate_inference
    from gpuwise.estimate.speed.device_rates import rates_from_spec
    from gpuwise.estimate.speed.inference_time import estimate_inference_time
    from gpuwise.workload import from_config

    arch = from_config(resolve_model("llama-3.1-8b").config)
    hw = find_hardware("h100")
    rates = rates_from_spec(hw)
    plan = InferencePlan(prompt_tokens=4096, new_tokens=512)

    def once() -> None:
        estimate_inference(arch, plan, hw)
        estimate_inference_time(arch, plan, rates)

    return best_call(once)


def row(what: str, seconds: float, target: float) -> None:
    verdict = "" if target == float("inf") else ("met" if seconds < target else "over")
    scale, unit = (1e3, "ms") if target < 0.01 else (1.0, "s")
    aim = "" if not verdict else f"target {target * scale:g} {unit}"
    print(f"{what:58s} {seconds * scale:9.3f} {unit:2s}  {aim:16s} {verdict}")


def main() -> None:
    quick = "--quick" in sys.argv
    runs = 1 if quick else RUNS
    package = os.path.dirname(importlib.util.find_spec("gpuwise").origin or "")
    compileall.compile_dir(package, quiet=1)  # as pip installs it
    print(f"best of {runs}, python {sys.executable}, PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    imports = best_wall([sys.executable, "-P", "-c", IMPORTS], runs)
    row("import only (subtracted below)", imports, float("inf"))
    for model, device in CHECKS[:1] if quick else CHECKS:
        wall = best_wall(gpuwise("check", model, "--on", device), runs)
        row(f"check {model} --on {device}: wall", wall, float("inf"))
        row(f"check {model} --on {device}: work after import", wall - imports, 0.3)
    row("gpuwise (bare, the main job): wall", best_wall(gpuwise(), runs), 1.0)
    row("advise (docs/cost.md's example): wall", best_wall(gpuwise(*ADVISE), runs), 1.0)
    row("one estimate, warm: memory + time of one plan", one_estimate(), 0.3e-3)


if __name__ == "__main__":
    main()
