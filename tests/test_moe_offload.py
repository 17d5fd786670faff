"""Expert parallelism and llama.cpp's expert offload (issue 40 item 2; docs/speed.md, "Mixture of
experts"): under --expert-parallel each of the --tp devices holds E/tp whole experts, reads the
touched ones of them, and a sparse layer's all-reduce becomes a dispatch and a combine
all-to-all; under --cpu-moe / --n-cpu-moe N the routed experts of those layers move to host
memory and the CPU runs them. The expected figures are derived here from the shapes, the
catalogue's link and a simulation of routing, not read back from the code under test."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_cli import run

from gpuwise.app.config_files import read_config
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer, offload_host
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.runtimes import estimate_inference, step_model
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.step import tp_allreduce_s
from gpuwise.workload import count_params, from_config
from gpuwise.workload.expert_parallel import busiest_device_experts
from gpuwise.workload.plans import InferencePlan

Q4_K_BYTES = 144 / 256  # a Q4_K block: 256 weights in 144 bytes (ggml-common.h block_q4_K)


def _arch(name: str):
    return from_config(resolve_model(name).config)


def _plan(name: str, device: str, runtime: str, weights: str, batch: int = 1,
          **options) -> InferencePlan:
    d = Deployment(runtime=runtime, weights=weights, **options)
    return build_plan(resolve_model(name), d, Workload(batch, 512, 128), find_hardware(device)).plan


# --- expert parallelism ---------------------------------------------------------------------


def test_the_all_to_all_grows_with_tokens_and_vanishes_at_tp_1():
    arch = _arch("deepseek-v3")
    assert arch.moe is not None
    rates = rates_from_spec(find_hardware("h200"))
    link, latency = rates.interconnect_bytes_per_s, rates.collective_latency_s
    layers, sparse = arch.num_layers, arch.moe.layers

    def expected(tokens: int) -> float:  # 2 all-reduces a layer, 2 all-to-alls for a sparse one's
        state = tokens * arch.hidden_size * 2.0 * 7 / 8  # bf16 hidden states, 7/8 leave a device
        return ((2 * layers - sparse) * (latency + 2 * state / link)
                + 2 * sparse * (latency + state / link))

    small, large = (tp_allreduce_s(arch, t, 2.0, rates, 8, True) for t in (1, 4096))
    assert small == pytest.approx(expected(1)) and large == pytest.approx(expected(4096))
    assert large > 5 * small
    assert tp_allreduce_s(arch, 4096, 2.0, rates, 1, True) == 0.0
    # the step's collectives carry it: one more latency a sparse layer than tensor parallelism
    ep = step_model(arch, replace_ep(InferencePlan(runtime="vllm", weights="fp8", tp=8)), rates, 8)
    tp = step_model(arch, InferencePlan(runtime="vllm", weights="fp8", tp=8), rates, 8)
    ep_comm = ep.phase("decode", 256, 0, 256 * 1000.0).comm_s
    tp_comm = tp.phase("decode", 256, 0, 256 * 1000.0).comm_s
    assert ep_comm - tp_comm == pytest.approx(sparse * latency)


def replace_ep(plan: InferencePlan) -> InferencePlan:
    from dataclasses import replace
    return replace(plan, expert_parallel=True)


def test_the_busiest_device_matches_a_simulation_of_uniform_routing():
    rng = random.Random(7)
    for name, devices, tokens in (("mixtral-8x7b", 2, 1), ("qwen3-30b-a3b", 8, 1),
                                  ("qwen3-30b-a3b", 8, 8), ("deepseek-v3", 8, 4)):
        moe = _arch(name).moe
        assert moe is not None
        per = moe.num_experts // devices
        trials, total = 4000, 0
        for _ in range(trials):
            hit = set()
            for _ in range(tokens):
                hit.update(rng.sample(range(moe.num_experts), moe.experts_per_token))
            total += max(sum(1 for e in hit if e // per == d) for d in range(devices))
        simulated = total / trials
        assert busiest_device_experts(moe, tokens, devices) == pytest.approx(simulated, rel=0.06)
    mixtral = _arch("mixtral-8x7b").moe
    assert mixtral is not None  # exact: both of a token's 2 experts on one device w.p. 12/28
    assert busiest_device_experts(mixtral, 1, 2) == pytest.approx(1 + 12 / 28, rel=0.03)


def test_at_tp_8_a_device_holds_and_at_most_reads_an_eighth_of_the_experts():
    arch = _arch("qwen3-30b-a3b")
    moe = arch.moe
    assert moe is not None and moe.num_experts == 128
    hw = find_hardware("h100")
    plan = _plan("qwen3-30b-a3b", "h100", "vllm", "bf16", tp=8, expert_parallel=True)
    est = estimate_inference(arch, plan, hw)
    counts = count_params(arch)
    expected = 2.0 * ((counts.total - counts.expert) / 8 + counts.expert * 16 / 128)
    assert est.breakdown["weights"] == pytest.approx(expected, rel=1e-9)
    assert any("16 of 128 routed experts a device" in n for n in est.notes)
    # a decode step of 4096 tokens touches all: each device reads its 16 experts whole
    rates = rates_from_spec(hw)
    step = step_model(arch, plan, rates, 8)
    rows = step.phase("decode", 4096, 0, 4096 * 600.0).ops
    routed = sum(t.op.weight_bytes * t.op.count for t in rows if t.op.experts)
    one_expert = 3 * arch.hidden_size * moe.expert_intermediate * 2.0
    assert routed == pytest.approx(16 * one_expert * moe.layers, rel=1e-6)
    # one token: the busiest device reads more than tensor parallelism's eighth of k experts
    one = sum(t.op.weight_bytes * t.op.count
              for t in step.phase("decode", 1, 0, 600.0).ops if t.op.experts)
    assert one > moe.experts_per_token / 8 * one_expert * moe.layers * 1.5


# --- llama.cpp's expert offload ------------------------------------------------------------


def _device_weights(**options) -> float:
    plan = _plan("qwen3-30b-a3b", "rtx-4090", "llama.cpp", "q4_k_m", ctx=4096, **options)
    est = estimate_inference(_arch("qwen3-30b-a3b"), plan, find_hardware("rtx-4090"))
    return est.breakdown["weights"]


def test_cpu_moe_moves_exactly_the_expert_tensors_and_n_cpu_moe_those_of_n_layers():
    arch = _arch("qwen3-30b-a3b")
    moe = arch.moe
    assert moe is not None and moe.layers == arch.num_layers == 48
    # ffn_up_exps, ffn_gate_exps, ffn_down_exps: 128 experts of 2048 x 768 each, all Q4_K
    layer = 3 * moe.num_experts * arch.hidden_size * moe.expert_intermediate * Q4_K_BYTES
    whole = _device_weights()
    assert whole - _device_weights(cpu_moe=True) == pytest.approx(48 * layer, rel=1e-9)
    assert whole - _device_weights(n_cpu_moe=10) == pytest.approx(10 * layer, rel=1e-9)
    # with -ngl 40 the first 8 layers are on the host already: 10 moves the experts of 2 more
    ngl = _device_weights(gpu_layers=40)
    assert ngl - _device_weights(gpu_layers=40, n_cpu_moe=10) == pytest.approx(2 * layer, rel=1e-9)


def test_n_cpu_moe_skips_a_dense_first_layer():
    arch = _arch("deepseek-v2-lite")
    assert arch.moe is not None and arch.num_layers - arch.moe.layers == 1
    hw = find_hardware("rtx-3090")
    weights = [estimate_inference(arch, _plan("deepseek-v2-lite", "rtx-3090", "llama.cpp",
                                              "q4_0", ctx=4096, **o), hw).breakdown["weights"]
               for o in ({}, {"n_cpu_moe": 1}, {"n_cpu_moe": 2})]
    assert weights[0] == weights[1] > weights[2]


def test_decode_with_cpu_moe_is_between_all_on_gpu_and_no_layer_on_it():
    model, hw = resolve_model("qwen3-30b-a3b"), find_hardware("rtx-4090")
    arch = _arch("qwen3-30b-a3b")
    times = {}
    for label, options in (("gpu", {}), ("cpu-moe", {"cpu_moe": True}), ("ngl 0", {"gpu_layers": 0})):
        plan = _plan("qwen3-30b-a3b", "rtx-4090", "llama.cpp", "q4_k_m", ctx=4096, **options)
        answer = infer(model, arch, hw, plan)
        assert answer.time is not None
        times[label] = answer.time.decode_s_per_token
        if label == "cpu-moe":
            assert offload_host(plan, hw) is not None
            assert answer.memory.fits
    assert times["gpu"] < times["cpu-moe"] < times["ngl 0"]
    # the host streams the touched experts: k of E of 15.2 GiB, at under 100 GB/s
    host_bytes = 48 * 3 * 128 * 2048 * 768 * Q4_K_BYTES * 8 / 128
    assert times["cpu-moe"] - times["gpu"] > host_bytes / 100e9


@pytest.mark.parametrize(("args", "says"), [
    (["llama-3.1-8b", "--runtime", "llama.cpp", "--cpu-moe"], "has no experts"),
    (["qwen3-30b-a3b", "--runtime", "llama.cpp", "--expert-parallel"],
     "--expert-parallel applies to sglang and vllm, not llama.cpp"),
    (["qwen3-30b-a3b", "--runtime", "llama.cpp", "--n-cpu-moe", "49"], "more than"),
    (["qwen3-30b-a3b", "--runtime", "vllm", "--cpu-moe"], "--cpu-moe applies to llama.cpp"),
    (["qwen3-30b-a3b", "--runtime", "llama.cpp", "--cpu-moe", "--n-cpu-moe", "4"], "both say"),
    (["llama-3.1-8b", "--runtime", "vllm", "--tp", "2", "--expert-parallel"], "has no experts"),
])
def test_bad_expert_options_give_one_line(args, says, capsys):
    code, out, err = run(["infer", *args, "--on", "rtx-4090"], capsys)
    assert code == 2
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and says in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint: ")


def test_config_files_set_the_expert_options(tmp_path: Path):
    cases = (("vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 4 --enable-expert-parallel",
              {"tp": 4, "expert_parallel": True}),
             ("python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp 8 --ep-size 8",
              {"tp": 8, "expert_parallel": True}),
             ("llama-server -m Qwen3-30B-A3B-Q4_K_M.gguf -ngl 99 -ot exps=CPU", {"cpu_moe": True}),
             ("llama-server -m gpt-oss-120b-mxfp4.gguf --n-cpu-moe 30", {"n_cpu_moe": 30}))
    for i, (line, options) in enumerate(cases):
        path = tmp_path / f"run{i}.sh"
        path.write_text(line + "\n")
        read = read_config(path, None, "infer", ("serve",))
        assert {k: read.options.get(k) for k in options} == options
        assert not any("expert" in s.why for s in read.not_modelled)


def test_advise_and_cost_take_the_expert_options_as_infer_does(capsys) -> None:
    """One vocabulary: --cpu-moe and --expert-parallel on advise and cost too, the offloaded
    experts run by the GPU host's CPU as infer runs them."""
    import json

    from gpuwise.cli import main

    def advise(*extra: str) -> dict:
        try:
            main(["advise", "qwen3-30b-a3b", "--on", "rtx-4090", "--runtime", "llama.cpp",
                  "--weights", "q4_k_m", "--requests-per-day", "2000", "--json", *extra])
        except SystemExit as exc:
            assert not exc.code
        return json.loads(capsys.readouterr().out)["recommendation"]

    on_gpu, offloaded = advise(), advise("--cpu-moe")
    assert offloaded["time_per_output_token_s"] > 2 * on_gpu["time_per_output_token_s"]
    try:
        main(["cost", "qwen3-30b-a3b", "--on", "h100", "--cpu-moe", "--requests-per-day", "10"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "give --runtime llama.cpp" in capsys.readouterr().err
