"""What the kernel probe measures: the shapes, sizes and dtypes of each kernel's grid, and the
larger work a GPU needs (a call of a few microseconds times the launch, not the kernel)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as _replace

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
    )
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


def with_cold_set(plan: KernelPlan, cache_bytes: int) -> KernelPlan:
    return _replace(plan, cold_set_bytes=max(plan.cold_set_bytes, 4 * cache_bytes))
