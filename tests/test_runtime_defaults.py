"""Each runtime's own defaults (issue 39, item 2): llama-server's context and layers (--fit),
vLLM's max_model_len and what it says where that does not fit, and "tight" kept for plans
really near the edge."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime, vllm_runtime
from gpuwise.cli.common import app
from gpuwise.estimate.memory.fits import max_context
from gpuwise.estimate.memory.llama_cpp_memory import llama_cpp_kv_cells
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan

LLAMA = runtime_unit("llama.cpp")
GIB = 2**30


def _model(name: str):  # type: ignore[no-untyped-def]
    model = resolve_model(name)
    return model, from_config(model.config)


def _plan(name: str, weights: str, runtime: str = "llama.cpp", **kw: object) -> InferencePlan:
    model, _ = _model(name)
    return build_plan(model, Deployment(runtime=runtime, weights=weights, **kw),  # type: ignore[arg-type]
                      Workload()).plan


def test_llama_server_keeps_the_trained_context_where_it_leaves_a_gib():
    _, arch = _model("llama-3.1-8b")
    hw = find_hardware("rtx-4090")
    plan = _plan("llama-3.1-8b", "q4_k_m")
    run = LLAMA.as_run(arch, plan, hw)
    assert run.context_alloc == arch.max_position == 131072 and run.gpu_layers is None
    est = estimate_inference(arch, plan, hw)
    assert est.capacity_bytes - est.total_bytes >= llama_cpp_runtime().fit_margin_bytes
    assert any("n_ctx 131,072: llama-server's default" in n for n in est.notes)


def test_llama_server_cuts_the_context_to_leave_a_gib_free():
    """A 16 GB card: the trained context's 16 GiB of KV does not fit beside the weights, so
    --fit cuts it (a multiple of 256, at least 4,096) to what leaves about 1 GiB free."""
    _, arch = _model("llama-3.1-8b")
    hw = find_hardware("t4")
    plan = _plan("llama-3.1-8b", "q4_k_m")
    run = LLAMA.as_run(arch, plan, hw)
    ctx = run.context_alloc
    assert ctx is not None and 4096 < ctx < 131072 and ctx % 256 == 0
    margin = llama_cpp_runtime().fit_margin_bytes
    free = hw.memory_bytes - estimate_inference(arch, plan, hw).total_bytes
    assert margin <= free < margin + 0.1 * GIB  # the interpolation lands within 256 cells
    longer = estimate_inference(arch, replace(run, context_alloc=ctx + 512), hw)
    assert hw.memory_bytes - longer.total_bytes < margin  # a longer context would not leave it
    given = replace(plan, context_alloc=8192)  # the user's --ctx is kept
    assert LLAMA.as_run(arch, given, hw) == given


def test_llama_server_moves_layers_to_the_host_where_4096_does_not_fit():
    _, arch = _model("llama-3.1-70b")
    hw = find_hardware("rtx-4090")
    plan = _plan("llama-3.1-70b", "q4_k_m")
    run = LLAMA.as_run(arch, plan, hw)
    assert run.context_alloc == llama_cpp_runtime().fit_min_ctx
    layers = run.gpu_layers
    assert layers is not None and 0 < layers < arch.num_layers
    target = hw.memory_bytes - llama_cpp_runtime().fit_margin_bytes
    assert estimate_inference(arch, run, hw).total_bytes <= target
    assert estimate_inference(arch, replace(run, gpu_layers=layers + 1), hw).total_bytes > target
    # the user's -ngl is kept: the context at its least, short of the target
    pinned = LLAMA.as_run(arch, replace(plan, gpu_layers=arch.num_layers), hw)
    assert pinned.gpu_layers == arch.num_layers and pinned.context_alloc == 4096


def test_llama_server_on_a_cpu_fits_the_context_to_the_hosts_memory():
    _, arch = _model("llama-3.1-8b")
    hw = find_hardware("cpu-cloud-32vcpu")
    small = replace(hw, memory_bytes=24 * GIB)
    plan = _plan("llama-3.1-8b", "q4_k_m")
    ctx = LLAMA.as_run(arch, plan, small).context_alloc
    assert ctx is not None and 4096 < ctx < 131072
    assert LLAMA.as_run(arch, plan, small).gpu_layers is None  # no layers to move on a CPU


def test_infer_check_and_serve_hold_the_same_fitted_context():
    model, arch = _model("llama-3.1-8b")
    hw = find_hardware("t4")
    plan = _plan("llama-3.1-8b", "q4_k_m")
    answer = infer(model, arch, hw, plan)
    ctx = answer.plan.context_alloc
    assert ctx == LLAMA.as_run(arch, plan, hw).context_alloc
    engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions())
    assert engine.kv_blocks * engine.block_tokens == llama_cpp_kv_cells(arch, answer.plan)
    out = CliRunner().invoke(app, ["check", "llama-3.1-8b", "--on", "t4", "--runtime",
                                   "llama.cpp", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["weights"]: r for r in json.loads(out.output)["precisions"]}
    assert list(rows) == ["fp16", "q8_0", "q6_k", "q5_k_m", "q4_k_m"]  # llama.cpp's GGUF types
    q4 = estimate_inference(arch, plan, hw)
    assert rows["q4_k_m"]["total_bytes"] == q4.total_bytes


def test_vllm_names_the_longest_context_its_pool_holds():
    """vLLM starts at the model's max_model_len and refuses where the pool cannot hold one
    sequence of it; its error names the longest that fits (as --max-model-len auto picks)."""
    _, arch = _model("llama-3.1-8b")
    hw = find_hardware("rtx-4090")
    plan = _plan("llama-3.1-8b", "bf16", runtime="vllm")
    est = estimate_inference(arch, plan, hw)
    assert not est.fits
    pool = runtime_unit("vllm").kv_positions(arch, plan, hw, 1, 256)
    longest = pool // vllm_runtime().block_size * vllm_runtime().block_size
    assert any(f"--ctx {longest} starts it" in n for n in est.notes)
    assert estimate_inference(arch, replace(plan, context_alloc=longest), hw).fits
    assert not estimate_inference(arch, replace(plan, context_alloc=longest + 16), hw).fits
    assert max_context(arch, plan, hw) == longest  # the answers' largest context: vLLM's


def test_vllm_filling_its_budget_is_not_tight():
    """vLLM takes its whole budget for the pool by design: the headroom is the pool beyond one
    max_model_len sequence, "tight" only where that is nearly nothing."""
    _, arch = _model("llama-3.1-8b")
    plan = _plan("llama-3.1-8b", "bf16", runtime="vllm")
    roomy = estimate_inference(arch, plan, find_hardware("h100"))
    assert roomy.verdict == "yes" and roomy.headroom_bytes > 30 * GIB
    hw = find_hardware("rtx-4090")
    longest = max_context(arch, plan, hw)
    edge = estimate_inference(arch, replace(plan, context_alloc=longest), hw)
    assert edge.verdict == "tight" and 0 <= edge.headroom_bytes < 0.05 * hw.memory_bytes


def test_vllm_picks_its_batch_defaults_by_device():
    """vLLM's OpenAI server: 8192 tokens and 1024 sequences a step on a device of 70 GiB or
    more that is not an A100, else 2048 and 256; its profile run and serve's limits use them."""
    unit = runtime_unit("vllm")
    picked = {d: unit.scheduler_on(find_hardware(d)) for d in ("h100", "h200", "a100-sxm-80gb", "l4")}
    assert {d: (s.max_batched_tokens, s.max_seqs) for d, s in picked.items()} == {
        "h100": (8192, 1024), "h200": (8192, 1024), "a100-sxm-80gb": (2048, 256), "l4": (2048, 256)}
    _, arch = _model("llama-3.1-8b")
    plan = _plan("llama-3.1-8b", "bf16", runtime="vllm")
    for device in ("h100", "l4"):
        hw = find_hardware(device)
        engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions())
        assert engine.limits.max_seqs == picked[device].max_seqs
        assert engine.limits.max_batched_tokens == picked[device].max_batched_tokens
    # the profile's activations: fewer batched tokens and sequences on the L4
    h100 = estimate_inference(arch, plan, find_hardware("h100")).breakdown["activations"]
    l4 = estimate_inference(arch, replace(plan, context_alloc=8192), find_hardware("l4"))
    assert l4.breakdown["activations"] < h100 / 2


def test_this_machine_on_a_cpu_is_what_llama_cpp_runs_and_check_says():
    """`gpuwise` with no command on a CPU lists llama.cpp at the GGUF types models ship in (not
    transformers at bitsandbytes formats a CPU cannot run), each row `check --runtime
    llama.cpp --on local` for that type: the same memory and the same longest context."""
    from gpuwise.app.check import check
    from gpuwise.app.local import this_machine
    from gpuwise.catalog.models import load_models

    answer = this_machine()
    if answer.hardware.kind != "cpu":
        pytest.skip("this machine has a GPU: its rows stay under transformers")
    assert answer.plan.runtime == "llama.cpp"
    assert {r.weights for r in answer.rows} == {"fp16", "q8_0", "q4_k_m"}
    entry = next(e for e in load_models() if e.id == "qwen2.5-0.5b")
    model = resolve_model(entry.id)
    arch = from_config(model.config)
    rows = {r.weights: r for r in answer.rows if r.model == entry.id}
    checked = {r.weights: r for r in check(model, arch, answer.hardware, answer.plan).rows}
    for weights, row in rows.items():
        assert row.total_bytes == checked[weights].total_bytes
        assert row.max_context == checked[weights].max_context
