"""Run a memory plan for real (torch + transformers, random weights) and measure its peak.

The model is built from its `config.json` facts with random weights: nothing is downloaded and
no remote code is trusted. Each measurement runs in a fresh Python process
(`python -m gpuwise.measure.runs.memory_run`, the job as JSON on stdin, the result as one JSON line on
stdout) so that runs do not pollute each other's allocator state, caches or high-water marks.

Measurement method
------------------
CPU: the process as users run it. The child imports torch and transformers, then runs the
plan once on a tiny model of the same family (every tensor under 64 KiB, `model_build.TINY`),
which loads the runtime's code, kernel caches and thread pools; its tensors move nothing, but
the imports and the interpreter's own tables have by then raised glibc's dynamic mmap threshold
to about 1.9 MiB (`mmap_threshold_at_build`, catalog/data/allocators.toml). The
baseline is the resident set then. The kernel's resident high-water mark (`VmHWM`) is reset by
writing "5" to `/proc/self/clear_refs` (Linux >= 4.0; where that is not possible a thread
samples the resident set every millisecond instead, and the result says so); the model is
built and the plan run once (a `generate` call, or `steps` training steps); ``model_bytes =
VmHWM - baseline``: the tensors and whatever the allocator keeps of what was freed.

The allocator is the plan's (`allocator`, catalog/data/allocators.toml): by default glibc as
users start it, no MALLOC_* variable (the parent's are left out). "glibc-mmap64k" fixes
glibc's mmap threshold at 64 KiB and its trim threshold at 0 (``MALLOC_MMAP_THRESHOLD_=65536
MALLOC_TRIM_THRESHOLD_=0``): every block of 64 KiB or more is then mapped on its own and
unmapped when freed, so the resident set tracks the live tensors; `gpuwise validate` reads it
beside the default process as a diagnostic. "jemalloc" and "tcmalloc" preload the library.
`malloc` has glibc's own account at the end of the run (mallinfo2).

CUDA: after a warm-up run of the plan, the peak is ``torch.cuda.max_memory_reserved()`` over
the measured run (the caching allocator's cache emptied and its peak reset first) plus the
CUDA context; the context (the baseline) is the process's device memory per NVML, or the
device's used memory per `cudaMemGetInfo`, less what torch has reserved, read at rest.

torch and transformers are imported only inside the functions that run in the child: this
module is imported by the CLI, which must stay light.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from gpuwise.measure.runs.allocator_env import allocator_env
from gpuwise.measure.runs.child_process import child_main, run_child
from gpuwise.measure.runs.jobs import inference_job, training_job
from gpuwise.measure.runs.model_build import build_model
from gpuwise.measure.runs.peak_memory import (
    Prepared,
    measure_cpu_process,
    measure_cuda,
    tensors_at_rest,
)
from gpuwise.measure.runs.plans import inference_plan, training_plan
from gpuwise.measure.runs.time_run import time_job

__all__ = ["MeasuredMemory", "measure_inference", "measure_training"]


@dataclass(frozen=True)
class MeasuredMemory:
    """The real memory of one plan, measured in a fresh process.

    `peak_bytes` is the high-water mark of the measured run (CPU: `VmHWM` of the process;
    CUDA: `max_memory_reserved` plus the CUDA context). `baseline_bytes` is what the process
    holds that is not model or optimizer tensors (CPU: interpreter, libraries, caches; CUDA:
    the context), so `model_bytes = peak_bytes - baseline_bytes` is what the plan itself
    needs. `tensors_at_rest` has the bytes of "params", "buffers", "grads" and "optimizer"
    state held between steps, after the warm-up. `method` says how the peak was read.
    """

    peak_bytes: int
    baseline_bytes: int
    model_bytes: int
    device: str
    tensors_at_rest: dict[str, int]
    seconds: float
    torch_version: str
    transformers_version: str
    method: str = ""
    allocator: str = ""  # the host allocator of a CPU run (catalog/data/allocators.toml)
    malloc: dict[str, int] = field(default_factory=dict)  # glibc's account at the end (mallinfo2)


def _measure(job: dict, timeout_s: float, allocator: str) -> MeasuredMemory:
    job = {**job, "allocator": allocator}
    return MeasuredMemory(**run_child(job, timeout_s, allocator_env=False,
                                      malloc_env=allocator_env(allocator)))


def measure_inference(config: dict, *, timeout_s: float = 900, allocator: str = "glibc",
                      **plan: Any) -> MeasuredMemory:
    """Measure a greedy `generate` of `new_tokens` after a `prompt_tokens` prompt, `batch` rows.

    Plan keywords: batch, prompt_tokens, new_tokens, dtype ("bf16"), attention ("sdpa"),
    kv_dtype (None), device ("cpu"). `kv_dtype` None (or the compute dtype) keeps the KV cache
    in the compute dtype; "fp8", "int4" and "int2" use transformers' QuantizedCache (the int
    ones need optimum-quanto). `allocator`: the host allocator of a CPU run (catalog/data/
    allocators.toml). Raises RuntimeError when the real run fails or takes longer than
    `timeout_s`.
    """
    return _measure(inference_job(config, **plan), timeout_s, allocator)


def measure_training(config: dict, *, timeout_s: float = 900, allocator: str = "glibc",
                     **plan: Any) -> MeasuredMemory:
    """Measure `steps` training steps (forward with labels, backward, optimizer step, zero_grad).

    Plan keywords: batch, seq, dtype ("fp32"), optimizer ("adamw"), checkpointing, attention,
    finetune ("full"), lora_rank, lora_targets, device ("cpu"), steps (2). `dtype`
    "mixed-bf16"/"mixed-fp16" keeps fp32 weights and runs the forward under torch.autocast.
    `finetune` "lora" needs peft; "qlora" and `optimizer` "adamw8bit" need bitsandbytes and a
    CUDA GPU. Raises RuntimeError when the real run fails or takes longer than `timeout_s`.
    """
    return _measure(training_job(config, **plan), timeout_s, allocator)


def _prepare(job: dict) -> Prepared:
    """The job's model built, and its plan: the run, and what it holds at rest."""
    model = build_model(job)
    optimizer = None
    if job["kind"] == "inference":
        run = inference_plan(model, job)
    else:
        run, optimizer = training_plan(model, job)
    return run, lambda: tensors_at_rest(model, optimizer)


def run_job(job: dict) -> dict:
    """The child's work: build the job's model, then measure its memory or time it."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if job["device"].startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {job['device']!r} asked for, but torch sees no CUDA GPU")
    if job.get("measure") == "time":
        result = time_job(build_model(job), job)
    elif job["device"].startswith("cuda"):
        run, at_rest = _prepare(job)
        result = measure_cuda(run, at_rest, job["device"])
    else:
        result = measure_cpu_process(job, _prepare)
        result["allocator"] = job.get("allocator", "glibc")
    result["torch_version"] = torch.__version__
    result["transformers_version"] = transformers.__version__
    return result


if __name__ == "__main__":
    sys.exit(child_main(run_job, check=MeasuredMemory))
