"""llama.cpp's memory rules (gpuwise/estimate/memory/llama_cpp_memory.py, llama_cpp_graph.py):
ggml-alloc's compute buffer against the sizes this machine's llama.cpp logs, CPU repacking
by instruction set, the file unmapped after loading, what a CPU run touches; and one real
llama-cpp-python run (`--slow`, needs llama-cpp-python, gguf and numpy)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate.memory import llama_cpp_alloc as alloc
from gpuwise.estimate.memory import llama_cpp_graph as graph
from gpuwise.estimate.memory import llama_cpp_memory as lcm
from gpuwise.estimate.memory import llama_cpp_repack as repack
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.units import MIB
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan, StoredWeights

# The random llama models of benchmarks/validate_llama_cpp_memory.py (S, M, L): hidden,
# layers, heads, KV heads, ffn; 32,000-token vocabulary.
SHAPES = {"S": (384, 6, 6, 2, 1024), "M": (768, 12, 12, 4, 2048), "L": (1536, 16, 12, 4, 4096)}


def _dims(name: str) -> graph.GraphDims:
    h, layers, heads, kv, ffn = SHAPES[name]
    return graph.GraphDims(h, layers, heads, kv, h // heads, ffn, 32000)


def _arch(name: str, **extra):
    h, layers, heads, kv, ffn = SHAPES[name]
    return from_config({"model_type": "llama", "hidden_size": h, "num_hidden_layers": layers,
                        "num_attention_heads": heads, "num_key_value_heads": kv,
                        "intermediate_size": ffn, "vocab_size": 32000,
                        "max_position_embeddings": 4096, "tie_word_embeddings": False,
                        **extra}, name)


def _cpu(vendor: str = "amd"):
    """A CPU the catalogue knows only by its vendor (as `--on local` detects one)."""
    return dataclasses.replace(find_hardware("cpu-cloud-32vcpu"), id="local-cpu", vendor=vendor)


# "sched_reserve: CPU compute buffer size" as llama-cpp-python 0.3.36's llama.cpp logs it on
# this machine (flash attention off, n_ubatch 512), to the 4 decimals of its destructor's line.
LOGGED_HERE = [("S", 512, 64.0020), ("S", 2048, 64.7520), ("M", 512, 65.5020),
               ("M", 2048, 67.0020), ("L", 512, 68.5020), ("L", 2048, 69.0098)]


@pytest.mark.parametrize("name,n_ctx,mib", LOGGED_HERE)
def test_compute_buffer_is_ggml_allocs_layout(name, n_ctx, mib):
    reserved, _ = graph.compute_buffer(_dims(name), n_ctx, 512, False)
    assert reserved / MIB == pytest.approx(mib, abs=1e-4)


def test_a_few_layers_stand_for_all():
    dims = _dims("M")  # 12 layers; compute_buffer simulates 4
    full = graph.build_graph(dims, 512, 2048, 512, False)
    size, offsets = alloc.allocate(full)
    run = graph.build_graph(dims, 300, 512, 1, False)
    pages = alloc.pages(alloc.touched_pages(full, offsets, run)) * alloc.PAGE
    assert graph.compute_buffer(dims, 2048, 512, False, ((300, 512, 1),)) == (size, pages)


def test_compute_buffer_grows_with_context_and_micro_batch_as_the_source_says():
    dims = graph.GraphDims(4096, 32, 32, 8, 128, 14336, 128256)  # Llama-3-8B
    small, _ = graph.compute_buffer(dims, 512, 512, False)
    big, _ = graph.compute_buffer(dims, 8192, 512, False)
    # without flash attention the f32 scores of n_ctx x n_ubatch x heads dominate (512 MiB)
    assert 8192 * 512 * 32 * 4 < big < 1.15 * 8192 * 512 * 32 * 4
    assert small == pytest.approx(128256 * 512 * 4, rel=0.1)  # n_ctx 512: the output logits
    flash, _ = graph.compute_buffer(dims, 8192, 512, True)
    assert flash < big  # the scores are never materialised
    wider, _ = graph.compute_buffer(dims, 512, 1024, False)
    assert wider == small  # n_ubatch 1024, but n_ctx 512 caps the micro-batch at 512
    twice, _ = graph.compute_buffer(dims, 1024, 1024, False)
    assert twice == pytest.approx(2 * small, rel=0.05)  # the output logits double


def test_a_cpu_run_touches_only_what_its_micro_batches_write():
    dims = _dims("S")
    reserved, short = graph.compute_buffer(dims, 512, 512, False, ((32, 256, 1),))
    _, long = graph.compute_buffer(dims, 512, 512, False, ((512, 512, 1),))
    assert short < long < reserved
    assert graph.compute_buffer(dims, 512, 512, False, ((32, 256, 1), (512, 512, 1)))[1] == long


def test_micro_batches_split_prompts_at_n_ubatch_and_pad_cells_to_256():
    plan = InferencePlan(prompt_tokens=1200, new_tokens=16, runtime="llama.cpp")
    assert lcm.micro_batches(plan, 2048) == ((176, 1280, 1), (512, 1024, 1))
    short = InferencePlan(prompt_tokens=40, new_tokens=8, runtime="llama.cpp")
    assert lcm.micro_batches(short, 512) == ((40, 256, 1),)  # the decode steps write less


def _q4_0_tensors(arch):
    return repack.estimated_tensors(arch, InferencePlan(weights="q4_0", runtime="llama.cpp"))


def test_q4_0_is_repacked_on_x86_with_avx2_not_q8_0():
    arch = _arch("L")
    tensors = _q4_0_tensors(arch)
    layer_bytes = sum(t.nbytes for t in tensors if t.matmul and t.name.startswith("blk."))
    extra = repack.repacked(tensors, repack.cpu_features(_cpu()))
    assert extra == {"CPU_REPACK": pytest.approx(layer_bytes, rel=1e-4)}  # output is Q6_K
    q8 = repack.estimated_tensors(arch, InferencePlan(weights="q8_0", runtime="llama.cpp"))
    assert repack.repacked(q8, frozenset({"avx2", "avx512"})) == {}
    assert repack.repacked(q8, frozenset({"neon", "dotprod"}))  # ARM repacks Q8_0
    odd = (repack.GgufTensor("blk.0.attn_q.weight", "q4_0", 100, 1536, 86400.0),)
    assert repack.repacked(odd, frozenset({"avx2"})) == {}  # 8x8 interleave: rows % 8


def test_amx_takes_q8_0_and_f16_on_sapphire_rapids():
    features = repack.cpu_features(find_hardware("cpu-2s-xeon-8480"))
    assert {"avx2", "amx"} <= features
    m = repack.GgufTensor("blk.0.ffn_up.weight", "q8_0", 4096, 1024, 4096 * 1024 * 34 / 32)
    assert repack.repacked((m,), features)["AMX"] == pytest.approx(4096 * 32 * 38, abs=32)
    f16 = repack.GgufTensor("blk.0.ffn_up.weight", "f16", 4096, 1024, 4096 * 1024 * 2.0)
    assert repack.repacked((f16,), features) == {"AMX": 4096 * 1024 * 2}


def test_repacked_weights_count_on_a_cpu_not_on_a_gpu():
    arch = _arch("L")
    plan = InferencePlan(weights="q4_0", runtime="llama.cpp", context_alloc=512,
                         attention="eager", prompt_tokens=128, new_tokens=16)
    cpu = estimate_inference(arch, plan, _cpu())
    assert cpu.breakdown["repacked_weights"] > 200 * MIB
    assert any("CPU_REPACK" in n for n in cpu.notes)
    gpu = estimate_inference(arch, plan, find_hardware("rtx-4090"))
    assert "repacked_weights" not in gpu.breakdown
    f16 = estimate_inference(arch, dataclasses.replace(plan, weights="fp16"), _cpu())
    assert f16.breakdown["repacked_weights"] == 0


def test_a_repacked_tensor_at_the_end_of_the_file_is_unmapped_after_loading():
    arch = _arch("L")
    tensors = _q4_0_tensors(arch)
    assert tensors[-1].name == "blk.15.ffn_up.weight"  # llama-quantize's order
    unmapped = repack.unmapped_after_load(tensors, frozenset({"avx2"}))
    assert unmapped == tensors[-1].nbytes == 4096 * 1536 * 18 / 32
    assert repack.unmapped_after_load(tensors, frozenset()) == 0


def test_a_checkpoints_own_tensors_decide_the_repacking():
    arch = _arch("S")
    own = (("output.weight", "Q6_K", 32000, 384, 10_080_000, 1),
           ("token_embd.weight", "Q4_0", 32000, 384, 6_912_000, 1),
           ("blk.0.attn_q.weight", "Q4_0", 384, 384, 82_944, 1),
           ("blk.0.attn_norm.weight", "F32", 1, 384, 1_536, 1),
           ("blk.0.ffn_up.weight", "Q4_0", 1024, 384, 221_184, 1))
    stored = StoredWeights(17_297_664, 6_912_000, "Q4_0 (gguf)", "Q4_0", own)
    plan = InferencePlan(weights="fp16", stored_weights=stored, runtime="llama.cpp",
                         context_alloc=512, attention="eager", prompt_tokens=16, new_tokens=4)
    est = estimate_inference(arch, plan, _cpu())
    assert est.breakdown["repacked_weights"] == 82_944 + 221_184
    assert est.breakdown["weights"] == 17_297_664 - 221_184  # the file's last tensor unmapped


def test_kv_cache_and_output_buffer_on_a_cpu():
    arch = _arch("M")
    plan = InferencePlan(weights="q8_0", runtime="llama.cpp", context_alloc=2000,
                         prompt_tokens=400, new_tokens=16)
    est = estimate_inference(arch, plan, _cpu())
    assert est.breakdown["kv_cache"] == 2048 * 12 * 2 * 256 * 2  # padded to 2048 cells, f16
    assert est.breakdown["logits"] == 32000 * 4
    assert est.peak_phase == "generate"
    assert sum(est.breakdown.values()) == est.total_bytes


def test_runtime_state_follows_the_vocabulary():
    rt = lcm.llama_cpp_runtime()
    small = lcm.runtime_state(_arch("S"), 512, rt)
    wide = lcm.runtime_state(_arch("S", vocab_size=128000), 512, rt)
    assert wide["vocabulary"] - small["vocabulary"] == 96000 * rt.vocab_bytes_per_token
    assert small["graph metadata"] == 2 * 408 * 1024  # max(1024, 8 x 57 tensors) nodes


@pytest.mark.slow
def test_a_real_llama_cpp_run_is_within_the_target(tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from gpuwise.app.checkpoint_weights import plan_weights
    from gpuwise.app.lookup import hardware_named, model_named
    from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, quantize, write_random_gguf
    from gpuwise.measure.llama_cpp.memory_run import measure_llama_cpp_memory

    cfg = GgufConfig(hidden=384, layers=6, heads=6, kv_heads=2, ffn=1024)
    path = quantize(write_random_gguf(tmp_path / "s-f16.gguf", cfg), tmp_path / "s-q4_0.gguf",
                    "q4_0")
    measured = measure_llama_cpp_memory(path, prompt_tokens=64, new_tokens=8)
    assert measured["buffers_mib"]["CPU_REPACK model"] > 0
    resolved, arch = model_named(str(path))
    chosen = plan_weights(resolved, "llama.cpp", None)
    plan = InferencePlan(prompt_tokens=64, new_tokens=8, weights=chosen["weights"],
                         stored_weights=chosen["stored_weights"], runtime="llama.cpp",
                         context_alloc=512, attention="eager")
    est = estimate_inference(arch, plan, hardware_named("local"))
    assert est.model_bytes / measured["peak_bytes"] - 1 == pytest.approx(0, abs=0.05)
