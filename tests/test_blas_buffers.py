"""The BLAS packing buffers a CPU run leaves (estimate/memory/blas_buffers.py) against what an
LD_PRELOAD tracer of malloc and free saw torch 2.13's MKL and oneDNN keep (allocators.toml,
[blas_packing]; benchmarks/blas_buffers_trace.py)."""

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.allocators import blas_packing
from gpuwise.estimate import InferencePlan, TrainingPlan, estimate_inference, estimate_training
from gpuwise.estimate.memory.blas_buffers import blas_buffer_bytes, buffer_bytes, held_bytes
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape

# (m, n, k, threads) -> bytes each thread kept after one product, traced (torch.mm, F.linear,
# and torch.bmm's per-batch products on one thread).
TRACED = [
    ((512, 2304, 768, 2), 2179744), ((1024, 2304, 768, 2), 2376352),
    ((4096, 2304, 768, 2), 2376352), ((64, 2304, 768, 2), 1835680),
    ((16, 2304, 768, 2), 1798816), ((512, 2304, 256, 2), 1458848),
    ((512, 2304, 64, 2), 1458848), ((512, 2304, 384, 2), 2179744),
    ((512, 512, 768, 2), 803488), ((512, 8192, 768, 2), 5325472),
    ((512, 6000, 768, 2), 5018272), ((512, 50257, 768, 2), 5325472),
    ((768, 8192, 768, 2), 5522080), ((64, 50257, 768, 2), 4981408),
    ((512, 2304, 768, 1), 2376352), ((64, 2304, 768, 1), 1884832),
    ((16, 2304, 768, 1), 1811104), ((4, 50257, 768, 1), 4938400),
    ((512, 512, 64, 1), 672416), ((512, 64, 512, 1), 656032), ((256, 256, 64, 1), 410272),
    ((512, 6400, 768, 2), 5325472), ((512, 768, 768, 2), 1000096),
    ((512, 768, 3072, 2), 1000096), ((128, 2304, 768, 2), 1884832),
    ((256, 2304, 768, 2), 1983136), ((768, 2304, 768, 2), 2376352),
    ((2048, 2304, 768, 2), 2376352), ((512, 2304, 1536, 2), 2179744),
    ((512, 2304, 3072, 2), 2179744), ((512, 2304, 128, 2), 1458848),
    ((256, 2304, 768, 1), 2179744), ((1024, 2304, 768, 1), 2376352),
    ((512, 512, 768, 1), 1000096), ((512, 50257, 768, 1), 5522080),
    ((8, 50257, 768, 2), 4938400),
]


@pytest.mark.parametrize(("gemm", "traced"), TRACED)
def test_one_product_keeps_what_was_traced(gemm, traced):
    assert buffer_bytes(blas_packing(), *gemm) == traced


def test_short_products_keep_nothing_or_use_one_thread():
    rule = blas_packing()
    assert held_bytes([(2, 50257, 768, False)], 2) == 0  # a gemv-like product: nothing packed
    assert held_bytes([(4, 50257, 768, False)], 2) == 4938400  # one thread only
    assert held_bytes([(8, 50257, 768, False)], 2) == 2 * buffer_bytes(rule, 8, 50257, 768, 2)


def test_a_thread_keeps_each_record_need_in_the_order_run():
    a, b = (512, 2304, 768, False), (512, 512, 768, False)
    # the smaller product after the larger fits in its buffer; before it, both stay
    assert held_bytes([a, b], 2) == 2 * 2179744
    assert held_bytes([b, a], 2) == 2 * (803488 + 2179744)


@pytest.mark.parametrize(("model", "per_thread"), [
    ("gpt2", (2179744, 2769568, 5325472)),  # c_attn, c_fc, the head: traced pairs
    ("smollm2-135m", (852640, 1589920, 5325472)),  # q_proj, gate_proj, the head
])
def test_training_step_keeps_the_traced_pairs(model, per_thread):
    arch = from_config(resolve_model(model).config)
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa", logits_tokens=256)
    assert blas_buffer_bytes(arch, [s], 2, training=True) == 2 * sum(per_thread)


def test_a_training_step_on_four_threads_keeps_what_was_traced():
    """GPT-2, b2 s256, OMP_NUM_THREADS=4 MKL_DYNAMIC=FALSE: MKL's 1 x 3 grid keeps c_attn's,
    c_fc's and the head's buffers on three threads; the fourth, idle in that grid, keeps
    the SDPA math path's batched product (dropout: no flash kernel), on one thread each."""
    arch = from_config(resolve_model("gpt2").config)
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa", logits_tokens=256)
    traced = 410272 + 3 * (1196704 + 1393312 + 5522080)
    assert blas_buffer_bytes(arch, [s], 4, training=True) == traced


def test_a_training_step_on_eight_threads_is_within_six_percent_of_the_trace():
    """SmolLM2-135M, b2 s256, 8 threads: traced 8 x q_proj's, 4 x gate_proj's and 8 x the
    head's buffers; the rule keeps gate_proj's on all eight of the 2 x 4 grid."""
    arch = from_config(resolve_model("smollm2-135m").config)
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa", logits_tokens=256)
    traced = 8 * 520864 + 4 * 705184 + 8 * 5325472
    assert blas_buffer_bytes(arch, [s], 8, training=True) == pytest.approx(traced, rel=0.06)


def test_bf16_products_keep_onednn_buffer_per_thread():
    arch = from_config(resolve_model("gpt2").config)
    s = Shape(1, 256, 256, 2, 2, 2)
    assert blas_buffer_bytes(arch, [s], 4) == 4 * blas_packing().onednn_bytes


def test_generate_prefill_head_on_last_position_keeps_no_head_buffer():
    """generate() runs the head on each sequence's last position: two rows at batch 2."""
    arch = from_config(resolve_model("gpt2").config)
    prefill = Shape(2, 512, 512, 4, 4, 4, "eager")
    decode = Shape(2, 1, 520, 4, 4, 4, "eager")
    assert blas_buffer_bytes(arch, [prefill, decode], 2) == 2 * (2376352 + 2966176)  # traced


def test_cpu_estimates_carry_the_row_and_gpu_estimates_do_not():
    cpu, gpu = find_hardware("cpu-cloud-32vcpu"), find_hardware("h100-sxm")
    arch = from_config(resolve_model("gpt2").config)
    train = TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")
    infer = InferencePlan(batch=2, prompt_tokens=512, new_tokens=8, weights="fp32")
    for est in (estimate_training(arch, train, cpu), estimate_inference(arch, infer, cpu)):
        assert est.breakdown["blas_buffers"] > 0
        assert est.total_bytes == sum(est.breakdown.values())
    assert "blas_buffers" not in estimate_training(arch, train, gpu).breakdown


def test_more_threads_keep_more():
    arch = from_config(resolve_model("gpt2").config)
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa", logits_tokens=256)
    one, two, eight = (blas_buffer_bytes(arch, [s], t, training=True) for t in (1, 2, 8))
    assert one < two < eight


# threads -> {(m, n, k): (threads that kept a buffer, pages of the largest beyond the fixed 4)},
# traced with MKL_DYNAMIC=FALSE (allocators.toml, [blas_packing] grids)
GRIDS = {
    3: {(512, 2304, 768): (2, 360), (256, 2304, 768): (2, 312), (2048, 768, 768): (2, 216)},
    4: {(512, 2304, 768): (3, 288), (512, 576, 576): (3, 180), (1024, 3072, 768): (3, 336),
        (256, 2304, 768): (3, 240), (512, 50257, 768): (3, 1344)},
    8: {(512, 2304, 768): (8, 204), (512, 1536, 576): (8, 168), (2048, 768, 768): (8, 180),
        (256, 2304, 768): (8, 156), (512, 50257, 768): (8, 1296)},
    16: {(512, 2304, 768): (15, 151.5), (512, 576, 576): (15, 88.5),
         (1024, 3072, 768): (15, 246), (512, 50257, 768): (15, 1264.5)},
    24: {(512, 2304, 768): (24, 120), (256, 2304, 768): (24, 96), (2048, 768, 768): (24, 168)},
    32: {(512, 2304, 768): (32, 102), (256, 2304, 768): (32, 78), (2048, 768, 768): (32, 162)},
    64: {(512, 2304, 768): (63, 76.5), (256, 2304, 768): (63, 63), (2048, 768, 768): (56, 129)},
}


@pytest.mark.parametrize("threads", sorted(GRIDS))
def test_more_threads_split_the_product_into_the_traced_grid(threads):
    rule = blas_packing()
    for (m, n, k), (buffers, pages) in GRIDS[threads].items():
        each = buffer_bytes(rule, m, n, k, threads)
        assert (each - rule.header_bytes) / 4096 - rule.fixed_pages == pytest.approx(pages, rel=0.03)
        assert held_bytes([(m, n, k, False)], threads, rule) == buffers * each


def test_past_the_last_measured_grid_the_split_stays_about_square():
    rule = blas_packing()
    rows, cols = rule.grid(112)
    assert rows * cols <= 112 and abs(rows - cols) <= 4
    assert rule.grid(5) == rule.grid(4) and rule.grid(1) == (1, 1)
