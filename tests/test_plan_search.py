"""`gpuwise plan`'s search (estimate/plan/search.py): on small spaces its choice is the one an
exhaustive search over the same space finds with the same simulator, or within 2% of its
cost; it sizes fewer configurations to get there; each device and runtime (of the first
eight by floor: all of them here) is sized once at least; and the scheduler's narrower limits reach the simulation."""

from __future__ import annotations

import pytest

from gpuwise.app.cost import candidate
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.costs import load_costs
from gpuwise.estimate.cost.serving_sim import prepare_serving
from gpuwise.estimate.plan.search import Limits, Problem, search
from gpuwise.estimate.plan.space import Config, base_configs
from gpuwise.estimate.serve.replica import ReplicaOptions
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan

SPACES = [  # model, devices, runtimes, weights, requests/s, ms/token, TTFT ms
    ("qwen2.5-1.5b", ("t4", "l4"), ("vllm",), ("bf16",), 2.0, 40.0, 800.0),
    ("qwen2.5-1.5b", ("rtx-4090", "a10"), ("sglang",), ("bf16",), 8.0, 30.0, 500.0),
    ("qwen2.5-7b", ("l4", "a100-sxm-40gb"), ("vllm",), ("bf16",), 1.0, 50.0, 1000.0),
    ("qwen2.5-7b", ("rtx-4090", "rtx-3090"), ("vllm",), ("fp8", "int4"), 3.0, 40.0, 1000.0),
    ("qwen2.5-7b", ("h100-sxm",), ("vllm", "sglang"), ("bf16",), 20.0, 30.0, 600.0),
    ("llama-3.1-8b", ("l40s", "a10g"), ("vllm",), ("bf16",), 4.0, 60.0, 1500.0),
    ("llama-3.1-8b", ("rtx-4090",), ("vllm", "llama.cpp"), (), 1.0, 50.0, 2000.0),
    ("qwen2.5-3b", ("t4", "rtx-3060-12gb"), ("vllm",), ("bf16",), 2.0, 50.0, 1000.0),
    ("qwen3-8b", ("a100-sxm-80gb", "l40s"), ("sglang",), ("bf16",), 6.0, 35.0, 800.0),
    ("qwen2.5-1.5b", ("rtx-3090", "rtx-4060-ti-16gb"), ("vllm",), ("bf16",), 12.0, 25.0, 400.0),
]


def _problem(model: str, devices: tuple[str, ...], rate: float, tpot: float,
             ttft: float) -> tuple[Problem, object]:
    entry = resolve_model(model)
    arch = from_config(entry.config)
    cands = {d: candidate(find_hardware(d)) for d in devices}
    cands = {c.hw.id: c for c in cands.values()}
    load = ServeLoad(rate * 86400, 512, 256, tpot, ttft)
    return Problem(arch, load, InferencePlan(), cands, load_costs()), arch


@pytest.mark.parametrize("space", SPACES, ids=[f"{s[0]}-{'-'.join(s[1])}" for s in SPACES])
def test_the_choice_is_the_exhaustive_searchs(space: tuple) -> None:
    model, devices, runtimes, weights, rate, tpot, ttft = space
    p, arch = _problem(model, devices, rate, tpot, ttft)
    bases = [c for cand in p.candidates.values()
             for c in base_configs(arch, cand.hw.id, cand.hw.kind, None, runtimes, weights,
                                   gpus_max=2)]
    pruned, full = search(p, bases), search(p, bases, exhaustive=True)
    if full.best is None:
        assert pruned.best is None
        return
    assert pruned.best is not None
    assert pruned.best.cost <= full.best.cost * 1.02
    assert len(pruned.evaluated) <= len(full.evaluated)
    sized = {(e.config.device, e.config.runtime) for e in pruned.evaluated}
    fits = {(c.device, c.runtime) for c in bases} - {(c.device, c.runtime)
                                                      for c, _ in pruned.refused}
    assert fits <= sized | {(c.device, c.runtime) for c, _ in full.refused}


def test_the_bound_leaves_configurations_unsized() -> None:
    p, arch = _problem("qwen2.5-7b", ("rtx-4090", "h100-sxm", "l4", "a100-sxm-80gb"), 3.0,
                       50.0, 1000.0)
    bases = [c for cand in p.candidates.values()
             for c in base_configs(arch, cand.hw.id, cand.hw.kind, None, ("vllm",))]
    found = search(p, bases)
    assert found.best is not None and found.unsized > found.considered / 2
    assert len(found.evaluated) < found.considered / 4


def test_limits_are_kept() -> None:
    p, arch = _problem("qwen2.5-7b", ("rtx-4090", "h100-sxm"), 3.0, 50.0, 1000.0)
    bases = [c for cand in p.candidates.values()
             for c in base_configs(arch, cand.hw.id, cand.hw.kind, None, ("vllm",))]
    free = search(p, bases).best
    assert free is not None
    capped = Problem(p.arch, p.load, p.deployment, p.candidates, p.assumptions,
                     Limits(budget_usd_per_month=free.cost * 0.5))
    assert search(capped, bases).best is None  # nothing meets the targets within half


def test_a_narrower_batch_reaches_the_engine() -> None:
    p, arch = _problem("qwen2.5-7b", ("h100-sxm",), 3.0, 50.0, 1000.0)
    cand = p.candidates["h100-sxm"]
    default = prepare_serving(arch, p.load, cand, "bf16", "vllm", InferencePlan(),
                              ReplicaOptions(tp=1))
    narrow = prepare_serving(arch, p.load, cand, "bf16", "vllm", InferencePlan(),
                             ReplicaOptions(tp=1, max_seqs=16, max_batched_tokens=1024))
    assert not isinstance(default, str) and not isinstance(narrow, str)
    assert narrow.engine.limits.max_seqs == 16 < default.engine.limits.max_seqs
    assert narrow.engine.limits.max_batched_tokens == 1024
    assert Config("h100-sxm", "vllm", "bf16", None, 1, False, 0.25).base == \
        Config("h100-sxm", "vllm", "bf16", None, 1)
