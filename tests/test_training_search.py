"""Training that finds what fits (issue 39, item 4): where a plan does not fit, the memory
features gpuwise models are tried together and the fastest few that fit are given as flags,
each of which `gpuwise train` then says fits, with the memory and step the search gave."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from typer.testing import CliRunner

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.cli.common import app
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.estimate.training_search import _variants, search_fits
from gpuwise.workload import from_config
from gpuwise.workload.plans import TrainingPlan


def _search(name: str, device: str, plan: TrainingPlan):  # type: ignore[no-untyped-def]
    arch = from_config(resolve_model(name).config)
    hw = find_hardware(device)
    rates = rates_from_spec(hw)
    return arch, hw, search_fits(arch, plan, hw,
                                 lambda p, est: estimate_training_time(
                                     arch, p, rates, paged_on_host_bytes=est.paged_on_host_bytes).step_s)


def _train(name: str, device: str, args: list[str]) -> dict:  # type: ignore[type-arg]
    out = CliRunner().invoke(app, ["train", name, "--on", device, "--json", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)  # type: ignore[no-any-return]


def test_each_option_is_a_command_that_fits():
    """Llama-3.1-8B at batch 8 on an H100: a full fine-tune fits with features turned on; each
    option's flags, given to `gpuwise train`, fit with the memory and step the search gave."""
    plan = TrainingPlan(batch=8)
    arch, hw, found = _search("llama-3.1-8b", "h100", plan)
    assert not estimate_training(arch, plan, hw).fits and found.options
    steps = [o.step_s for o in found.options]
    assert steps == sorted(steps)
    for option in found.options:
        assert option.trains == "the model" and option.total_bytes <= option.capacity_bytes
        args = ["--batch", "8", *shlex.split(" ".join(option.flags))]
        rec = _train("llama-3.1-8b", "h100", args)
        assert rec["memory"]["fits"] and rec["memory"]["total_bytes"] == option.total_bytes
        assert rec["time"]["step_s"] == option.step_s
    # none of the combinations left out fits and is faster than the fastest shown
    fastest = found.options[0].step_s
    rates = rates_from_spec(hw)
    for variant, _ in _variants(plan):
        if estimate_training(arch, variant, hw).fits:
            assert estimate_training_time(arch, variant, rates).step_s >= fastest * 0.99


def test_a_full_fine_tune_that_fits_in_no_way_gives_lora_and_says_so():
    """Llama-3.1-8B at batch 2 on a 24 GB card: no combination fits a full fine-tune (its
    weights, gradients and 8-bit states alone pass 24 GB), so the answer trains adapters, and
    the CLI says it."""
    arch, hw, found = _search("llama-3.1-8b", "rtx-4090", TrainingPlan(batch=2))
    assert found.options and all(o.trains != "the model" for o in found.options)
    assert found.options[0].flags[0].startswith("--finetune")
    out = CliRunner().invoke(app, ["train", "llama-3.1-8b", "--on", "rtx-4090", "--batch", "2"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "fits with: --finetune" in out.output
    assert "trains adapters" in out.output


def test_a_batch_too_large_for_any_feature_gives_the_batch_that_fits():
    arch, hw, found = _search("qwen2.5-0.5b", "rtx-4090", TrainingPlan(batch=64))
    assert not found.options and found.checkpointed_batch
    smaller = replace(TrainingPlan(batch=found.checkpointed_batch), checkpointing=True)
    assert estimate_training(arch, smaller, hw).fits
    assert not estimate_training(arch, replace(smaller, batch=smaller.batch + 1), hw).fits


def test_a_frozen_base_computes_no_weight_gradients_and_qlora_dequantises():
    """MFU counts 4 N T for LoRA and QLoRA (forward and input gradients: the frozen base has no
    weight gradients), 6 N T for a full fine-tune; QLoRA's step is LoRA's plus every nf4 weight
    dequantised to bf16 in the forward, the backward and the recompute."""
    from gpuwise.estimate.memory.weights import mean_weight_bytes
    from gpuwise.estimate.speed.training_time import matmul_params

    arch = from_config(resolve_model("llama-3.1-8b").config)
    rates = rates_from_spec(find_hardware("h100"))
    step = {f: estimate_training_time(arch, TrainingPlan(finetune=f, checkpointing=True), rates)
            for f in ("full", "lora", "qlora")}
    n, tokens = matmul_params(arch), 2048
    attention = step["full"].model_flops - 6 * n * tokens
    assert step["lora"].model_flops == 4 * n * tokens + attention
    assert step["qlora"].model_flops == step["lora"].model_flops
    weights = n - arch.vocab_size * arch.hidden_size  # the head stays bf16
    moved = 3 * weights * (mean_weight_bytes(arch, "nf4") + 2)
    extra = step["qlora"].step_s - step["lora"].step_s
    assert moved / rates.bandwidth_bytes_per_s <= extra <= 2 * moved / rates.bandwidth_bytes_per_s
