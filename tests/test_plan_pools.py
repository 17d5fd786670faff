"""Pipeline parallelism and disaggregated prefill/decode, as `gpuwise plan` sizes them
(estimate/serve/pipeline.py, estimate/cost/disaggregated.py; docs/plan.md)."""

from __future__ import annotations

import pytest

from gpuwise.app.cost import candidate
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.estimate.cost.disaggregated import prepare_pools, shares, size_pools
from gpuwise.estimate.cost.serving_sim import prepare_serving, size_serving_simulated
from gpuwise.estimate.plan.space import Config, base_configs, knob_variants
from gpuwise.estimate.serve.replica import ReplicaOptions, no_load_latency, rate_ceiling
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan

VLLM = InferencePlan(runtime="vllm")


def _engine(model: str, device: str, weights: str, tp: int, pp: int):
    _, arch = model_named(model)
    prep = prepare_serving(arch, ServeLoad(86400.0, 2048, 256), candidate(hardware_named(device)),
                           weights, "vllm", VLLM, ReplicaOptions(tp=tp, pp=pp))
    assert not isinstance(prep, str), prep
    return arch, prep


def test_a_pipeline_stage_streams_the_whole_model_and_holds_its_share_of_the_cache():
    _, tp8 = _engine("llama-3.1-405b", "h200", "fp8", 8, 1)
    _, pp2 = _engine("llama-3.1-405b", "h200", "fp8", 4, 2)
    _, tp4 = _engine("llama-3.1-70b", "h200", "fp8", 4, 1)
    # one in-flight batch of a 4 x 2 pipeline: the whole model on 4 devices, plus the hop
    t_pp = no_load_latency(pp2.engine, 2048, 256)[1]
    t_tp8 = no_load_latency(tp8.engine, 2048, 256)[1]
    assert t_pp > 1.4 * t_tp8
    # the 8 devices' cache split between the 2 batches in flight, as TP8's is one batch's
    assert pp2.engine.kv_blocks == pytest.approx(tp8.engine.kv_blocks / 2, rel=0.05)
    assert pp2.engine.limits.max_seqs == tp8.engine.limits.max_seqs // 2
    assert tp4.pp == 1 and pp2.pp == 2


def test_tensor_parallelism_at_minimum_latency_pipeline_at_maximum_throughput():
    """NVIDIA's Llama-3.1-405B on 8 x H200 (benchmarks/data/plan_orderings.json)."""
    _, tp8 = _engine("llama-3.1-405b", "h200", "fp8", 8, 1)
    _, pp8 = _engine("llama-3.1-405b", "h200", "fp8", 1, 8)
    assert no_load_latency(tp8.engine, 2048, 256)[1] < no_load_latency(pp8.engine, 2048, 256)[1]
    # a pipeline of 8 is 8 engines: its ceiling over TP8's
    assert 8 * rate_ceiling(pp8.engine, 2048, 256) > 1.2 * rate_ceiling(tp8.engine, 2048, 256)


def test_a_pipelined_fleet_is_whole_pipelines():
    _, arch = model_named("llama-3.1-70b")
    cand = candidate(hardware_named("h100"))
    load = ServeLoad(3 * 86400.0, 1024, 128, tpot_ms=60, ttft_ms=3000)
    s = size_serving_simulated(arch, load, cand, "fp8", "vllm", VLLM, ReplicaOptions(tp=2, pp=2))
    assert not isinstance(s, str), s
    assert s.devices_per_replica == 4 and s.devices % 4 == 0 and s.meets


def test_the_space_has_pipelines_and_pools_where_the_runtime_runs_them():
    _, arch = model_named("llama-3.1-70b")
    gpu = base_configs(arch, "h100-sxm", "gpu", None, ("vllm", "llama.cpp"), ("fp8", "q4_k_m"))
    assert {(c.tp, c.pp) for c in gpu if c.runtime == "vllm"} >= {(8, 1), (4, 2), (1, 8)}
    assert all(c.devices <= 8 for c in gpu)
    assert any(c.disagg for c in gpu if c.runtime == "vllm")
    assert not any(c.pp > 1 or c.disagg for c in gpu if c.runtime == "llama.cpp")
    assert all(not c.disagg or c.pp == 1 for c in gpu)
    assert knob_variants(Config("h100-sxm", "vllm", "fp8", None, 4, disagg=True)) == []
    capped = base_configs(arch, "h100-sxm", "gpu", None, ("vllm",), ("fp8",), gpus_max=4)
    assert max(c.devices for c in capped) == 4
    cpu = base_configs(arch, "cpu-cloud-32vcpu", "cpu", None)
    assert all(c.tp == c.pp == 1 and not c.disagg for c in cpu)


def _pools(tpot_ms: float | None = 40, ttft_ms: float | None = 1000, rate: float = 4.0):
    _, arch = model_named("llama-3.1-70b")
    cand = candidate(hardware_named("h100"))
    load = ServeLoad(rate * 86400, 2048, 256, tpot_ms=tpot_ms, ttft_ms=ttft_ms)
    pools = prepare_pools(arch, load, cand, "fp8", "vllm", VLLM, ReplicaOptions(tp=2))
    assert not isinstance(pools, str), pools
    return arch, load, cand, pools


def test_the_decode_pool_computes_one_token_of_each_prompt_it_takes_in():
    _, _, _, pools = _pools()
    # a step admitting a prompt of 2048 beside 10 decoding sequences: 11 tokens' step
    admitting = pools.decode.step_parts(2048 + 10, 2048, 30_000.0, 1e12)
    decoding = pools.prefill.step_parts(11, 0, 30_000.0, 0.0)
    assert admitting == decoding
    assert pools.transfer_s > 0


def test_the_pools_split_the_targets_and_the_transfer_between_them():
    _, load, _, pools = _pools()
    split = shares(pools, load)
    assert not isinstance(split, str)
    prefill, decode = split
    assert decode.tpot_s == pytest.approx(0.040)
    assert prefill.ttft_s + decode.ttft_s + pools.transfer_s == pytest.approx(1.0)
    assert decode.ttft_s >= 0.040
    _, tight, _, tight_pools = _pools(ttft_ms=0.01)
    assert isinstance(shares(tight_pools, tight), str)


def test_disaggregated_pools_are_sized_apart_and_meet_the_targets_at_the_load():
    arch, load, cand, pools = _pools()
    s = size_pools(arch, load, cand, pools)
    assert not isinstance(s, str), s
    assert s.meets and 0 < s.prefill_replicas < s.replicas
    assert s.devices == 2 * s.replicas
    assert s.ttft_s is not None and s.ttft_s * 1e3 <= load.ttft_ms
    assert s.tpot_s is not None and s.tpot_s * 1e3 <= load.tpot_ms
    assert s.ttft_s > pools.transfer_s


def test_disaggregation_does_not_raise_the_most_a_fleet_serves():
    """vLLM's docs: disaggregated prefill does not improve throughput. Without targets, the
    two pools need at least the devices of the replicas that do both."""
    arch, load, cand, pools = _pools(tpot_ms=None, ttft_ms=None, rate=20.0)
    s = size_pools(arch, load, cand, pools)
    together = size_serving_simulated(arch, load, cand, "fp8", "vllm", VLLM, ReplicaOptions(tp=2))
    assert not isinstance(s, str) and not isinstance(together, str)
    assert s.devices >= together.devices


def _plan_json(capsys, *args: str) -> dict:
    import json

    from cli_run import run_cli

    code, out, err = run_cli(["plan", "llama-3.1-70b", "--on", "h100", "--runtime", "vllm",
                              "--weights", "fp8", "--rate", "2", *args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_one_shape_asked_is_the_only_one_searched_and_its_command_runs_it(capsys):
    got = _plan_json(capsys, "--tp", "2", "--pp", "2", "--prefill-decode", "aggregated")
    assert {c["label"].split()[0] for c in got["sized"]} == {"2x2pp"}
    assert not any("disaggregated" in c["label"] for c in got["sized"])
    assert got["choice"]["pp"] == 2 and "--pipeline-parallel-size 2" in got["command"]
    pools = _plan_json(capsys, "--tp", "4", "--prefill-decode", "disaggregated",
                       "--ttft-ms", "1000", "--tpot-ms", "40")
    assert pools["choice"]["disaggregated"] and pools["choice"]["prefill_replicas"] >= 1
    assert '"kv_role":"kv_producer"' in pools["command"]
    assert '"kv_role":"kv_consumer"' in pools["command"]


@pytest.mark.parametrize("option", [["--tp", "3"], ["--pp", "two"], ["--prefill-decode", "x"]])
def test_a_shape_not_searched_is_one_error_line(capsys, option):
    from cli_run import run_cli

    code, out, err = run_cli(["plan", "llama-3.1-70b", "--on", "h100", "--rate", "2", *option],
                             capsys)
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
