"""advise keeps its promise (issue 39, item 3): each replica runs at most at the promised share
of the highest rate it sustains within the targets in steady state, and the chosen fleet,
re-simulated at the requested load by a run several times longer than the sizing's, meets the
targets for at least 90% of requests."""

from __future__ import annotations

import json

import pytest

from gpuwise.app.cost import candidate
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.cost.serving_sim import size_serving_simulated
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine
from gpuwise.estimate.serve.simulate import simulate
from gpuwise.estimate.serve.steady_load import steady_counts
from gpuwise.estimate.serve.sweep import ATTAINMENT
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths, poisson_requests

LONG, WARM = 6000, 2000  # the check's run: requests, of which the warm-up left out
LOADS = (("h100", 5.0), ("h100", 40.0), ("h100", 150.0), ("l4", 2.0), ("rtx-4090", 10.0))


def _long_run(arch, hw, tp, rate, slo):  # type: ignore[no-untyped-def]
    plan = InferencePlan(runtime="vllm", prompt_tokens=512, new_tokens=256, tp=tp)
    engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions(tp=tp))
    reqs = poisson_requests(rate, LONG, Lengths(512, 256), seed=7)
    return summary(simulate(engine, reqs), slo, after_s=reqs[WARM].arrival_s)


@pytest.mark.parametrize(("device", "rate"), LOADS)
def test_the_chosen_fleet_meets_the_targets_when_re_simulated(device, rate):
    arch = from_config(resolve_model("qwen2.5-7b").config)
    hw = find_hardware(device)
    load = ServeLoad(rate * 86400, 512, 256, 50.0, 1000.0)
    sizing = size_serving_simulated(arch, load, candidate(hw), "bf16", "auto")
    assert not isinstance(sizing, str) and sizing.meets
    slo = Slo(1.0, 0.05)
    tp, replicas = sizing.devices_per_replica, sizing.replicas
    at_load = _long_run(arch, hw, tp, rate / replicas, slo)
    assert not at_load.saturated and at_load.slo_met_fraction >= ATTAINMENT
    assert at_load.ttft_s.p90 <= 1.0 and at_load.tpot_s.p90 <= 0.05
    # the promise: each replica at most at 60% of a rate it sustains within the targets
    promised = _long_run(arch, hw, tp, rate / replicas / load.max_utilisation, slo)
    assert not promised.saturated and promised.slo_met_fraction >= ATTAINMENT
    # and the sizing's figures are its own steady run's, close to the long run's
    assert sizing.tpot_s == pytest.approx(at_load.tpot_s.p90, rel=0.1)


def test_a_short_run_would_have_promised_a_rate_the_replica_cannot_sustain():
    """The old sizing's 200 requests at 51 requests/s all ran at once in an H100's batch of
    1,024, so the queue that grows without end at that rate never formed; the steady run is
    long enough to fill the batch, and at that rate it does not meet the targets."""
    arch = from_config(resolve_model("qwen2.5-7b").config)
    hw = find_hardware("h100")
    plan = InferencePlan(runtime="vllm", prompt_tokens=512, new_tokens=256)
    engine = build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions())
    slo = Slo(1.0, 0.05)
    short = summary(simulate(engine, poisson_requests(51.0, 200, Lengths(512, 256))), slo)
    assert short.slo_met_fraction >= ATTAINMENT  # what a 200-request run claimed
    count, warm = steady_counts(engine, 51.0, Lengths(512, 256), slo)
    assert count > 1000 and warm > 200
    reqs = poisson_requests(51.0, count, Lengths(512, 256))
    steady = summary(simulate(engine, reqs), slo, after_s=reqs[warm].arrival_s)
    assert steady.saturated or steady.slo_met_fraction < ATTAINMENT


def test_this_machines_row_is_what_serve_says_for_it(tmp_path, monkeypatch, capsys):
    """advise's row for this machine (probed) is `gpuwise serve --on local` of the same plan and
    load: the same runtime (llama.cpp on a CPU), weights, replicas and steady-state run."""
    from test_probe_trust import _good

    from gpuwise.cli import main
    from gpuwise.measure.probe.store import save_profile

    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    save_profile(_good())
    common = ["--prompt", "256", "--new-tokens", "32", "--json"]
    # the test's profile is a slow machine's (0.5 s a token): a light load, no targets
    main(["advise", "qwen2.5-0.5b", "--on", "local", "--rate", "0.001", *common])
    out, _ = capsys.readouterr()
    rows = [o for o in json.loads(out)["options"] if o.get("kind") == "cpu"]
    assert rows, "this machine was not sized"
    row = rows[0]
    weights = row["precision"].split(" ")[0]
    main(["serve", "qwen2.5-0.5b", "--on", "local", "--runtime", "llama.cpp", "--weights", weights,
          "--rate", "0.001", "--gpus", str(row["devices"]), "--requests",
          str(row["simulated_requests"]), "--warmup", str(row["warmup_requests"]), *common])
    served = json.loads(capsys.readouterr()[0])
    assert served["tpot_s"]["p90"] == row["time_per_output_token_s"]
    assert served["ttft_s"]["p90"] == row["ttft_s"]
