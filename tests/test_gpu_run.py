"""What the H200 runs taught the model (docs/speed.md, "Checked against real runs on an
H200"; benchmarks/results/gpu_h200/), checked without a GPU: peft's fp32 adapters in a LoRA step's time and memory, the GPU's kernel-probe plan and
steadiness check, the eager runtime's default costs, and the GPU validation's comparison."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate import TrainingPlan
from gpuwise.estimate.memory.training import estimate_training, lora_cast_bytes
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.measure.probe import Profile
from gpuwise.measure.probe.kernel_plan import KernelPlan, for_gpu
from gpuwise.measure.probe.steadiness import probe_figures, square
from gpuwise.workload import from_config
from gpuwise.workload.lora_ops import lora_ops

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results"
LLAMA_8B = from_config(resolve_model("llama-3.1-8b").config, "llama-3.1-8b")
LORA = TrainingPlan(batch=4, seq=1024, dtype="bf16", optimizer="adamw", finetune="lora",
                    lora_rank=16)


def test_a_lora_branch_on_a_16_bit_base_casts_to_fp32_and_back() -> None:
    forward, backward = lora_ops({"q_proj": (4096, 4096)}, 16, 4096, 32, 2.0, 4.0)
    names = [op.name.split(".")[1] for op in forward]
    assert names == ["lora_cast_in", "lora_a", "lora_b", "lora_scale", "lora_add", "lora_cast_out"]
    cast_in = forward[0]
    assert cast_in.bytes == 4096 * 4096 * (2 + 4) and cast_in.count == 32
    a = forward[1]
    assert (a.m, a.k, a.n, a.dtype) == (4096, 4096, 16, "fp32")
    assert a.flops == 2 * 4096 * 4096 * 16
    assert sum(op.kind == "matmul" for op in backward) == 4  # two gradients per adapter
    same, _ = lora_ops({"q_proj": (4096, 4096)}, 16, 4096, 32, 4.0, 4.0)
    assert not any("cast" in op.name for op in same)  # an fp32 base: nothing to cast


def test_the_adapters_add_their_traffic_to_a_lora_step() -> None:
    rates = rates_from_spec(find_hardware("h200"))
    one = estimate_training_time(LLAMA_8B, replace(LORA, lora_targets=("q_proj",)), rates)
    every = estimate_training_time(LLAMA_8B, LORA, rates)
    # the casts alone of the six more matrices' inputs (in and back) and outputs
    rows, layers = 4096, 32
    inputs = (4096 * 4 + 4096 + 14336) * rows * 6 * 2
    outputs = (1024 * 2 + 4096 + 14336 * 2 + 4096) * rows * 6 * 2
    floor = layers * (inputs + outputs) / rates.memory_bytes_per_s
    assert every.step_s - one.step_s > floor


def test_fp32_adapter_inputs_are_saved_for_the_backward() -> None:
    per_layer = (4096 * 6 + 14336) * 4 - (4096 * 3 + 14336) * 2
    assert lora_cast_bytes(LLAMA_8B, LORA) == per_layer * 4 * 1024 * 32
    assert lora_cast_bytes(LLAMA_8B, replace(LORA, checkpointing=True)) == per_layer * 4096
    assert lora_cast_bytes(LLAMA_8B, replace(LORA, dtype="fp32")) == 0.0
    assert lora_cast_bytes(LLAMA_8B, replace(LORA, finetune="full")) == 0.0
    h200 = find_hardware("h200")
    with_casts = estimate_training(LLAMA_8B, LORA, h200).total_bytes
    # measured 61.2 GiB (benchmarks/results/gpu_h200/gpu_measured.json); 45.9 without the casts
    assert 55 * 2**30 < with_casts < 64 * 2**30


def test_a_gpu_kernel_probe_fills_the_gpu() -> None:
    plan = for_gpu(KernelPlan())
    assert plan.sdpa_heads == 256 and plan.elementwise_elements == 2**25
    assert plan.rows[-2:] == (4096, 16384) and plan.backward_rows[-1] == 16384
    assert KernelPlan().sdpa_heads == 16  # a CPU's plan is left alone


def test_a_gpu_steadiness_check_repeats_a_matmul_long_enough_to_time() -> None:
    profile = Profile.from_json((RUNS / "gpu_h200" / "probe.json").read_text())
    assert square(profile) == 8192
    figures = probe_figures(profile)
    assert 600e3 < figures["matmul_bf16"] < 800e3  # GFLOP/s of the 8192^3 product
    assert square(replace(profile, backend="torch-cpu")) == 1024


def test_spec_rates_of_a_gpu_carry_the_eager_runtime_costs() -> None:
    rates = rates_from_spec(find_hardware("h200"))
    assert rates.runtime_op_s["decode"] == pytest.approx(22e-6)
    from gpuwise.estimate import InferencePlan

    plan = InferencePlan(batch=1, prompt_tokens=512, new_tokens=32, weights="bf16")
    qwen = from_config(resolve_model("qwen2.5-0.5b").config, "qwen2.5-0.5b")
    eager = estimate_inference_time(qwen, plan, rates)
    compiled = estimate_inference_time(qwen, plan, rates, runtime="compiled")
    assert eager.decode.bound == "overhead"
    # measured 27.2 ms a token on an H200 (benchmarks/results/gpu_h200/gpu_measured.json); CUDA graphs remove the host's cost
    assert 20e-3 < eager.decode_s_per_token < 35e-3
    assert compiled.decode_s_per_token < eager.decode_s_per_token / 5


def test_the_gpu_validation_compares_both_rate_sources(tmp_path: Path) -> None:
    """The datasheet's estimates are `infer|train --on h200 --json`'s, as saved in compare.json;
    the probed ones are those `measure` took on the GPU (`--on local`), where the record has
    them (the H200 record predates them: a case given some is compared on both)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from validate_gpu import compare

    measured = json.loads((RUNS / "gpu_h200" / "gpu_measured.json").read_text())
    record = compare(RUNS / "gpu_h200" / "gpu_measured.json", "h200", None)
    assert record["summary"]["spec"]["count"] == 19 and "probed" not in record["summary"]
    assert record["summary"]["memory"]["count"] == 7
    saved = json.loads((RUNS / "gpu_h200" / "compare.json").read_text())
    for key in ("spec", "memory"):
        assert saved["summary"][key] == json.loads(json.dumps(record["summary"][key]))
    first = measured["cases"][0]
    first["probed"] = {"prefill_s": 0.02, "decode_s_per_token": 0.03, "step_s": None}
    path = tmp_path / "gpu_measured.json"
    path.write_text(json.dumps({**measured, "cases": [first]}))
    row = compare(path, "h200", None)["time"][0]
    assert row["probed_error"] == pytest.approx(row["probed"] / row["measured"] - 1)


def test_a_plan_past_the_model_positions_is_named() -> None:
    from gpuwise.estimate import InferencePlan
    from gpuwise.estimate.runtimes import estimate_inference

    gpt2 = from_config(resolve_model("gpt2").config, "gpt2")
    h200 = find_hardware("h200")
    past = estimate_inference(gpt2, InferencePlan(prompt_tokens=1024, new_tokens=16), h200)
    assert any("1,024 positions" in note for note in past.notes)
    within = estimate_inference(gpt2, InferencePlan(prompt_tokens=512, new_tokens=16), h200)
    assert not any("positions" in note for note in within.notes)
