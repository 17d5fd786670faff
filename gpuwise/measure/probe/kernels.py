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

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace as _replace
from functools import partial
from typing import Any

from gpuwise.estimate.speed.probed_kernels import slow_first_touch_reading
from gpuwise.measure.call_timing import median_call_s

Progress = Callable[[str, float], None]

HEAD_DIM = 64
SDPA_HEADS = 16  # batch x heads per timed call on a CPU; the time per head is what is stored
CUDA_BATCH = 200  # most calls queued back to back per timed batch on a GPU
CUDA_ELEMENTWISE = 2**25  # elements of the elementwise kernels' tensors on a GPU
CUDA_SDPA_HEADS = 256  # batch x heads per SDPA call on a GPU
CUDA_ROWS = (4096, 16384)  # linear rows a GPU's grid adds


@dataclass(frozen=True)
class KernelPlan:
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    # 2: fp32 GEMMs of two rows run at half a GEMV's bandwidth here (a batch-2 decode's
    # vocab head: 28.8 ms for GPT-2's, 14.5 at one row, 23.4 at four), which no
    # interpolation between 1 and 4 gives.
    rows: tuple[int, ...] = (1, 2, 4, 16, 64, 256, 1024)
    widths: tuple[int, ...] = (128, 512, 1024, 2048, 4096)  # 128: grouped k/v projections
    backward_rows: tuple[int, ...] = (128, 512, 1024)
    nn_rows: tuple[int, ...] = (1, 2, 4, 16, 64, 256)  # Conv1D layout; beyond: as F.linear
    nn_widths: tuple[int, ...] = (1024, 4096)
    sdpa_decode_kv: tuple[int, ...] = (128, 512, 2048, 8192)
    # Causal attention bends between powers of two (the flash kernel's blocks): from 256 and
    # 1024 alone, 512 came out 17-20% fast on a Zen 5 core (0.34 ms a head against 0.42).
    sdpa_prefill_q: tuple[int, ...] = (64, 128, 256, 384, 512, 768, 1024, 2048)
    sdpa_backward_q: tuple[int, ...] = (128, 256, 512, 1024)
    sdpa_full_q: tuple[int, ...] = (64, 128, 256, 512)  # non-causal (encoders, ViTs)
    elementwise_elements: int = 2**21
    optimizer_elements: tuple[int, ...] = (2**10, 2**14, 2**18, 2**21, 2**24, 2**26)
    conv_shapes: tuple[tuple[int, int], ...] = ((64, 56), (64, 28), (128, 28), (128, 14),
                                                (256, 14), (256, 7), (512, 7), (512, 4))  # (ch, size)
    # Other windows and strides as (variant, in channels, out channels, input size):
    # ResNet's downsampling 3x3 and 1x1 stride-2 convolutions, 1x1 bottlenecks and the
    # 7x7 stem over RGB, at 224 and 112 px images' sizes; a ViT-S/16's patch embedding.
    conv_variants: tuple[tuple[str, int, int, int], ...] = (
        ("3x3/s2", 64, 128, 56), ("3x3/s2", 64, 128, 28), ("3x3/s2", 128, 256, 14),
        ("3x3/s2", 256, 512, 7), ("1x1/s2", 64, 128, 56), ("1x1/s2", 64, 128, 28),
        ("1x1/s2", 128, 256, 14), ("1x1/s2", 256, 512, 7), ("1x1/s1", 64, 256, 56),
        ("1x1/s1", 256, 64, 56), ("1x1/s1", 512, 128, 28), ("7x7/s2", 3, 64, 224),
        ("7x7/s2", 3, 64, 112), ("16x16/s16", 3, 384, 224),
    )  # fmt: skip
    conv_batch: int = 8
    fresh_bytes: int = 64 * 2**20  # past glibc's largest mmap threshold (32 MiB)
    # The fresh fill again with this much memory in use (at most half of what is free): on a
    # VM whose host backs guest memory lazily, first touch runs 8x slower once the pages
    # come from beyond the memory recently in use (6.5 GB/s up to 2-4 GiB here, then 0.78).
    fresh_held: tuple[int, ...] = (2**30, 2 * 2**30, 3 * 2**30, 4 * 2**30, 6 * 2**30)
    cold_set_bytes: int = 128 * 2**20  # weight copies cycled through: beyond the LLC
    target_s: float = 0.04  # timed seconds per point
    repeats: tuple[int, int] = (3, 30)
    # A linear point whose call is predicted to take longer (from the rate of the point
    # measured before it) is not measured: estimates take the nearest measured point's
    # rate. On a CPU without bf16 instructions (AVX2 only), torch's bf16 x @ W (both
    # contiguous: a linear's input gradient) runs at 0.15-0.6 GFLOP/s, 150x below fp32,
    # and the full grid would take hours.
    slow_call_s: float = 1.0
    sdpa_heads: int = SDPA_HEADS  # batch x heads per timed SDPA call

    def steps(self) -> int:
        per_dtype = len(self.rows) * len(self.widths) ** 2
        per_dtype += len(self.backward_rows) * len(self.widths) ** 2
        per_dtype += len(self.nn_rows) * len(self.nn_widths) ** 2
        per_dtype += len(self.sdpa_decode_kv) + 2 * len(self.sdpa_backward_q)
        per_dtype += len(self.sdpa_prefill_q) + 2 * len(self.sdpa_full_q) + 1
        per_dtype += len(self.optimizer_elements) * 3  # AdamW, SGD, Adafactor
        per_dtype += 2 * (len(self.conv_shapes) + len(self.conv_variants))
        return per_dtype * len(self.dtypes) + 1


def measure_kernels(plan: KernelPlan | None = None, progress: Progress | None = None,
                    device: str = "cpu", cache_bytes: int | None = None) -> dict[str, Any]:  # fmt: skip
    """{"linear": {dtype: {"forward": [[m, k, n, s]], "backward": [...]}}, "sdpa": {dtype:
    {"decode"|"prefill"|"backward": [[length, s_per_head]]}}, "elementwise": {dtype:
    {"binary"|"silu"|"gelu": bytes_per_s}}, "missing": {what: why}}."""
    import torch

    plan = plan or KernelPlan()
    if cache_bytes:
        plan = _with_cold_set(plan, cache_bytes)
    if device.startswith("cuda"):
        plan = for_gpu(plan)
    k = _Kernels(torch, torch.device(device), plan, progress)
    parts = {"linear": k.linear, "sdpa": k.sdpa, "elementwise": k.elementwise,
             "optimizer": k.optimizer, "conv": k.conv}  # fmt: skip
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
                          for grid, (count, slowest) in k.skipped.items()}  # fmt: skip
    if k.device.type == "cpu":  # a GPU's caching allocator reuses its blocks
        try:
            out["fresh"] = k.fresh()
        except Exception as exc:
            out["missing"]["fresh"] = f"{type(exc).__name__}: {exc}"
    if progress:
        progress("kernels done", 1.0)
    return out


OPTIMIZERS = ("adamw", "sgd", "adafactor")


def _matrix(n: int) -> tuple[int, int]:
    """A 2-D shape of n elements (a power of two), as square as it goes."""
    rows = 2 ** (n.bit_length() // 2)
    return rows, max(1, n // rows)


def slow_first_touch(fresh: dict[str, Any]) -> str:
    """What the probe's `fresh` record says where first touch ran at under half its small
    process's rate with memory in use ("" where it did not, or was not measured so)."""
    held, rate = slow_first_touch_reading(fresh)
    if not rate:
        return ""
    return (f"fresh memory faulted in at {rate / 1e9:.2f} GB/s with {held / 2**30:.0f} GiB "
            f"in use, against {fresh['bytes_per_s'] / 1e9:.1f} in a small process")  # fmt: skip


def first_touch_note(fresh: dict[str, Any]) -> tuple[str, ...]:
    """A warning where first touch slows by more than half with memory in use: estimates take
    the small process's rate, and a step that faults many pages can then run slower."""
    slow = slow_first_touch(fresh)
    if not slow:
        return ()
    return (f"{slow} (a VM whose host backs its memory lazily does this, from an amount in use "
            "that moves): estimates take the small process's rate, and a step that faults "
            "many pages (training on a CPU) can run slower",)  # fmt: skip


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


def _available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def for_gpu(plan: KernelPlan) -> KernelPlan:
    """The plan on a GPU: work large enough to fill it. A call of a few microseconds times
    the launch, not the kernel: elementwise tensors past the L2 (50-60 MB), SDPA over 256
    (batch x head) rows a call, and linear rows up to a training step's tokens (a grid
    that ends at 1024 rows would run a 16k-token step at a 1024-row matmul's rate)."""
    return _replace(
        plan,
        elementwise_elements=max(plan.elementwise_elements, CUDA_ELEMENTWISE),
        sdpa_heads=max(plan.sdpa_heads, CUDA_SDPA_HEADS),
        rows=tuple(sorted({*plan.rows, *CUDA_ROWS})),
        backward_rows=tuple(sorted({*plan.backward_rows, *CUDA_ROWS})),
    )


def _with_cold_set(plan: KernelPlan, cache_bytes: int) -> KernelPlan:
    return _replace(plan, cold_set_bytes=max(plan.cold_set_bytes, 4 * cache_bytes))


_FRESH_CHILD = """
import json, torch
from gpuwise.measure.call_timing import median_call_s
torch.set_num_threads({threads})
existing = torch.empty({n})
existing.fill_(1.0)
fresh = median_call_s(lambda: torch.empty({n}).fill_(1.0), 9)
into = median_call_s(lambda: existing.fill_(1.0), 9)
held, by_held = [], []
for target in {held}:  # memory in use, touched, then the fresh fill again
    while sum(h.numel() * 4 for h in held) < target:
        held.append(torch.ones(2**25))
    by_held.append([target, median_call_s(lambda: torch.empty({n}).fill_(1.0), 5)])
print(json.dumps([fresh, into, by_held]))
"""


class _Cycle:
    """Hands out the weight copies in turn, so each call reads a weight not in cache."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.i = items, 0

    def next(self) -> Any:
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]


class _Kernels:
    def __init__(self, torch: Any, device: Any, plan: KernelPlan, progress: Progress | None):
        self.t, self.device, self.plan, self.progress = torch, device, plan, progress
        self.done, self.total = 0, plan.steps()
        self.skipped: dict[str, tuple[int, float]] = {}  # grid: (points, slowest predicted s)
        self.types = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def _step(self, label: str) -> None:
        if self.progress:
            self.progress(label, min(self.done / self.total, 0.999))
        self.done += 1

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.t.cuda.synchronize()

    def _call_s(self, op: Callable[[], object]) -> float:
        self._sync()
        start = time.perf_counter()
        op()
        self._sync()
        return max(time.perf_counter() - start, 1e-7)

    def _median_s(self, op: Callable[[], object]) -> float:
        """Median seconds of one call after warm-up, repeated to about `target_s`."""
        op()
        warm = self._call_s(op)
        if warm >= self.plan.slow_call_s / 4:  # a slow call varies little: one more is enough
            return (warm + self._call_s(op)) / 2
        if self.device.type == "cuda":
            return self._batched_s(op, warm)
        lo, hi = self.plan.repeats
        return median_call_s(op, max(lo, min(hi, int(self.plan.target_s / warm))), self._sync)

    def _batched_s(self, op: Callable[[], object], warm: float) -> float:
        """On a GPU: the median over three batches of back-to-back calls, per call. One
        synchronised call adds the launch and the wait (tens of microseconds) to a kernel
        that may take a few; queued back to back, a call costs the longer of the kernel and
        the host's dispatch of it, as in a model's eager run."""
        calls = max(1, min(CUDA_BATCH, int(self.plan.target_s / 3 / warm)))
        batches = []
        for _ in range(3):
            self._sync()
            start = time.perf_counter()
            for _ in range(calls):
                op()
            self._sync()
            batches.append((time.perf_counter() - start) / calls)
        return statistics.median(batches)

    def _tensor(self, *shape: int, dtype: str) -> Any:
        # Values in [-1, 1): no denormals or overflow to slow or break a kernel.
        return self.t.rand(*shape, device=self.device).sub_(0.5).to(self.types[dtype])

    def _cold_copies(self, first: Any, per_item: int = 1, limit: int | None = None) -> list[Any]:
        """`first` and its copies, enough that cycling through them (`per_item` tensors of its
        size read per call) reads past the last-level cache on every call (at most `limit`)."""
        size = first.numel() * first.element_size() * per_item
        copies = self.plan.cold_set_bytes // size
        copies = copies if limit is None else min(limit, copies)
        return [first] + [first.clone() for _ in range(copies - 1)]

    def _weights(self, k: int, n: int, dtype: str) -> list[Any]:
        return self._cold_copies(self._tensor(n, k, dtype=dtype), limit=64)

    def linear(self, dtype: str) -> dict[str, list[list[float]]]:
        plan = self.plan
        fwd: list[list[float]] = []
        bwd: list[list[float]] = []
        for k in plan.widths:
            for n in plan.widths:
                weights = _Cycle(self._weights(k, n, dtype))
                for m in plan.rows:
                    self._step(f"linear {dtype} {m}x{k}->{n}")
                    if self._too_slow(fwd, (m, k, n), f"linear.{dtype}.forward"):
                        continue
                    x = self._tensor(m, k, dtype=dtype)
                    fwd.append([m, k, n, self._median_s(partial(self._forward, x, weights))])
                for m in plan.backward_rows:
                    self._step(f"linear backward {dtype} {m}x{k}->{n}")
                    if self._too_slow(bwd, (m, k, n), f"linear.{dtype}.backward"):
                        continue
                    x, grad = self._tensor(m, k, dtype=dtype), self._tensor(m, n, dtype=dtype)
                    bwd.append([m, k, n, self._median_s(partial(self._backward, x, grad, weights))])
        return {"forward": fwd, "backward": bwd, "forward_nn": self._linear_nn(dtype)}

    def _too_slow(self, done: list[list[float]], shape: tuple[int, int, int], grid: str) -> bool:
        """Whether a point's call would take over `slow_call_s` at the rate of the point
        measured before it in its grid (then it is counted in `skipped`, not measured)."""
        if not done:
            return False
        m, k, n, seconds = done[-1]
        predicted = seconds * (shape[0] * shape[1] * shape[2]) / (m * k * n)
        if predicted <= self.plan.slow_call_s:
            return False
        count, slowest = self.skipped.get(grid, (0, 0.0))
        self.skipped[grid] = (count + 1, max(slowest, predicted))
        return True

    def _linear_nn(self, dtype: str) -> list[list[float]]:
        """x @ W with W stored (in, out): GPT-2's Conv1D (addmm), at the rows where it differs."""
        points: list[list[float]] = []
        for k in self.plan.nn_widths:
            for n in self.plan.nn_widths:
                weights = _Cycle([w.t().contiguous() for w in self._weights(k, n, dtype)])
                for m in self.plan.nn_rows:
                    self._step(f"linear x@W {dtype} {m}x{k}->{n}")
                    if self._too_slow(points, (m, k, n), f"linear.{dtype}.forward_nn"):
                        continue
                    x = self._tensor(m, k, dtype=dtype)
                    points.append([m, k, n, self._median_s(partial(self._forward_nn, x, weights))])
        return points

    def _forward(self, x: Any, weights: _Cycle) -> object:
        return self.t.nn.functional.linear(x, weights.next())

    def _forward_nn(self, x: Any, weights: _Cycle) -> object:
        return self.t.mm(x, weights.next())

    def _backward(self, x: Any, grad: Any, weights: _Cycle) -> object:
        """What autograd runs for F.linear: the input's and the weight's gradient."""
        return self.t.mm(grad, weights.next()), self.t.mm(grad.t(), x)

    def sdpa(self, dtype: str) -> dict[str, list[list[float]]]:
        heads, plan = self.plan.sdpa_heads, self.plan
        decode, prefill = [], []
        for kv in plan.sdpa_decode_kv:
            self._step(f"sdpa {dtype} decode kv {kv}")
            query = self._tensor(1, heads, 1, HEAD_DIM, dtype=dtype)
            keys = self._tensor(1, heads, kv, HEAD_DIM, dtype=dtype)
            caches = _Cycle([(k, k.clone()) for k in self._cold_copies(keys, 2)])
            decode.append([kv, self._median_s(partial(self._attend_cold, query, caches)) / heads])
        for n in plan.sdpa_prefill_q:
            self._step(f"sdpa {dtype} prefill {n}")
            qkv = [self._tensor(1, heads, n, HEAD_DIM, dtype=dtype) for _ in range(3)]
            prefill.append([n, self._median_s(partial(self._attend, qkv, True)) / heads])
        full = []
        for n in plan.sdpa_full_q:
            self._step(f"sdpa {dtype} non-causal {n}")
            qkv = [self._tensor(1, heads, n, HEAD_DIM, dtype=dtype) for _ in range(3)]
            full.append([n, self._median_s(partial(self._attend, qkv, False)) / heads])
        backward = [[n, self._sdpa_backward_s(n, dtype, True)] for n in plan.sdpa_backward_q]
        full_backward = [[n, self._sdpa_backward_s(n, dtype, False)] for n in plan.sdpa_full_q]
        return {"decode": decode, "prefill": prefill, "full": full, "backward": backward,
                "full_backward": full_backward}

    def _sdpa_backward_s(self, n: int, dtype: str, causal: bool) -> float:
        """Seconds per (batch x head) of SDPA's backward at q = kv = n: causal (a decoder's
        training step) or not (an encoder's or a ViT's, twice the work at equal length)."""
        self._step(f"sdpa {dtype} {'' if causal else 'non-causal '}backward {n}")
        heads = self.plan.sdpa_heads
        qkv = [self._tensor(1, heads, n, HEAD_DIM, dtype=dtype).requires_grad_()
               for _ in range(3)]  # fmt: skip
        out = self._attend(qkv, causal)
        step = partial(self.t.autograd.grad, out, qkv, self.t.ones_like(out), retain_graph=True)
        return self._median_s(step) / heads

    def _attend_cold(self, query: Any, caches: _Cycle) -> object:
        """A decode step's attention: its layer's keys and values are not in cache (the step
        streamed every other layer's weights since it last read them)."""
        keys, values = caches.next()
        return self.t.nn.functional.scaled_dot_product_attention(query, keys, values)

    def _attend(self, qkv: list[Any], causal: bool) -> object:
        return self.t.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal)

    def optimizer(self, dtype: str) -> dict[str, list[list[float]]]:
        """Seconds per parameter element of one optimizer step, by the size of the parameter
        tensor, for AdamW, SGD with momentum and transformers' Adafactor (as `gpuwise
        validate` and the module runs make them; Adafactor on 2-D tensors, whose second
        moment it factors): one step over enough such parameters that their weights,
        gradients and two states exceed the cache, as a model's are (a small tensor's cost
        is the loop's per-tensor cost for it: Adafactor's Python runs about 40 kernels per
        tensor). An optimizer that cannot be made here (no transformers) is left out."""
        from gpuwise.measure.runs.memory_run import _make_optimizer

        curves: dict[str, list[list[float]]] = {}
        size = self.t.empty((), dtype=self.types[dtype]).element_size()
        for name in OPTIMIZERS:
            curve = []
            for n in self.plan.optimizer_elements:
                self._step(f"{name} {dtype} on {n:,} elements")
                count = max(1, min(256, self.plan.cold_set_bytes // (4 * n * size)))
                shape = _matrix(n) if name == "adafactor" else (n,)
                params = [self.t.nn.Parameter(self._tensor(*shape, dtype=dtype))
                          for _ in range(count)]  # fmt: skip
                for p in params:
                    p.grad = self._tensor(*shape, dtype=dtype)
                if name == "adamw":  # the loop a CPU runs; a GPU's foreach kernels
                    opt = self.t.optim.AdamW(params, lr=1e-4, foreach=self.device.type == "cuda")
                else:
                    try:
                        opt = _make_optimizer(name, params)
                    except ImportError:
                        break
                curve.append([n, self._median_s(opt.step) / (n * count)])
                del opt, params
            if curve:
                curves[name] = curve
        return curves

    def conv(self, dtype: str) -> dict[str, list[list[float]]]:
        """Convolutions as implicit GEMMs [rows m (batch x output positions), window k
        (window x in channels), out channels n, (a backward: the GEMMs it runs,) seconds],
        forward and backward: 3x3 stride 1 under "forward"/"backward", the plan's other
        windows and strides under "forward:1x1/s2" and so on."""
        out: dict[str, list[list[float]]] = {}
        for channels, size in self.plan.conv_shapes:
            self._conv_point(out, dtype, ("3x3/s1", channels, channels, size))
        for spec in self.plan.conv_variants:
            self._conv_point(out, dtype, spec)
        return out

    def _conv_point(self, out: dict[str, list[list[float]]], dtype: str,
                    spec: tuple[str, int, int, int]) -> None:  # fmt: skip
        """One convolution, forward and backward. A 3-channel input is a network's own
        input, which needs no gradient: its backward is the weight gradient alone. An odd
        window pads to keep the size ("same"), an even one (a ViT's patches) does not."""
        variant, cin, cout, size = spec
        window, stride = int(variant.split("x")[0]), int(variant.split("/s")[1])
        pad = window // 2 if window % 2 else 0
        conv2d, batch = self.t.nn.functional.conv2d, self.plan.conv_batch
        positions = ((size + 2 * pad - window) // stride + 1) ** 2
        shape = [batch * positions, window * window * cin, cout]
        x = self._tensor(batch, cin, size, size, dtype=dtype).requires_grad_(cin > 3)
        w = self._tensor(cout, cin, window, window, dtype=dtype).requires_grad_()
        call = partial(conv2d, x, w, stride=stride, padding=pad)
        suffix = "" if variant == "3x3/s1" else f":{variant}"
        self._step(f"conv {dtype} {variant} {cin}ch {size}px")
        with self.t.no_grad():
            out.setdefault("forward" + suffix, []).append([*shape, self._median_s(call)])
        self._step(f"conv backward {dtype} {variant} {cin}ch {size}px")
        result = call()
        wrt = (x, w) if x.requires_grad else (w,)
        step = partial(self.t.autograd.grad, result, wrt, self.t.ones_like(result),
                       retain_graph=True)  # fmt: skip
        out.setdefault("backward" + suffix, []).append([*shape, len(wrt), self._median_s(step)])

    def _append(self, row: Any, caches: _Cycle) -> object:
        """DynamicCache's append: the layer's cache is replaced by a new, longer tensor, so
        the copy reads the old one cold and writes where another layer's old cache was."""
        grown = self.t.cat([caches.next(), row], dim=1)
        caches.items[caches.i] = grown
        return grown

    def _image_ops(self, a: Any, dtype: str) -> dict[str, float]:
        """A CNN's max-pool (3x3, stride 2, with indices) and batch norm over 32 px planes,
        forward and backward, in bytes/s of what a trace counts (every tensor argument and
        result: a pool's backward counts the input whose shape it takes)."""
        f, e, aten = self.t.nn.functional, a.element_size(), self.t.ops.aten
        images = a.view(-1, 4, 32, 32)
        stats = (self.t.zeros(4, dtype=a.dtype, device=a.device),
                 self.t.ones(4, dtype=a.dtype, device=a.device))
        pooled, indices = f.max_pool2d(images, 3, 2, 1, return_indices=True)
        pool_bytes = a.numel() * e + pooled.numel() * (e + 8)
        pool = partial(f.max_pool2d, images, 3, 2, 1, return_indices=True)
        pool_back = partial(aten.max_pool2d_with_indices_backward, pooled, images, [3, 3],
                            [2, 2], [1, 1], [1, 1], False, indices)  # fmt: skip
        norm = partial(f.batch_norm, images, *stats, training=False)
        return {
            "pool": pool_bytes / self._median_s(pool),
            "pool_backward": (pool_bytes + a.numel() * e) / self._median_s(pool_back),
            "batch_norm": 2 * a.numel() * e / self._median_s(norm),
            **self._norm_training(a.view(-1, min(64, a.numel() // 1024), 32, 32), dtype),
        }

    def _norm_training(self, images: Any, dtype: str) -> dict[str, float]:
        """Batch norm in training over a CNN's channels (64): statistics, then the scale and
        shift (input and output counted), and its backward (output gradient and input read,
        input gradient written)."""
        aten, size = self.t.ops.aten, images.numel() * images.element_size()
        channels = images.shape[1]
        weight, bias = self._tensor(channels, dtype=dtype), self._tensor(channels, dtype=dtype)
        mean, var = self.t.zeros_like(weight), self.t.ones_like(weight)
        train = partial(aten.native_batch_norm, images, weight, bias, mean, var, True, 0.1, 1e-5)
        _, saved_mean, saved_invstd = train()
        back = partial(aten.native_batch_norm_backward, images, images, weight, mean, var,
                       saved_mean, saved_invstd, True, 1e-5, [True, True, True])  # fmt: skip
        return {
            "batch_norm_train": 2 * size / self._median_s(train),
            "batch_norm_backward": 3 * size / self._median_s(back),
        }

    def fresh(self) -> dict[str, float]:
        """First-touch rate of newly mapped memory: fill a fresh tensor past the mmap
        threshold, less the same fill into an existing one. In a process of its own: here
        the heap left by the other measurements could hand back memory already touched."""
        import json
        import subprocess
        import sys

        from gpuwise.estimate.speed.probed_kernels import GLIBC_MMAP_THRESHOLD_MAX

        self._step("fresh tensors")
        held = [n for n in self.plan.fresh_held if n <= _available_bytes() / 2]
        code = _FRESH_CHILD.format(n=self.plan.fresh_bytes // 4, threads=self.t.get_num_threads(),
                                   held=held)  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, check=True)  # fmt: skip
        new, into, by_held = json.loads(done.stdout.strip().splitlines()[-1])
        rate = lambda seconds: self.plan.fresh_bytes / max(seconds - into, 1e-9)  # noqa: E731
        return {"bytes_per_s": rate(new), "threshold": GLIBC_MMAP_THRESHOLD_MAX,
                "fill_fresh_s": new, "fill_existing_s": into,
                "by_held": [[0, rate(new)]] + [[n, rate(s)] for n, s in by_held]}  # fmt: skip

    def elementwise(self, dtype: str) -> dict[str, float]:
        t, n = self.t, self.plan.elementwise_elements
        self._step(f"elementwise {dtype}")
        a, b = self._tensor(n, dtype=dtype), self._tensor(n, dtype=dtype)
        out, positive = t.empty_like(a), a.abs()
        size = n * a.element_size()
        gelu, gelu_backward = t.nn.functional.gelu, t.ops.aten.gelu_backward
        return {
            "binary": 3 * size / self._median_s(lambda: t.mul(a, b, out=out)),
            "silu": 2 * size / self._median_s(lambda: t.nn.functional.silu(a)),
            "gelu": 2 * size / self._median_s(lambda: gelu(a, approximate="tanh")),
            "gelu_erf": 2 * size / self._median_s(lambda: gelu(a)),
            "gelu_backward": 3 * size / self._median_s(
                lambda: gelu_backward(b, a, approximate="tanh")),
            "gelu_erf_backward": 3 * size / self._median_s(lambda: gelu_backward(b, a)),
            "div": 3 * size / self._median_s(lambda: t.div(a, b, out=out)),
            "sqrt": 2 * size / self._median_s(lambda: t.sqrt(positive, out=out)),
            "tanh": 2 * size / self._median_s(lambda: t.tanh(a, out=out)),  # GPT-2's GELU
            "bernoulli": size / self._median_s(lambda: out.bernoulli_(0.9)),  # dropout masks
            **self._image_ops(a, dtype),
            "cat": self._append_rate(a, dtype),
        }

    def _append_rate(self, a: Any, dtype: str) -> float:
        """Bytes/s of a decode step's cache append: each call grows another layer's keys
        (heads, positions, dim), read cold, as DynamicCache's torch.cat does."""
        caches = _Cycle(self._cold_copies(a.view(SDPA_HEADS, -1, HEAD_DIM)))
        row = self._tensor(SDPA_HEADS, 1, HEAD_DIM, dtype=dtype)
        for _ in caches.items:  # once round, untimed: the heap then holds the old caches' space
            self._append(row, caches)
        size = a.numel() * a.element_size()
        return 2 * size / self._median_s(partial(self._append, row, caches))
