"""What hardware can run (issue 39, item 1): the catalogue's side (each device's architecture,
compute capability, matrix-unit dtypes), what kernels, attention and dtypes need
(capabilities.toml, with sources), and the one check every command goes through
(estimate/capability.py), as an expert would answer each case."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from cli_run import run_cli as run

from gpuwise.app.cost import candidate
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.hardware import load_hardware
from gpuwise.catalog.runtime_speed import kernel_names, runtime_speed
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import Device, kernel_here, plan_here, plan_refusal, weights_here
from gpuwise.estimate.cost.serving_sim import size_serving_simulated
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan

CAPABILITIES = Path(__file__).parents[1] / "gpuwise/catalog/data/capabilities.toml"


def plan(weights="bf16", runtime="transformers", attention="sdpa") -> InferencePlan:
    return InferencePlan(weights=weights, runtime=runtime, attention=attention)


def test_every_device_says_its_architecture_and_every_nvidia_gpu_its_compute_capability():
    for hw in load_hardware():
        assert hw.arch, hw.id
        assert (hw.compute_capability > 0) == (hw.vendor == "nvidia" and hw.kind == "gpu"), hw.id


@pytest.mark.parametrize("hw", [h for h in load_hardware() if h.vendor == "nvidia"],
                         ids=lambda h: h.id)
def test_nvidia_matrix_units_follow_the_compute_capability(hw):
    """The catalogue's peaks agree with NVIDIA's rule (Transformer Engine's support matrix):
    bf16 from compute capability 8.0, fp8 from 8.9."""
    assert ("bf16" in hw.peak_tflops) == (hw.compute_capability >= 8.0)
    assert ("fp8" in hw.peak_tflops) == (hw.compute_capability >= 8.9)


def test_every_requirement_has_a_source_and_names_what_exists():
    data = tomllib.loads(CAPABILITIES.read_text())
    kernels = set(kernel_names())
    for kind, table in data.items():
        for name, rec in table.items():
            assert rec.get("sources", {}).get("*"), f"{kind}.{name}"
            if kind == "kernel":
                assert name in kernels, name
                assert not rec.get("instead") or rec["instead"] in kernels, name


def test_bf16_on_a_turing_or_volta_gpu_is_fp16():
    for device in ("t4", "v100-sxm2-16gb"):
        hw = find_hardware(device)
        assert weights_here("bf16", Device.of(hw)) == "fp16"
        with pytest.raises(GpuwiseError, match="has no bf16|no bf16") as refused:
            plan_here(plan(), hw)
        assert refused.value.hint == "--weights fp16 runs there"
        assert plan_here(plan(), hw, weights_asked=False).weights == "fp16"
    assert weights_here("bf16", Device.of(find_hardware("a10g"))) == "bf16"
    assert weights_here("fp16", Device.of(find_hardware("tpu-v5e"))) == "bf16"
    assert weights_here("bf16", Device.of(find_hardware("cpu-2s-xeon-8480"))) == "bf16"


def test_vllm_runs_fp8_weight_only_through_marlin_below_compute_capability_8_9():
    fp8 = plan("fp8", "vllm")
    assert kernel_here(fp8, find_hardware("a10g")).quant_kernel == "marlin-fp8"
    assert kernel_here(fp8, find_hardware("t4")).quant_kernel == "marlin-fp8"
    assert kernel_here(fp8, find_hardware("h100")).quant_kernel == ""  # W8A8, its own
    assert kernel_here(fp8, find_hardware("l4")).quant_kernel == ""
    refused = plan_refusal(fp8, find_hardware("v100-sxm2-32gb"))
    assert refused is not None and "7.5 or later" in refused.why


def test_int4_on_volta_runs_the_gptq_kernel_and_int8_w8a8_not_at_all():
    v100 = find_hardware("v100-sxm2-32gb")
    assert kernel_here(plan("int4", "vllm"), v100).quant_kernel == "exllama"
    assert kernel_here(plan("int4", "vllm"), find_hardware("t4")).quant_kernel == ""  # Marlin
    assert plan_refusal(plan("int8", "vllm"), v100) is not None
    assert plan_refusal(plan("int8", "vllm"), find_hardware("t4")) is None


def test_kernels_that_need_hopper_or_cuda_are_refused_elsewhere():
    assert plan_refusal(plan("fp8"), find_hardware("l4")) is not None  # FBGEMM: 9.0
    assert plan_refusal(plan("fp8"), find_hardware("h100")) is None
    assert plan_refusal(plan("nf4", "vllm"), find_hardware("mi300x")) is not None
    assert plan_refusal(plan("nf4", "vllm"), find_hardware("a10g")) is None


def test_flash_attention_needs_ampere_and_sdpa_runs_in_its_place():
    for device in ("t4", "v100-sxm2-16gb", "mi300x", "cpu-2s-xeon-8480"):
        refused = plan_refusal(plan("fp16", attention="flash"), find_hardware(device))
        assert refused is not None and refused.instead == "--attention sdpa", device
    assert plan_refusal(plan("fp16", attention="flash"), find_hardware("a100-sxm-80gb")) is None


def test_the_commands_refuse_in_one_line_and_name_what_runs(capsys):
    code, out, err = run(["infer", "llama-3.1-8b", "--on", "t4", "--weights", "bf16"], capsys)
    assert code == 2
    assert "error: bf16 does not run on the NVIDIA Tesla T4" in err + out
    assert "--weights fp16 runs there" in err + out
    code, out, _ = run(["infer", "llama-3.1-8b", "--on", "t4", "--json"], capsys)
    assert code == 0 and json.loads(out)["plan"]["weights"] == "fp16"
    code, out, _ = run(["serve", "llama-3.1-8b", "--on", "a10g", "--weights", "fp8", "--runtime",
                        "vllm", "--rate", "1", "--requests", "20", "--json"], capsys)
    assert code == 0, out


@pytest.mark.parametrize("device", ["t4", "v100-sxm2-32gb", "a10g", "h100-sxm", "mi300x"])
def test_advise_sizes_only_what_each_device_runs(device):
    """advise's sizing of an option: bf16 becomes the dtype the device computes in, fp8 runs
    with the kernel the runtime runs there, and what runs nowhere there is a reason, not an
    option."""
    arch = from_config(resolve_model("qwen2.5-0.5b").config)
    load = ServeLoad(requests_per_day=20_000, prompt_tokens=256, output_tokens=64)
    cand = candidate(find_hardware(device))
    for weights in ("bf16", "fp8"):
        sized = size_serving_simulated(arch, load, cand, weights)
        if isinstance(sized, str):
            assert "does not run" in sized and (device, weights) in {
                ("v100-sxm2-32gb", "fp8")}, sized
            continue
        precision = sized.precision.split()[0]
        assert plan_refusal(plan(precision, "vllm"), cand.hw) is None, sized.precision
        if cand.hw.compute_capability and cand.hw.compute_capability < 8.0:
            assert not precision.startswith("bf16")


def test_the_runtimes_kernels_are_all_described():
    for rt in ("transformers", "compiled", "vllm", "sglang"):
        for kernel in runtime_speed(rt).kernels.values():
            assert kernel in kernel_names()


def test_training_runs_in_what_the_device_computes_and_qlora_needs_an_nvidia_gpu(capsys):
    code, out, _ = run(["train", "llama-3.2-1b", "--on", "t4", "--json"], capsys)
    assert code == 0 and json.loads(out)["plan"]["dtype"] == "mixed-fp16"
    code, out, err = run(["train", "llama-3.2-1b", "--on", "t4", "--dtype", "mixed-bf16"], capsys)
    assert code == 2 and "--dtype mixed-fp16 runs there" in out + err
    code, out, err = run(["train", "llama-3.2-1b", "--on", "tpu-v5e", "--finetune", "qlora"],
                         capsys)
    assert code == 2 and "QLoRA (a bitsandbytes 4-bit base) does not run" in out + err
    code, out, _ = run(["train", "llama-3.2-1b", "--on", "a10g", "--finetune", "qlora", "--json"],
                       capsys)
    assert code == 0
