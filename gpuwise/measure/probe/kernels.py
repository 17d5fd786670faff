"""Probe the kernels a transformer actually runs, at the shapes it runs them.

The square-matrix sweep says what the BLAS can do; a model's time goes to other shapes and
other kernels. On a 2-core CPU, for example, a (512 x 576) @ (576 x 1536) projection runs
at two thirds of the square rate, bf16 SDPA attention at a sixth of the bf16 matmul rate,
and a bf16 SiLU at a seventh of the memory bandwidth. So this measures, per dtype:

- `linear`: F.linear forward, and its backward (the input and weight gradients, two
  matmuls), over a grid of rows m x input width k x output width n, cycling through copies
  of the weight that together exceed the last-level cache, as a forward pass over a model
  that does not fit in cache reads its weights from memory;
- `sdpa`: scaled_dot_product_attention per (batch x head), head dim 64: decode (one query
  against kv positions), causal prefill (q = kv), non-causal attention (q = kv: encoders
  and vision transformers) and the causal backward (training);
- `optimizer`: seconds per element of one step of torch.optim.AdamW (the single-tensor loop a
  CPU runs), SGD with momentum and transformers' Adafactor (2-D parameters) on parameters of
  2^10 ... 2^26 elements: AdamW's out-of-place temporaries are page-faulted in when they
  are larger than the allocator's mmap threshold, and Adafactor's per-tensor Python is most
  of its step on small tensors;
- `elementwise`: bytes/s of a binary op (mul), of SiLU, GELU (the tanh approximation and
  the exact erf one, forward and backward: four times apart on a CPU), tanh (in GPT-2's
  Python GELU: 25x slower than a mul on a Zen 5 core), division and square root (the
  optimizer's), a Bernoulli draw (dropout masks) and a torch.cat that appends a
  row to a cache (transformers' DynamicCache each decode step), on an activation-sized
  tensor; a CNN's max-pool and batch norm (inference, training and their backwards);
- `conv`: convolutions (batch 8, NCHW) at ResNet's channel and size pairs, 3x3 stride 1 and
  the other windows and strides a ResNet runs, forward and backward (input and weight
  gradients), as seconds by forward FLOPs: oneDNN's convolutions run far from the
  square-matmul rate of the same implicit GEMM, and its kernels differ by window and stride;
- `fresh` (a CPU): bytes/s at which a newly mapped tensor is faulted in on first touch: a
  fill into a fresh tensor past glibc's mmap threshold against the same fill into an
  existing one (every vocab-sized logits or embedding gradient pays it, every step), in a
  small process and again with 1-6 GiB in use (`by_held`): on a VM whose host backs guest
  memory lazily, pages from beyond the memory recently in use fault 8x slower.

The linear grid also runs x @ W with W stored (in, out), as GPT-2's Conv1D does (addmm), at
few rows: there the BLAS takes another path, up to 2.5x slower at two rows on this CPU.

Each point is the median of its repeats after warm-up, as a real run's time is (the best
call is the machine at its fastest, which runs do not see for long on a shared host). With
two threads on two cores a call that shares a core with anything else waits a scheduler
tick (4-8 ms here): the probe says when other processes were busy. torch is imported
inside.
"""

from __future__ import annotations

from typing import Any

from gpuwise.estimate.speed.probed_kernels import slow_first_touch_reading
from gpuwise.measure.probe.kernel_plan import KernelPlan, for_gpu, with_cold_set
from gpuwise.measure.probe.kernel_timer import Progress
from gpuwise.measure.probe.kernels_attention import AttentionKernels
from gpuwise.measure.probe.kernels_elementwise import ElementwiseKernels
from gpuwise.measure.probe.kernels_matmul import MatmulKernels
from gpuwise.measure.probe.kernels_optimizer import OptimizerKernels


class _Kernels(MatmulKernels, AttentionKernels, OptimizerKernels, ElementwiseKernels):
    """Every kernel group of the probe, timed on one device."""


def measure_kernels(plan: KernelPlan | None = None, progress: Progress | None = None,
                    device: str = "cpu", cache_bytes: int | None = None) -> dict[str, Any]:
    """{"linear": {dtype: {"forward": [[m, k, n, s]], "backward": [...]}}, "sdpa": {dtype:
    {"decode"|"prefill"|"backward": [[length, s_per_head]]}}, "elementwise": {dtype:
    {"binary"|"silu"|"gelu": bytes_per_s}}, "missing": {what: why}}."""
    import torch

    plan = plan or KernelPlan()
    if cache_bytes:
        plan = with_cold_set(plan, cache_bytes)
    if device.startswith("cuda"):
        plan = for_gpu(plan)
    k = _Kernels(torch, torch.device(device), plan, progress)
    parts = {"linear": k.linear, "sdpa": k.sdpa, "elementwise": k.elementwise,
             "optimizer": k.optimizer, "conv": k.conv}
    out: dict[str, Any] = {part: {} for part in parts} | {"missing": {}}
    for dtype in plan.dtypes:
        for part, fn in parts.items():
            try:
                out[part][dtype] = fn(dtype)
            except Exception as exc:  # a kernel the backend lacks: NA with the reason
                out["missing"][f"{part}.{dtype}"] = f"{type(exc).__name__}: {exc}"
    if k.skipped:
        out["skipped"] = {grid: {"points": count, "predicted_s": slowest,
                                 "limit_s": plan.slow_call_s}
                          for grid, (count, slowest) in k.skipped.items()}
    if k.device.type == "cpu":  # a GPU's caching allocator reuses its blocks
        try:
            out["fresh"] = k.fresh()
        except Exception as exc:
            out["missing"]["fresh"] = f"{type(exc).__name__}: {exc}"
    if progress:
        progress("kernels done", 1.0)
    return out


def slow_first_touch(fresh: dict[str, Any]) -> str:
    """What the probe's `fresh` record says where first touch ran at under half its small
    process's rate with memory in use ("" where it did not, or was not measured so)."""
    held, rate = slow_first_touch_reading(fresh)
    if not rate:
        return ""
    return (f"fresh memory faulted in at {rate / 1e9:.2f} GB/s with {held / 2**30:.0f} GiB "
            f"in use, against {fresh['bytes_per_s'] / 1e9:.1f} in a small process")


def first_touch_note(fresh: dict[str, Any]) -> tuple[str, ...]:
    """A warning where first touch slows by more than half with memory in use: estimates take
    the small process's rate, and a step that faults many pages can then run slower."""
    slow = slow_first_touch(fresh)
    if not slow:
        return ()
    return (f"{slow} (a VM whose host backs its memory lazily does this, from an amount in use "
            "that moves): estimates take the small process's rate, and a step that faults "
            "many pages (training on a CPU) can run slower",)


def skipped_note(kernels: dict[str, Any]) -> tuple[str, ...]:
    """One note per linear grid the probe did not finish: points too slow to time."""
    return tuple(
        f"{grid.removeprefix('linear.').replace('.', ' linear ')}: {int(s['points'])} points "
        f"not measured, up to about {s['predicted_s']:.0f} s a call at the rate of the one "
        f"before (over the probe's {s.get('limit_s', 1.0):g} s a call): estimates take the "
        "nearest measured point's rate"
        for grid, s in (kernels.get("skipped") or {}).items()
    )


def kernel_notes(kernels: dict[str, Any]) -> tuple[str, ...]:
    """What the probe's kernel record warns of: slow first touch, grids left unfinished."""
    return (*first_touch_note(kernels.get("fresh") or {}), *skipped_note(kernels))
