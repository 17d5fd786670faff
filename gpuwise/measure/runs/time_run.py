"""Time a plan for real: prefill, decode seconds per token, training step.

Uses the same fresh-process runner and model building as `memory_run`, but leaves the
allocator as users have it. After a warm-up, each quantity is the median of `repeats`:

- prefill: a `generate()` of one new token (the prompt's forward pass plus generate's own
  set-up, which is what a user waits for before the first token);
- decode: ``(t(generate N) - t(generate 1)) / (N - 1)``, the cost of each further token at the
  plan's context;
- training: one step (forward with labels, backward, optimizer step, zero_grad).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwise.measure.runs.child_process import run_child
from gpuwise.measure.runs.jobs import inference_job, training_job
from gpuwise.measure.runs.plans import inference_plan, training_plan


@dataclass(frozen=True)
class MeasuredTime:
    prefill_s: float | None
    decode_s_per_token: float | None
    step_s: float | None
    repeats: int
    device: str
    threads: int
    torch_version: str
    transformers_version: str


def time_inference(config: dict, *, repeats: int = 5, timeout_s: float = 900,
                   malloc_env: dict[str, str] | None = None, **plan: Any) -> MeasuredTime:
    """Time generate() for the plan (keywords as `jobs.inference_job`); `malloc_env`:
    glibc's settings for the run (`NO_FAULTS_ENV`: an allocator that faults nothing in)."""
    job = {**inference_job(config, **plan), "measure": "time", "repeats": repeats}
    return MeasuredTime(**run_child(job, timeout_s, allocator_env=False, malloc_env=malloc_env))


def time_training(config: dict, *, repeats: int = 5, timeout_s: float = 900,
                  malloc_env: dict[str, str] | None = None, **plan: Any) -> MeasuredTime:
    """Time training steps for the plan (keywords as `jobs.training_job`)."""
    job = {**training_job(config, **plan), "measure": "time", "repeats": repeats, "steps": 1}
    return MeasuredTime(**run_child(job, timeout_s, allocator_env=False, malloc_env=malloc_env))


# ---------------------------------------------------------------- child side


def _timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def time_job(model: Any, job: dict) -> dict:
    """Run in the child by `memory_run`: time the job's plan on the built model."""
    import torch

    on_cuda = job["device"].startswith("cuda")
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    repeats = job["repeats"]
    out: dict[str, Any] = {"prefill_s": None, "decode_s_per_token": None, "step_s": None,
                           "repeats": repeats, "device": job["device"],
                           "threads": torch.get_num_threads()}
    if job["kind"] == "inference":
        first = inference_plan(model, {**job, "new_tokens": 1})
        full = inference_plan(model, job)
        first()
        full()  # warm-up
        ones, fulls = [], []
        for _ in range(repeats):
            ones.append(_timed(first, sync))
            fulls.append(_timed(full, sync))
        out["prefill_s"] = statistics.median(ones)
        n = job["new_tokens"]
        if n > 1:
            out["decode_s_per_token"] = (statistics.median(fulls) - out["prefill_s"]) / (n - 1)
    else:
        step, _ = training_plan(model, job)
        step()  # warm-up: creates the optimizer states
        out["step_s"] = statistics.median(_timed(step, sync) for _ in range(repeats))
    return out
