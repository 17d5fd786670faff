"""The memory features of training and serving stacks (estimate/memory/stack_features.py,
quant_workspace.py, training.py, serving_runtimes.py's vLLM part): each changes the estimate
the way its stack's source says, and each test fails if the rule were wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_cli import run

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.serving_runtimes import vllm_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.activations import saved_with_policy
from gpuwise.estimate.memory.quant_workspace import quant_workspace
from gpuwise.estimate.memory.serving_runtimes import vllm_pool, vllm_scheduler
from gpuwise.estimate.memory.stack_features import (
    fused_chunk_rows,
    loss_memory,
    qlora_dequant_bytes,
    qlora_weights,
)
from gpuwise.estimate.memory.training import estimate_training, param_bytes
from gpuwise.workload import count_params, from_config
from gpuwise.workload.plans import InferencePlan, TrainingPlan

H100 = find_hardware("h100-sxm")
LLAMA8 = from_config(resolve_model("llama-3.1-8b").config)
LLAMA3 = from_config(resolve_model("llama-3.2-3b").config)
BASE = TrainingPlan(batch=2, seq=2048, dtype="bf16", checkpointing=True)


def est(plan: TrainingPlan, arch=LLAMA8, hw=H100):
    return estimate_training(arch, plan, hw)


@pytest.mark.parametrize("chunks", [1, 4, 8, 16])
def test_chunked_loss_upcasts_one_chunk_at_a_time(chunks):
    plan = replace(BASE, loss="chunked", loss_chunks=chunks)
    tokens, vocab = plan.batch * plan.seq, LLAMA8.vocab_size
    loss = loss_memory(LLAMA8, plan, 0.0, 2.0, 2.0)
    assert loss.turn == pytest.approx(tokens / chunks * vocab * 8)  # two fp32 per chunk
    assert loss.saved == pytest.approx(tokens * vocab * 4)  # eager: fp32 log-probs kept
    compiled = loss_memory(LLAMA8, replace(plan, runtime="compiled"), 0.0, 2.0, 2.0)
    assert compiled.saved == pytest.approx(tokens * vocab * 2)  # bf16 logits kept
    full = loss_memory(LLAMA8, BASE, 123.0, 2.0, 2.0)
    assert full.turn == pytest.approx(tokens * vocab * 8) and full.saved == 123.0


def test_fused_loss_keeps_no_logits_and_chunks_as_liger_does():
    # Liger's own example: BT = 4096*4, V = 32000, H = 4096 -> inc_factor 8, chunk 2048
    mistral = from_config(resolve_model("mistral-7b").config)
    assert fused_chunk_rows(4096 * 4, mistral) == 2048
    plan = replace(BASE, batch=4, seq=4096, loss="fused")
    loss = loss_memory(mistral, plan, 0.0, 2.0, 2.0)
    tokens, d, v = 4 * 4096, mistral.hidden_size, mistral.vocab_size
    assert loss.saved == pytest.approx(tokens * d * 2 + v * d * 2 + tokens * 4)
    assert loss.turn == pytest.approx(2048 * v * 2)
    assert loss.head_grad_in_forward
    lower = est(replace(BASE, loss="fused")).total_bytes
    assert lower < est(BASE).total_bytes


def test_optimizer_in_backward_holds_one_gradient_and_has_no_step_phase():
    plan = replace(BASE, optimizer="adamw_fused", loss="fused")
    inbwd = est(replace(plan, optimizer_in_backward=True))
    normal = est(plan)
    counts = count_params(LLAMA8)
    assert "optimizer step" not in inbwd.phases and "optimizer step" in normal.phases
    assert inbwd.breakdown["gradients"] == 0
    # backward holds the largest parameter's gradient (bf16) and the recomputed layer
    largest = max(counts.embedding, counts.lm_head) * 2
    recompute = saved_with_policy(LLAMA8, 2, 2048, "bf16", "sdpa", True, "full")["recompute"]
    assert inbwd.breakdown["workspace"] == pytest.approx(largest + recompute, rel=1e-6)
    # without it the step holds every gradient
    assert normal.phases["optimizer step"] - normal.phases["forward"] > counts.total * 2 * 0.5


def test_zero_offload_moves_states_and_the_fp32_master_to_the_host():
    plan = replace(BASE, dtype="mixed-bf16", gpus=8, zero=2)
    on_gpu = est(plan)
    offloaded = est(replace(plan, offload=("optimizer",)))
    assert offloaded.breakdown["optimizer"] == 0
    states = param_bytes(LLAMA8, plan).optimizer  # 12 bytes/param / 8 ranks
    assert states == pytest.approx(count_params(LLAMA8).total * 12 / 8)
    assert offloaded.host_bytes >= states  # the states, and the gradients beyond a bucket
    assert any(n.startswith("host memory:") for n in offloaded.notes)
    assert on_gpu.total_bytes - offloaded.total_bytes >= states * 0.9


def test_fsdp2_reshards_one_layer_at_a_time():
    plan = replace(BASE, dtype="mixed-bf16", gpus=8, sharding="fsdp2")
    counts = count_params(LLAMA8)
    unit = max(counts.embedding, counts.lm_head)  # the head is the largest unit
    held = est(plan).breakdown["fsdp_unsharded"]
    assert held == pytest.approx(2 * unit * 2 + unit * 4, rel=1e-6)
    kept = est(replace(plan, reshard_after_forward=False)).breakdown["fsdp_unsharded"]
    assert kept == pytest.approx(counts.total * 2 + unit * 4, rel=1e-6)
    pb = param_bytes(LLAMA8, plan)
    assert pb.weights == pytest.approx(counts.total * 4 / 8)  # fp32 shards, no bf16 copy
    assert pb.optimizer == pytest.approx(counts.total * 8 / 8)


def test_paged_optimizer_states_are_outside_the_pool():
    paged = est(replace(BASE, optimizer="paged_adamw8bit"))
    eightbit = est(replace(BASE, optimizer="adamw8bit"))
    assert paged.breakdown["optimizer"] == 0 < eightbit.breakdown["optimizer"]
    assert paged.paged_bytes == eightbit.breakdown["optimizer"]  # counted, outside the pool
    assert paged.paged_on_device_bytes + paged.paged_on_host_bytes == paged.paged_bytes
    assert any("unified memory" in n for n in paged.notes)


def test_selective_checkpointing_policies():
    args = (LLAMA8, 2, 2048, "bf16", "sdpa")
    none = saved_with_policy(*args, False, "full")["layers"]
    full = saved_with_policy(*args, True, "full")["layers"]
    op = saved_with_policy(*args, True, "op")["layers"]
    every1 = saved_with_policy(*args, True, "1")["layers"]
    every2 = saved_with_policy(*args, True, "2")["layers"]
    beyond = saved_with_policy(*args, True, str(LLAMA8.num_layers + 1))["layers"]
    assert full < op < none
    assert every1 == pytest.approx(full) and beyond == pytest.approx(none)
    assert every2 == pytest.approx((full + none) / 2)
    # op keeps the layer input plus q, v, w1, w2 and the attention output (bf16) + lse
    d, q, kv, i = LLAMA8.hidden_size, LLAMA8.q_dim, LLAMA8.kv_dim, LLAMA8.intermediate_size
    per = (op - full) / LLAMA8.num_layers
    tokens = 2 * 2048
    assert per == pytest.approx(tokens * (2 * (2 * q + kv + i + d) + 4 * LLAMA8.num_heads))


def test_qlora_double_quantisation_and_peft_fp32_cast():
    plan = replace(BASE, finetune="qlora", kbit_prepare=False)
    counts = count_params(LLAMA8)
    dq = qlora_weights(LLAMA8, plan)
    nodq = qlora_weights(LLAMA8, replace(plan, double_quant=False))
    assert nodq - dq == pytest.approx(counts.linear / 64 * (4 - 1.015625))
    prepared = qlora_weights(LLAMA8, replace(plan, kbit_prepare=True))
    assert prepared - dq == pytest.approx((counts.total - counts.linear) * 2)
    fp32 = replace(plan, quant_compute_dtype="fp32")
    largest = LLAMA8.hidden_size * LLAMA8.intermediate_size
    dequant = qlora_dequant_bytes(LLAMA8, fp32) - qlora_dequant_bytes(LLAMA8, plan)
    assert dequant == pytest.approx(largest * 2)
    # it counts with the layers' backward, after the loss's saved logits have gone
    short = replace(plan, batch=1, seq=16)
    grown = est(replace(short, quant_compute_dtype="fp32")).phases["backward"]
    assert 0 < grown - est(short).phases["backward"] <= dequant


def test_adapter_dtype_decides_peft_fp32_input_casts():
    peft = est(replace(BASE, finetune="lora"))
    torchtune = est(replace(BASE, finetune="lora", adapter_dtype="bf16"))
    assert torchtune.breakdown["activations"] < peft.breakdown["activations"]


def test_awq_gemm_dequantises_only_from_1024_rows():
    short = InferencePlan(batch=1, prompt_tokens=512, weights="int4", quant_kernel="awq-gemm")
    assert quant_workspace(LLAMA8, short)[0] == 0
    long = replace(short, prompt_tokens=1024)
    largest = LLAMA8.hidden_size * LLAMA8.intermediate_size
    assert quant_workspace(LLAMA8, long)[0] == largest * 2
    scratch, _ = quant_workspace(LLAMA8, replace(short, quant_kernel="exllama"))
    assert scratch >= LLAMA8.intermediate_size * 2048 * 8 * 4
    assert quant_workspace(LLAMA8, replace(short, weights="bf16"))[0] == 0


def test_vllm_profile_run_and_cuda_graphs():
    plan = InferencePlan(runtime="vllm")
    budget, weights, acts, pool = vllm_pool(LLAMA8, plan, H100)
    rt = vllm_runtime()
    seqs = vllm_scheduler(H100).max_seqs  # vLLM's default on an H100: 1024
    # the sampler's dummy logits for max_num_seqs sequences are part of the profiled peak
    assert seqs == 1024 and acts > seqs * LLAMA8.vocab_size * rt.sampler_bytes_per_logit
    _, _, _, before = vllm_pool(LLAMA8, plan, H100, cudagraphs_in_budget=False)
    assert before - pool == rt.cuda_graph_bytes
    more = replace(plan, gpu_memory_utilization=0.95)
    assert vllm_pool(LLAMA8, more, H100)[3] > pool


def test_bad_stack_options_are_refused():
    with pytest.raises(GpuwiseError):
        TrainingPlan(loss="chunky")
    with pytest.raises(GpuwiseError):
        TrainingPlan(offload=("disk",))
    with pytest.raises(GpuwiseError):
        TrainingPlan(checkpointing_policy="0")
    with pytest.raises(GpuwiseError):
        TrainingPlan(gpus=2, zero=2, optimizer_in_backward=True)


def test_cli_names_the_stacks_and_refuses_bad_values(capsys):
    code, out, err = run(["train", "llama-3.1-8b", "--on", "h100", "--loss", "chunked",
                          "--optimizer-in-backward", "--json"], capsys)
    assert code == 0, err
    assert "torchtune" in out
    code, out, err = run(["train", "llama-3.1-8b", "--loss", "chunky"], capsys)
    assert code == 2 and "error:" in err.lower() and "Traceback" not in err
    code, out, err = run(["infer", "llama-3.1-8b", "--on", "h100", "--expandable-segments",
                          "--json"], capsys)
    assert code == 0, err
    assert '"allocator_slack"' in out and '"verdict"' in out


def test_a_checkpointed_backward_peaks_at_its_end_with_every_gradient():
    # with checkpointing the saved activations are a layer's inputs, so the backward holds
    # most at its end: every gradient, and a tied weight's two addends (the head's gradient
    # and the embedding's dense one) while their sum is taken; no logits (the loop holds
    # only the loss)
    gpt2 = from_config(resolve_model("gpt2").config, "gpt2")
    plan = TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="sgd", checkpointing=True)
    e = est(plan, gpt2)
    b = e.breakdown
    embedding = gpt2.vocab_size * gpt2.hidden_size * 4
    assert e.peak_phase == "backward" and b["gradients"] == b["weights"]
    assert b["workspace"] == pytest.approx(2 * embedding) and b["logits"] == 0
    assert est(replace(plan, checkpointing=False), gpt2).breakdown["gradients"] == 0
