"""Host memory in a training step (issue 39, item 4): paged optimizer states counted where they
live (the device's room beside the rest, then host memory) with the time the driver takes to
move them in and out each step; offloading's copies and host optimizer step charged, so the
fit search can weigh offload against the other features; what the host cannot hold refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.stacks import stack_value
from gpuwise.cli.common import app
from gpuwise.estimate.memory.training import estimate_training, param_bytes
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.units import GIB
from gpuwise.workload import count_params, from_config
from gpuwise.workload.plans import TrainingPlan

LLAMA8 = from_config(resolve_model("llama-3.1-8b").config)


def _rate(key: str, hw_name: str) -> float:
    return find_hardware(hw_name).host_link_gbs * 1e9 * float(stack_value("host_transfer", key))


@pytest.mark.parametrize("batch", [1, 4])
def test_paged_states_fill_the_room_left_and_page_the_rest(batch: int):
    """On an H100 the 8-bit states of Llama-3.1-8B (15 GiB) sit beside a checkpointed step at
    batch 1; at batch 4 without checkpointing the step leaves no room, and every byte in host
    memory is moved in and out once a step at the driver's migration rate."""
    hw = find_hardware("h100")
    plan = TrainingPlan(batch=batch, optimizer="paged_adamw8bit", checkpointing=batch == 1)
    paged = estimate_training(LLAMA8, plan, hw)
    eight = estimate_training(LLAMA8, replace(plan, optimizer="adamw8bit"), hw)
    assert paged.paged_bytes == eight.breakdown["optimizer"]
    room = max(0, paged.capacity_bytes - paged.total_bytes)
    assert paged.paged_on_device_bytes == min(paged.paged_bytes, room)
    rates = rates_from_spec(hw)
    with_paging = estimate_training_time(LLAMA8, plan, rates,
                                         paged_on_host_bytes=paged.paged_on_host_bytes)
    without = estimate_training_time(LLAMA8, replace(plan, optimizer="adamw8bit"), rates)
    expected = 2 * paged.paged_on_host_bytes / _rate("managed_migration_efficiency", "h100")
    assert with_paging.host.paging_s == pytest.approx(expected)
    assert with_paging.step_s - without.step_s == pytest.approx(expected, abs=1e-9)
    if batch == 1:
        assert paged.paged_on_host_bytes == 0 and with_paging.host.paging_s == 0
    else:
        assert paged.paged_on_host_bytes > 10 * GIB and with_paging.host.paging_s > 0.5


def test_zero_offload_steps_on_the_host_and_copies_beyond_the_backward():
    """--offload optimizer: no optimizer phase on the device; CPUAdam's one fused pass over
    the fp32 states at the host's rate (the weights' way back hidden under it), and the
    gradients' copy beyond the backward's compute."""
    hw = find_hardware("h100")
    rates = rates_from_spec(hw)
    plan = TrainingPlan(batch=1, offload=("optimizer",))
    t = estimate_training_time(LLAMA8, plan, rates)
    assert t.optimizer.seconds == 0
    n = count_params(LLAMA8).total
    step_bytes = 7 * n * 4  # optimizers.toml adamw passes_fused x fp32 states
    host_rate = rates.host_memory_bytes_per_s
    assert host_rate == float(stack_value("host_transfer", "host_memory_gbs_datacentre")) * 1e9
    assert t.host.host_step_s == pytest.approx(step_bytes / host_rate)
    grads = param_bytes(LLAMA8, plan).gradients
    exposed = grads / _rate("pinned_copy_efficiency", "h100") - t.backward.seconds
    assert t.host.copies_s == pytest.approx(max(0.0, exposed))
    on_device = estimate_training_time(LLAMA8, replace(plan, offload=()), rates)
    assert t.step_s > on_device.step_s  # an 8B model's Adam step is faster on the H100


def test_activation_offload_is_free_only_where_compute_hides_it():
    """torchtune's activation offload copies on a side stream: a long step hides the copy
    (checkpointed inputs only), a short one with every activation saved does not."""
    rates = rates_from_spec(find_hardware("h100"))
    hidden = TrainingPlan(batch=4, checkpointing=True)
    shown = TrainingPlan(batch=4)
    for plan, free in ((hidden, True), (shown, False)):
        off = estimate_training_time(LLAMA8, replace(plan, offload=("activations",)), rates)
        base = estimate_training_time(LLAMA8, plan, rates)
        assert (off.host.copies_s == 0) is free
        assert off.step_s == pytest.approx(base.step_s + off.host.copies_s)


def test_the_host_must_hold_what_is_offloaded():
    """A home machine has 64 GiB (stacks.toml): Llama-3.1-8B's fp32 parameters, gradients
    and states (about 120 GiB) offloaded to it do not fit, though the GPU holds the rest;
    a GPU server's 250 GiB a GPU do."""
    plan = TrainingPlan(batch=1, checkpointing=True, offload=("params",))
    home = estimate_training(LLAMA8, plan, find_hardware("rtx-4090"))
    server = estimate_training(LLAMA8, plan, find_hardware("l4"))
    assert home.total_bytes < home.capacity_bytes and not home.fits and not home.host_fits
    assert home.host_capacity_bytes == 64 * GIB
    assert server.fits and server.host_needed_bytes > home.host_capacity_bytes
    out = CliRunner().invoke(app, ["train", "llama-3.1-8b", "--on", "rtx-4090", "--json",
                                   "--checkpointing", "--offload", "params"])
    rec = json.loads(out.output)["memory"]
    assert rec["fits"] is False and rec["host_bytes"] > rec["host_capacity_bytes"]


def test_the_search_weighs_offload_and_paging_by_their_time():
    """Llama-3.1-8B at batch 1 on an L4 fits only with its parameters in host memory: the
    answer offloads, and its step carries the host step and the copies."""
    out = CliRunner().invoke(app, ["train", "llama-3.1-8b", "--on", "l4", "--batch", "1",
                                   "--json"])
    found = json.loads(out.output)["fit_search"]["options"]
    assert found and all("--offload params" in " ".join(o["flags"])
                         or "--offload params,activations" in " ".join(o["flags"])
                         for o in found)
    flags = found[0]["flags"]
    plan = TrainingPlan(batch=1, checkpointing="--checkpointing" in flags,
                        loss="chunked" if "--loss chunked" in flags else "full",
                        offload=tuple(next(f for f in flags if f.startswith("--offload"))
                                      .split()[1].split(",")))
    t = estimate_training_time(LLAMA8, plan, rates_from_spec(find_hardware("l4")))
    assert found[0]["step_s"] == pytest.approx(t.step_s)
    assert t.host.host_step_s > 0 and t.optimizer.seconds == 0
