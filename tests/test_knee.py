"""advise's knee (estimate/serve/sweep.py `knee`): the rate `serve --sweep`'s curve and
bisections find, in fewer runs and none spent where no rate can meet the targets."""

from __future__ import annotations

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.memory.fits import devices_for_inference
from gpuwise.estimate.serve.metrics import Slo
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine, no_load_latency
from gpuwise.estimate.serve.simulate import Engine
from gpuwise.estimate.serve.sweep import KNEE_RUNS, knee, meets, sweep
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths

LENGTHS = Lengths(512, 256)


def _engine(device: str, weights: str = "bf16", runtime: str = "vllm") -> Engine:
    arch = from_config(resolve_model("qwen2.5-7b").config)
    hw = find_hardware(device)
    plan = InferencePlan(prompt_tokens=512, new_tokens=256, weights=weights, runtime=runtime)
    tp = devices_for_inference(arch, plan, hw) or 1
    plan = InferencePlan(prompt_tokens=512, new_tokens=256, weights=weights, runtime=runtime,
                         tp=tp)
    return build_engine(arch, plan, hw, rates_from_spec(hw), ReplicaOptions(tp=tp))


@pytest.mark.parametrize(("device", "slo"), [
    ("t4", Slo(1.0, 0.05)),
    ("rtx-4090", Slo(1.0, 0.05)),
    ("l4", Slo(0.5, 0.08)),
])
def test_knee_is_the_sweeps(device: str, slo: Slo) -> None:
    """Within a few per cent of the full sweep's knee (8 points and 6 bisections), in at most
    KNEE_RUNS runs, and the rate it returns meets the targets."""
    engine = _engine(device)
    full = sweep(engine, LENGTHS, 200, slo)
    found = knee(engine, LENGTHS, 200, slo)
    assert full.max_rate_meeting_slo and found.max_rate_meeting_slo
    assert found.max_rate_meeting_slo == pytest.approx(full.max_rate_meeting_slo, rel=0.06)
    assert 0 < len(found.curve) <= KNEE_RUNS
    at = {p.rate: p.summary for p in found.curve}[found.max_rate_meeting_slo]
    assert meets(at, slo)


def test_a_target_one_request_misses_runs_nothing() -> None:
    engine = _engine("t4")
    _, tpot = no_load_latency(engine, LENGTHS.prompt, LENGTHS.output)
    found = knee(engine, LENGTHS, 200, Slo(None, tpot * 0.9))
    assert found.max_rate_meeting_slo is None
    assert found.curve == ()
