"""SGLang's own defaults by device (issue 39, item 2): mem_fraction_static and chunked prefill as
its server_args.py picks them, the KV pool model_runner.py's profile_max_num_token leaves, and
max_running_requests by that pool; infer, serve and the memory model agree on them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.cuda_allocator import cuda_allocator
from gpuwise.catalog.schedulers import scheduler_defaults
from gpuwise.cli.common import app
from gpuwise.estimate.memory.fits import max_context
from gpuwise.estimate.memory.sglang_memory import mem_fraction_static
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan

GIB, MIB = 2**30, 2**20
SGLANG = runtime_unit("sglang")
LLAMA_8B_BF16 = 8_030_261_248 * 2  # weights, bytes
LLAMA_8B_KV = 32 * 2 * 8 * 128 * 2  # bytes a token: layers x (K, V) x KV heads x head dim x bf16


def _arch():  # type: ignore[no-untyped-def]
    return from_config(resolve_model("llama-3.1-8b").config)


def _plan(**kw: object) -> InferencePlan:
    return build_plan(resolve_model("llama-3.1-8b"),
                      Deployment(runtime="sglang", weights="bf16", **kw),  # type: ignore[arg-type]
                      Workload()).plan


def _sglang_fraction(gpu_mem_mib: float, chunk: int, graphs: int, tp: int) -> float:
    """server_args.py _handle_gpu_memory_settings, written out (pp 1, no DP attention)."""
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + tp / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


@pytest.mark.parametrize("device,tp,chunk,graphs,expected", [
    ("h100", 1, 8192, 256, 0.835),  # 13,440 MiB reserved
    ("h200", 1, 8192, 256, 0.907),
    ("h200", 4, 8192, 512, 0.900),  # tp 4: larger graphs and the parallel adjustment
    ("rtx-4090", 1, 2048, 24, 0.847),  # a 24 GB card
    ("t4", 1, 2048, 8, 0.757),
    ("a100-40gb", 1, 4096, 32, 0.833),
])
def test_mem_fraction_static_is_sglangs_formula(device, tp, chunk, graphs, expected):
    hw = find_hardware(device)
    assert _sglang_fraction(hw.memory_bytes / MIB, chunk, graphs, tp) == expected
    assert mem_fraction_static(hw, tp) == expected
    sched = SGLANG.scheduler_on(hw)
    assert sched.max_batched_tokens == chunk
    tier = scheduler_defaults("sglang").tier(hw.memory_bytes)
    assert tier is not None and tier.graph_batch(tp) == graphs


def test_the_pool_and_running_requests_on_an_h100():
    """Llama-3.1-8B bf16 on an H100: mem_fraction_static 0.835 of what the CUDA context leaves,
    less the weights, in tokens of 128 KiB; max_running_requests 2048 at its 128K context."""
    arch, hw, plan = _arch(), find_hardware("h100"), _plan()
    free = hw.memory_bytes - cuda_allocator().cuda_context_bytes
    pool = 0.835 * free - LLAMA_8B_BF16
    tokens = int(pool // LLAMA_8B_KV)
    assert 400_000 < tokens < 430_000
    assert SGLANG.kv_positions(arch, plan, hw, 1, 0) == tokens
    est = estimate_inference(arch, plan, hw)
    assert est.breakdown["kv_cache"] == round(pool) and est.breakdown["weights"] == LLAMA_8B_BF16
    assert est.total_bytes == pytest.approx(hw.memory_bytes, abs=8)  # taken up front
    assert est.verdict == "yes" and est.headroom_bytes == int(pool - 131072 * LLAMA_8B_KV)
    notes = " ".join(est.notes)
    assert "mem_fraction_static 0.835, SGLang's default" in notes
    assert "13,440 MiB kept for activations and CUDA graphs" in notes
    # max_num_reqs = min(max(tokens / context_len x 512, 2048), 4096), at most tokens / 2
    assert min(max(int(tokens / 131072 * 512), 2048), 4096) == 2048
    assert SGLANG.scheduler_for(arch, plan, hw).max_seqs == 2048
    assert "SGLang runs at most 2048 at once" in notes
    short = _plan(ctx=8192)  # a shorter --context-length: more requests, up to 4096
    assert SGLANG.scheduler_for(arch, short, hw).max_seqs == 4096
    assert scheduler_defaults("sglang").with_cache(3000, 131072).max_seqs == 1500  # tokens / 2


def test_the_users_fraction_is_kept():
    arch, hw = _arch(), find_hardware("h100")
    est = estimate_inference(arch, _plan(gpu_memory_utilization=0.7), hw)
    free = hw.memory_bytes - cuda_allocator().cuda_context_bytes
    assert est.breakdown["kv_cache"] == round(0.7 * free - LLAMA_8B_BF16)
    assert any(n.startswith("mem_fraction_static 0.7, from --gpu-memory-utilization")
               for n in est.notes)


def test_tensor_parallel_devices_each_hold_a_share():
    arch, hw = _arch(), find_hardware("h200")
    plan = _plan(tp=4)
    est = estimate_inference(arch, plan, hw)
    free = hw.memory_bytes - cuda_allocator().cuda_context_bytes
    assert est.breakdown["weights"] == LLAMA_8B_BF16 // 4
    assert est.breakdown["kv_cache"] == round(0.900 * free - LLAMA_8B_BF16 / 4)
    tokens = int((0.900 * free - LLAMA_8B_BF16 / 4) // (LLAMA_8B_KV / 4))
    assert SGLANG.kv_positions(arch, plan, hw, 4, 0) == tokens


@pytest.mark.parametrize("device,chunk", [("rtx-4090", 2048), ("l4", 2048), ("h100", 8192)])
def test_serves_engine_chunks_prompts_as_sglang_does_on_the_device(device, chunk):
    arch, hw, plan = _arch(), find_hardware(device), _plan()
    engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions())
    assert engine.limits.max_batched_tokens == chunk
    assert engine.kv_blocks * engine.block_tokens == SGLANG.kv_positions(arch, plan, hw, 1, 0)
    assert engine.limits.max_seqs == SGLANG.scheduler_for(arch, plan, hw).max_seqs
    given = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions(max_batched_tokens=512))
    assert given.limits.max_batched_tokens == 512  # --max-batched-tokens is kept


def test_where_the_whole_context_does_not_fit_the_longest_that_does_is_named():
    """A 24 GB card: the pool holds ~39K tokens, not the 128K context; SGLang still starts, but
    the whole context does not fit, and the note names the longest --ctx that does."""
    arch, hw, plan = _arch(), find_hardware("rtx-4090"), _plan()
    est = estimate_inference(arch, plan, hw)
    tokens = SGLANG.kv_positions(arch, plan, hw, 1, 0)
    assert 30_000 < tokens < 50_000 and not est.fits
    assert any(f"--ctx {tokens} (its --context-length) holds a whole one" in n for n in est.notes)
    assert any("SGLang starts, but caps a request's input" in n for n in est.notes)
    assert estimate_inference(arch, replace(plan, context_alloc=tokens), hw).verdict == "tight"
    assert not estimate_inference(arch, replace(plan, context_alloc=tokens + 1), hw).fits
    assert max_context(arch, plan, hw) == tokens


def _cli_json(*args: str) -> dict:
    out = CliRunner().invoke(app, list(args))
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_infer_and_serve_agree_on_the_pool():
    infer = _cli_json("infer", "llama-3.1-8b", "--runtime", "sglang", "--on", "h100", "--json")
    serve = _cli_json("serve", "llama-3.1-8b", "--runtime", "sglang", "--on", "h100",
                      "--rate", "0.5", "--requests", "20", "--json")
    pool = infer["memory"]["breakdown"]["kv_cache"]
    assert serve["kv_cache_tokens"] == pool // LLAMA_8B_KV
    assert any("mem_fraction_static 0.835" in n for n in infer["memory"]["notes"])


def test_where_the_weights_leave_no_pool_sglang_refuses_to_start():
    arch, hw = _arch(), find_hardware("t4")  # 0.757 of 15 GiB is less than 15 GiB of fp16 weights
    est = estimate_inference(arch, _plan(), hw)
    assert SGLANG.kv_positions(arch, _plan(), hw, 1, 0) == 0 and not est.fits
    assert any(n.startswith("SGLang refuses to start") for n in est.notes)
