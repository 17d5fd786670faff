"""The BLAS's packing buffers on a CPU (the "blas_buffers" row of a CPU estimate). Pure.

Each thread that takes part in a CPU matrix product packs its blocks of the operands into a
buffer of its own, taken with malloc and kept after the call (catalog/data/allocators.toml,
[blas_packing]; docs/memory.md, "On a CPU"). A later product that needs more than the thread's
largest buffer takes a new one beside it, so a thread holds the record needs of the products
it has run, in the order it ran them: for a transformer, the first layer's projections, the
LM head, and in training the backward's products where they need more. The warm-up on a tiny
model (`gpuwise validate`) leaves buffers of a few KiB, in the baseline.

fp32 products go through MKL's sgemm, whose buffer grows with the rows each thread packs and
the columns of the right operand; bf16 ones through oneDNN, one fixed buffer per thread.
`threads` is the process's intra-op threads (torch's default: one a core).
"""

from __future__ import annotations

from gpuwise.catalog.allocators import BlasPacking, blas_packing
from gpuwise.workload.arch import Architecture
from gpuwise.workload.ops import Shape, forward_ops

Gemm = tuple[int, int, int, bool]  # (m, n, k, batched): (m x k) @ (k x n); torch.bmm's
# batched products run a slice of the batch a thread, each product on its one thread


def buffer_bytes(rule: BlasPacking, m: int, n: int, k: int, threads: int) -> int:
    """What each thread that takes part keeps after an fp32 (m x k) @ (k x n) on `threads`
    threads (the largest block of MKL's grid)."""
    row_blocks, col_blocks = _grid(rule, n, threads)
    rows = min(2 * -(-m // row_blocks), rule.rows_cap)
    depth = rule.depth_narrow if k <= rule.narrow_depth_max else rule.depth_wide
    cols = min(-(-n // col_blocks), rule.cols_cap)
    return rule.header_bytes + rule.fixed_pages * 4096 + 4 * depth * (rows + cols)


def _grid(rule: BlasPacking, n: int, threads: int) -> tuple[int, int]:
    """MKL's row and column blocks, a column block at least `min_cols_per_block` wide."""
    row_blocks, col_blocks = rule.grid(threads)
    return row_blocks, max(1, min(col_blocks, n // rule.min_cols_per_block))


def _threads_used(rule: BlasPacking, m: int, n: int, threads: int, batched: bool) -> int:
    """How many threads keep a buffer: none for a product of a row or two, every thread for
    a batched one (a slice each), one for a short product, else MKL's grid."""
    if m <= rule.no_buffer_rows_max:
        return 0
    if batched:
        return threads
    if m < rule.one_thread_rows_below:
        return 1
    row_blocks, col_blocks = _grid(rule, n, threads)
    return row_blocks * col_blocks


def _forward(arch: Architecture, s: Shape, batched_attention: bool) -> list[Gemm]:
    """The forward's products in the order the first layer runs them, then the head: a
    projection run as several GEMMs (q, k, v; gate, up) is one each; attention's scores and
    their product with v where they are batched products (eager, SDPA's math path)."""
    out: list[Gemm] = []
    for op in forward_ops(arch, s):
        if op.kind == "matmul":
            out += [(op.m, n, op.k, False) for n in (op.splits or (op.n,))]
        elif op.kind == "attention" and batched_attention:
            out += [(s.tokens, s.context, arch.head_dim, True),
                    (s.tokens, arch.head_dim, s.context, True)]
    return out


def _backward(forward: list[Gemm], trains_weights: bool) -> list[Gemm]:
    """The backward's products, last layer's first: each product's input gradient
    (m x n) @ (n x k), and its weight gradient (n x m) @ (m x k) where the weights train (a
    batched product's operands both take one)."""
    out: list[Gemm] = []
    for m, n, k, batched in reversed(forward):
        out.append((m, k, n, batched))
        if trains_weights or batched:
            out.append((n, k, m, batched))
    return out


def held_bytes(gemms: list[Gemm], threads: int, rule: BlasPacking | None = None) -> int:
    """Every thread's kept buffers after running `gemms` in order (fp32, MKL) on `threads`
    threads: a product whose need passes a thread's largest buffer adds a new one to it."""
    rule = rule or blas_packing()
    largest = [0] * threads
    held = 0
    for m, n, k, batched in gemms:
        used = _threads_used(rule, m, n, threads, batched)
        if not used:
            continue
        need = buffer_bytes(rule, m, n, k, 1 if batched or used == 1 else threads)
        for i in range(used):  # the calling thread is thread 0
            if need > largest[i]:
                largest[i] = need
                held += need
    return held


def blas_buffer_bytes(arch: Architecture, shapes: list[Shape], threads: int,
                      training: bool = False, trains_weights: bool = True) -> int:
    """The packing buffers the plan's forwards over `shapes`, in order (a prefill, then a
    decode step; or a training step's, `logits_tokens` the positions the head runs on), and
    a training step's backward leave on `threads` threads."""
    rule = blas_packing()
    threads = max(1, threads)
    if shapes[0].compute_bytes != 4:  # bf16 and fp16 products: oneDNN's buffer
        return rule.onednn_bytes * threads
    math = training and bool(arch.attention_dropout)  # SDPA's math path (prefill_heap)
    gemms = [g for s in shapes for g in _forward(arch, s, s.attention == "eager" or math)]
    if training:
        gemms += _backward(gemms, trains_weights)
    return held_bytes(gemms, threads, rule)
