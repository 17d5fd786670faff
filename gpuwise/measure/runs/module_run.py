"""Run a module from a factory for real on this CPU, in a fresh process, and measure its peak
memory or its time: what `gpuwise.from_module`'s estimates are checked against.

Same machinery as `memory_run` (a child process per measurement, the job as JSON on stdin; the
memory child fixes glibc's mmap threshold so freed tensors leave the resident set, and reads
the `VmHWM` high-water mark of the measured run after a warm-up): only the model differs, a
`package.module:factory` path instead of a transformers config.

- inference: one no-grad forward in eval mode;
- training: forward in train mode, the sum of the floating outputs as the loss (as the trace
  does), backward, optimizer step, zero_grad(set_to_none=True).

Time: after two warm-up runs, the median of `repeats` timed runs. Integer inputs are zeros
(valid indices for any embedding); floating inputs are random normal.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuwise.measure.module.meta import DTYPES
from gpuwise.measure.module.trace import default_loss, load_factory
from gpuwise.measure.runs.child_process import child_main, run_child
from gpuwise.measure.runs.memory_run import MeasuredMemory
from gpuwise.measure.runs.optimizers import make_optimizer
from gpuwise.measure.runs.peak_memory import measure_cpu, tensors_at_rest

InputSpec = tuple[tuple[int, ...], str | None]  # shape, dtype name (None: floating)


def _job(factory: str, inputs: list[InputSpec] | None, training: bool, dtype: str | None,
         optimizer: str, sys_path: tuple[str, ...]) -> dict:
    return {"kind": "module-training" if training else "module-inference",
            "config": {"model_type": factory}, "device": "cpu", "factory": factory,
            "inputs": [[list(s), d] for s, d in inputs] if inputs is not None else None,
            "training": training, "dtype": dtype, "optimizer": optimizer,
            "sys_path": list(sys_path)}


def measure_module_memory(factory: str, inputs: list[InputSpec] | None = None, *,
                          training: bool = False, dtype: str | None = None,
                          optimizer: str = "adamw", sys_path: tuple[str, ...] = (),
                          timeout_s: float = 600) -> MeasuredMemory:
    """Peak memory of one pass (see the module docstring) in a fresh process."""
    job = _job(factory, inputs, training, dtype, optimizer, sys_path)
    return MeasuredMemory(**run_child(job, timeout_s, child=__name__))


# glibc told never to map a tensor afresh nor to give the heap back: after the warm-ups no
# page is faulted in again (the heap grows once, by 256 MiB at a time). What a pass costs
# without the allocator's page faults: the model's time less its "page faults" rows.
NO_FAULTS_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**40),
                 "MALLOC_TOP_PAD_": str(2**28)}


def measure_module_time(factory: str, inputs: list[InputSpec] | None = None, *,
                        training: bool = False, dtype: str | None = None,
                        optimizer: str = "adamw", sys_path: tuple[str, ...] = (),
                        repeats: int = 7, timeout_s: float = 600,
                        faults: bool = True) -> dict[str, Any]:
    """{'seconds': median, 'repeats', 'threads', ...} of one pass in a fresh process; with
    `faults=False` under an allocator that faults nothing in after the warm-ups
    (`NO_FAULTS_ENV`)."""
    job = {**_job(factory, inputs, training, dtype, optimizer, sys_path), "measure": "time",
           "repeats": repeats}
    return run_child(job, timeout_s, allocator_env=False, child=__name__,
                     malloc_env=None if faults else NO_FAULTS_ENV)


# ---------------------------------------------------------------- child side


def make_inputs(torch: Any, specs: list[InputSpec], dtype: Any, device: str) -> tuple:
    """Tensors of the given shapes: floating in `dtype` (random normal on a real device),
    integer ones zeros."""
    out = []
    for shape, name in specs:
        if name is None:
            make = torch.empty if device == "meta" else torch.randn
            out.append(make(tuple(shape), dtype=dtype or torch.float32, device=device))
        else:
            out.append(torch.zeros(tuple(shape), dtype=getattr(torch, name), device=device))
    return tuple(out)


def build(job: dict) -> tuple[Any, tuple, dict]:
    """(module, args, kwargs) from the job's factory, in the job's dtype."""
    import torch

    made = load_factory(job["factory"], tuple(job.get("sys_path") or ()))()
    model, example = made if isinstance(made, tuple) else (made, None)
    dtype = getattr(torch, DTYPES[job["dtype"]]) if job.get("dtype") else None
    if dtype is not None:
        model = model.to(dtype)
    if job.get("inputs") is not None:
        return model, make_inputs(torch, job["inputs"], dtype, "cpu"), {}
    if isinstance(example, dict):
        return model, (), {k: _cast(v, dtype) for k, v in example.items()}
    if isinstance(example, torch.Tensor):
        example = (example,)
    return model, tuple(_cast(v, dtype) for v in example or ()), {}


def _cast(t: Any, dtype: Any) -> Any:
    if dtype is not None and hasattr(t, "is_floating_point") and t.is_floating_point():
        return t.to(dtype)
    return t


def _plan(job: dict) -> tuple[Callable[[], None], Any, Any, tuple, dict]:
    import torch

    model, args, kwargs = build(job)
    if not job["training"]:
        model.eval()

        def infer() -> None:
            with torch.no_grad():
                model(*args, **kwargs)

        return infer, model, None, args, kwargs
    model.train()
    opt = make_optimizer(job["optimizer"], [p for p in model.parameters() if p.requires_grad])

    def step() -> None:
        default_loss(model(*args, **kwargs)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, opt, args, kwargs


def _run(job: dict) -> dict:
    import torch

    torch.manual_seed(0)
    run, model, opt, args, kwargs = _plan(job)
    versions = {"torch_version": torch.__version__, "transformers_version": _transformers()}
    if job.get("measure") == "time":
        run()
        run()
        times = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(job["repeats"]):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return {"seconds": statistics.median(times), "all_s": times, "repeats": job["repeats"],
                "threads": torch.get_num_threads(),
                "faulted_bytes_per_pass": faults * resource.getpagesize() / job["repeats"], **versions}
    inputs = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]

    def at_rest() -> dict[str, int]:
        tensors = tensors_at_rest(model, opt)
        tensors["inputs"] = sum(int(t.untyped_storage().nbytes()) for t in inputs)
        return tensors

    return {**measure_cpu(run, at_rest), **versions}


def _transformers() -> str:
    try:
        import transformers
    except ImportError:
        return ""
    return str(transformers.__version__)


if __name__ == "__main__":
    sys.exit(child_main(_run, check=MeasuredMemory))
