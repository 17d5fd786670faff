"""Run a memory plan for real (torch + transformers, random weights) and measure its peak.

The model is built from its `config.json` facts with random weights: nothing is downloaded and
no remote code is trusted. Each measurement runs in a fresh Python process
(`python -m gpuwise.measure.runs.memory_run`, the job as JSON on stdin, the result as one JSON line on
stdout) so that runs do not pollute each other's allocator state, caches or high-water marks.

Measurement method
------------------
In the child process the plan (a `generate` call, or `steps` training steps) runs twice: a
warm-up, which puts every lazily created thing in place (optimizer states, kernel caches,
thread pools), then the measured run with the same inputs.

CPU: the peak is the kernel's resident-set high-water mark (`VmHWM`), reset just before the
measured run by writing "5" to `/proc/self/clear_refs` (Linux >= 4.0). Where that is not
possible, a thread samples the resident set every millisecond instead (and the result says so).
For the resident set to track live tensors, the parent starts the child with

- ``MALLOC_MMAP_THRESHOLD_=65536``: a fixed threshold turns off glibc's dynamic one, which
  otherwise rises to 32 MiB after the first large free, so that later tensors up to 32 MiB are
  carved out of the heap and stay resident after they are freed. With it, every allocation
  above 64 KiB is its own mmap and goes back to the kernel on free.
- ``MALLOC_TRIM_THRESHOLD_=0``: free memory at the top of the heap is returned at once.

Without them the resident set keeps what was freed: training GPT-2 (124M) at batch 2, seq 256
gave a "baseline" of 1357-1503 MiB and a spread of 162 MiB over three runs; with them, 393 MiB
and 0.16 MiB. The price is page faults on every large allocation, which slows the run a little.
What is left is noise of up to about 1 MB between repeats, whatever the model: allocations under
64 KiB (and Python's object arenas) still live in heap pages that freeing may not return.

The baseline is what is resident at rest after the warm-up and is not a model or optimizer
tensor (interpreter, libraries, kernel caches): ``RSS_at_rest - bytes of tensors at rest``,
with tensors deduplicated by storage (tied embeddings share one). ``model_bytes = peak -
baseline``: the tensors at rest plus whatever the plan allocates on top of them.

CUDA: the peak is ``torch.cuda.max_memory_reserved()`` over the measured run (the caching
allocator's cache emptied and its peak reset first) plus the CUDA context; the context (the
baseline) is the process's device memory per NVML, or the device's used memory per
`cudaMemGetInfo`, less what torch has reserved, read at rest.

torch and transformers are imported only inside the functions that run in the child: this
module is imported by the CLI, which must stay light.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from gpuwise.measure.runs.child_process import child_main, run_child
from gpuwise.measure.runs.jobs import inference_job, training_job
from gpuwise.measure.runs.model_build import build_model
from gpuwise.measure.runs.peak_memory import measure_cpu, measure_cuda, tensors_at_rest
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


def measure_inference(config: dict, *, timeout_s: float = 900, **plan: Any) -> MeasuredMemory:
    """Measure a greedy `generate` of `new_tokens` after a `prompt_tokens` prompt, `batch` rows.

    Plan keywords: batch, prompt_tokens, new_tokens, dtype ("bf16"), attention ("sdpa"),
    kv_dtype (None), device ("cpu"). `kv_dtype` None (or the compute dtype) keeps the KV cache
    in the compute dtype; "fp8", "int4" and "int2" use transformers' QuantizedCache (the int
    ones need optimum-quanto). Raises RuntimeError when the real run fails or takes longer
    than `timeout_s`.
    """
    return MeasuredMemory(**run_child(inference_job(config, **plan), timeout_s))


def measure_training(config: dict, *, timeout_s: float = 900, **plan: Any) -> MeasuredMemory:
    """Measure `steps` training steps (forward with labels, backward, optimizer step, zero_grad).

    Plan keywords: batch, seq, dtype ("fp32"), optimizer ("adamw"), checkpointing, attention,
    finetune ("full"), lora_rank, lora_targets, device ("cpu"), steps (2). `dtype`
    "mixed-bf16"/"mixed-fp16" keeps fp32 weights and runs the forward under torch.autocast.
    `finetune` "lora" needs peft; "qlora" and `optimizer` "adamw8bit" need bitsandbytes and a
    CUDA GPU. Raises RuntimeError when the real run fails or takes longer than `timeout_s`.
    """
    return MeasuredMemory(**run_child(training_job(config, **plan), timeout_s))


def run_job(job: dict) -> dict:
    """The child's work: build the job's model, then measure its memory or time it."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if job["device"].startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {job['device']!r} asked for, but torch sees no CUDA GPU")
    model = build_model(job)
    if job.get("measure") == "time":
        result = time_job(model, job)
        result["torch_version"] = torch.__version__
        result["transformers_version"] = transformers.__version__
        return result
    optimizer = None
    if job["kind"] == "inference":
        run = inference_plan(model, job)
    else:
        run, optimizer = training_plan(model, job)

    def at_rest() -> dict[str, int]:
        return tensors_at_rest(model, optimizer)

    if job["device"].startswith("cuda"):
        result = measure_cuda(run, at_rest, job["device"])
    else:
        result = measure_cpu(run, at_rest)
    result["torch_version"] = torch.__version__
    result["transformers_version"] = transformers.__version__
    return result


if __name__ == "__main__":
    sys.exit(child_main(run_job, check=MeasuredMemory))
