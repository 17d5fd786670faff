"""One plan, built once (issue 38 item 1): check, infer and serve take the same option group
and build their plan with the same builder, so that for the same deployment they give the
same numbers."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import click
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwise.app.check import check
from gpuwise.app.cost import candidate
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer, offload_host
from gpuwise.app.serve import Load, Slo, serve
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.cli.common import app
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import Device, weights_here
from gpuwise.estimate.cost.serving_sim import runtime_for, size_serving_simulated
from gpuwise.estimate.memory.check_rows import CHECK_PRECISIONS
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.serve.replica import (
    ReplicaOptions,
    build_engine,
    no_load_latency,
    no_load_step,
)
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.requests import Lengths

ROOT = Path(__file__).resolve().parents[1]
# The deployment's options every command that takes a model and a deployment accepts
GROUP = {"--runtime", "--kv-dtype", "--ctx", "--attention", "--gpu-memory-utilization",
         "--threads", "--quant-kernel", "--gpu-layers", "--tp", "--gpus"}


def test_no_command_assembles_a_plan_itself():
    """Every InferencePlan a command answers for comes from app.deployment.build_plan."""
    for path in (ROOT / "gpuwise" / "cli").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", "") == "InferencePlan"]
        assert not calls, f"{path.name} builds an InferencePlan field by field"


@pytest.mark.parametrize("command", ["check", "infer", "serve"])
def test_each_command_takes_the_whole_option_group(command: str):
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    cmd = group.commands[command]
    names = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
    assert names >= GROUP, f"{command} lacks {sorted(GROUP - names)}"


MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b")
DEVICES = ("rtx-4090", "h100-sxm", "a10g", "cpu-cloud-32vcpu", "m2-ultra")
deployments = st.builds(
    Deployment,
    runtime=st.sampled_from(("transformers", "compiled", "vllm", "sglang", "llama.cpp")),
    kv_dtype=st.sampled_from((None, "fp8", "fp16")),
    ctx=st.sampled_from((None, 4096, 32768)),
    attention=st.sampled_from(("sdpa", "eager", "flash")),
    threads=st.sampled_from((None, 4, 16)),
    gpu_layers=st.sampled_from((None, 10)),
)
workloads = st.builds(Workload, batch=st.sampled_from((1, 4)),
                      prompt_tokens=st.sampled_from((128, 2048)),
                      new_tokens=st.sampled_from((16, 256)))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments, workloads, st.sampled_from(MODELS), st.sampled_from(DEVICES),
       st.sampled_from((*CHECK_PRECISIONS, "q8_0", "q4_k_m")))
def test_checks_row_for_a_precision_is_infer_for_that_plan(d, w, name, device, weights):
    model = resolve_model(name)
    arch = from_config(model.config)
    hw = find_hardware(device)
    try:
        plan = build_plan(model, d, w, hw).plan
    except GpuwiseError:
        return  # a deployment the plan refuses is refused by every command alike
    try:
        rows = check(model, arch, hw, plan).rows
    except GpuwiseError as refused:  # a runtime that cannot run on the device: both refuse
        with pytest.raises(GpuwiseError, match=str(refused).split(":")[0]):
            infer(model, arch, hw, replace(plan, weights=weights))
        return
    here = weights_here(weights, Device.of(hw))  # bf16 is fp16 on a T4: check's row says so
    row = next((r for r in rows if r.weights == here), None)
    offered = runtime_unit(plan.runtime).precisions or CHECK_PRECISIONS
    if row is None and here not in offered:
        return  # not among what check lists for this runtime (llama.cpp: its GGUF types)
    if row is None:  # not offered on this device: infer refuses it as the CLI builds it
        with pytest.raises(GpuwiseError, match="does not run on"):
            build_plan(model, replace(d, weights=weights), w, hw)
        return
    assert row.decode is not None
    try:
        answer = infer(model, arch, hw, build_plan(model, replace(d, weights=here), w, hw).plan)
    except GpuwiseError:
        assert row.decode.unavailable or not row.fits
        return
    assert row.total_bytes == answer.memory.total_bytes
    assert row.fits == answer.memory.fits
    if answer.time is None:
        assert row.decode.unavailable
    else:
        assert row.decode.s_per_token == answer.time.decode_s_per_token


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments, workloads, st.sampled_from(MODELS), st.sampled_from(DEVICES),
       st.sampled_from(CHECK_PRECISIONS))
def test_serves_no_load_step_is_infers_decode_to_the_bit(d, w, name, device, weights):
    """One step model: serve's decode step of one request alone is infer's decode for the
    same plan, exactly; its time per token adds only the server's host time a token."""
    model = resolve_model(name)
    arch = from_config(model.config)
    hw = find_hardware(device)
    try:
        plan = replace(build_plan(model, d, replace(w, batch=1)).plan, weights=weights)
        answer = infer(model, arch, hw, plan)
        rates, _ = rates_for(hw)
        assert rates is not None
        run = runtime_unit(plan.runtime).as_run(arch, plan, hw)  # llama-server's context, layers
        engine = build_engine(arch, plan, hw, rates, ReplicaOptions(), offload_host(run, hw))
    except GpuwiseError:
        return  # refused: by infer and serve alike (test_checks_row_... covers the refusals)
    assert answer.time is not None
    step = no_load_step(engine, plan.prompt_tokens, plan.new_tokens)
    assert step == answer.time.decode_s_per_token
    _, tpot = no_load_latency(engine, plan.prompt_tokens, plan.new_tokens)
    if plan.new_tokens > 1:
        assert tpot == step + engine.token_host_s


ADVISE_DEVICES = ("h100-sxm", "l4", "rtx-4090", "cpu-cloud-32vcpu")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("qwen2.5-0.5b", "llama-3.1-8b")), st.sampled_from(ADVISE_DEVICES),
       st.sampled_from(("bf16", "int4", "int8")), st.sampled_from((0.2, 2.0)),
       st.sampled_from((None, 80.0)), st.sampled_from((None, 3000.0)),
       st.sampled_from((None, "fp8")))
def test_advises_option_is_what_serve_says_for_that_deployment(name, device, weights, rate, tpot,
                                                               ttft, kv):
    """An advise option's TTFT and time per token (p90) and tokens a second are serve's for the
    same plan, devices and load: one engine, one plan builder."""
    model = resolve_model(name)
    arch = from_config(model.config)
    hw = find_hardware(device)
    load = ServeLoad(rate * 86400, 256, 64, tpot, ttft)
    template = build_plan(model, Deployment(weights=weights, kv_dtype=kv), Workload(1, 256, 64)).plan
    sizing = size_serving_simulated(arch, load, candidate(hw), weights, "auto", template)
    if isinstance(sizing, str):
        return  # refused, with the reason (not_considered)
    tp, replicas = sizing.devices_per_replica, sizing.replicas
    plan = replace(template, runtime=runtime_for(hw.kind, "auto"), tp=tp)
    slo = Slo(None if ttft is None else ttft / 1e3, None if tpot is None else tpot / 1e3)
    count, warm = sizing.run_requests  # the steady-state run it sized with, as serve takes it
    args = (model, arch, hw, plan, ReplicaOptions(tp=tp),
            Load(Lengths(256, 64), rate=load.arrivals_per_s, requests=count, warmup=warm))
    if {"TTFT", "ms/tok"} & set(sizing.misses):  # one request alone misses it: serve says so
        with pytest.raises(GpuwiseError, match="can never be met"):
            serve(*args, slo, tp * replicas)
        slo = Slo()
    answer = serve(*args, slo, tp * replicas)
    assert answer.result.tpot_s.p90 == sizing.tpot_s
    assert answer.result.ttft_s.p90 == sizing.ttft_s
    assert answer.result.output_tokens_per_s == pytest.approx(sizing.tokens_per_s * replicas, rel=1e-12)
