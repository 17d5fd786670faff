"""Does `gpuwise plan`'s model rank serving configurations in the order published runs did?
(issue 41, "Against published choices"; docs/plan.md, "Published orderings").

For each entry of benchmarks/data/plan_orderings.json that gpuwise can model (a model in its
catalogue, a runtime it simulates), the configurations the source compared are built as
`gpuwise plan` builds them (estimate/cost/serving_sim.py `prepare_serving`, the pools of
estimate/cost/disaggregated.py) and measured on the source's metric with the serving
simulation; the published order is then compared with gpuwise's. Nothing here is fitted to
these sources. Entries gpuwise cannot model are listed with the reason.

Run:  .venv/bin/python benchmarks/validate_plan_orderings.py [--json benchmarks/results/plan_orderings.json]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwise.app.cost import candidate
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.estimate.cost.disaggregated import ADMISSION_BUDGET, DecodeOnly
from gpuwise.estimate.cost.serving_sim import prepare_serving
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, no_load_latency
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.estimate.serve.sweep import knee
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths, Request

DATA = Path(__file__).parent / "data" / "plan_orderings.json"
KNEE_REQUESTS = 300
NO_TARGETS = Slo(None, None)


@dataclass(frozen=True)
class Checked:
    entry: str
    metric: str
    published: tuple[str, ...]  # best first
    values: dict[str, float]  # gpuwise's, by configuration
    higher_is_better: bool = True

    @property
    def ours(self) -> tuple[str, ...]:
        return tuple(sorted(self.values, key=lambda k: -self.values[k] if self.higher_is_better
                            else self.values[k]))

    @property
    def agrees(self) -> bool:
        return self.ours == self.published


def engine(model: str, device: str, weights: str, tp: int, pp: int = 1,
           runtime: str = "vllm", prompt: int = 2048, output: int = 128) -> Engine:
    _, arch = model_named(model)
    prep = prepare_serving(arch, ServeLoad(86400.0, prompt, output),
                           candidate(hardware_named(device)), weights, runtime,
                           InferencePlan(runtime=runtime), ReplicaOptions(tp=tp, pp=pp))
    if isinstance(prep, str):
        raise SystemExit(f"{model} on {tp}x{pp} {device}: {prep}")
    return prep.engine


def most_rate(e: Engine, lengths: Lengths, slo: Slo = NO_TARGETS) -> float:
    """The highest request rate one engine serves within `slo` (short of saturation)."""
    return knee(e, lengths, KNEE_REQUESTS, slo).max_rate_meeting_slo or 0.0


def decode_only(e: Engine) -> Engine:
    return replace(e, step_parts=DecodeOnly(e.step_parts),
                   limits=replace(e.limits, max_batched_tokens=ADMISSION_BUDGET))


def llama70b_tp4x2_vs_tp8() -> list[Checked]:
    """ISC 2026 poster: Llama-3.3-70B FP8 on 8 x H100 under vLLM, 2,048-token prompts."""
    lengths = Lengths(2048, 128)
    tp8 = engine("llama-3.1-70b", "h100", "fp8", 8)
    tp4 = engine("llama-3.1-70b", "h100", "fp8", 4)
    rate = {"TP4 x 2": 2 * most_rate(tp4, lengths), "TP8": most_rate(tp8, lengths)}
    ttft = {"TP8": no_load_latency(tp8, 2048, 128)[0], "TP4 x 2": no_load_latency(tp4, 2048, 128)[0]}
    key = "llama33_70b_fp8_8xh100_tp4x2_vs_tp8_vllm"
    return [Checked(key, "requests/s on 8 GPUs, 2,048-token prompts", ("TP4 x 2", "TP8"), rate),
            Checked(key, "TTFT at light load, s", ("TP8", "TP4 x 2"), ttft, False)]


def llama405b_tp_vs_pp() -> list[Checked]:
    """NVIDIA's blog: Llama-3.1-405B on 8 x H200 (TensorRT-LLM; vLLM's model here)."""
    lengths = Lengths(2048, 256)
    tp8 = engine("llama-3.1-405b", "h200", "fp8", 8, output=256)
    pp8 = engine("llama-3.1-405b", "h200", "fp8", 1, 8, output=256)
    key = "llama31_405b_8xh200_tp8_vs_pp8_trtllm"
    latency = {"TP8": no_load_latency(tp8, 2048, 256)[1], "PP8": no_load_latency(pp8, 2048, 256)[1]}
    most = {"PP8": 8 * most_rate(pp8, lengths), "TP8": most_rate(tp8, lengths)}
    return [Checked(key, "time per output token alone, s", ("TP8", "PP8"), latency, False),
            Checked(key, "requests/s at saturation", ("PP8", "TP8"), most)]


def qwen3_32b_agg_vs_disagg() -> list[Checked]:
    """AIConfigurator's Qwen3-32B FP8 example on H200: 4,000 + 500 tokens, TTFT <= 300 ms,
    TPOT <= 10 ms; tokens/s a GPU within the targets."""
    lengths = Lengths(4000, 500)
    slo = Slo(0.300, 0.010)
    out: dict[str, float] = {}
    for tp in (4, 8, 2):
        e = engine("qwen3-32b", "h200", "fp8", tp, prompt=4000, output=500)
        out[f"agg TP{tp}"] = most_rate(e, lengths, slo) * 500 / tp
    prefill = engine("qwen3-32b", "h200", "fp8", 2, prompt=4000, output=500)
    decode = decode_only(engine("qwen3-32b", "h200", "fp8", 4, prompt=4000, output=500))
    # the decode pool's share: a quarter of the TTFT for its first token (docs/plan.md)
    rate_p = most_rate(prefill, Lengths(4000, 1), Slo(0.300 * 0.75, None))
    rate_d = most_rate(decode, lengths, Slo(0.300 * 0.25, 0.010))
    out["disagg TP2 prefill + TP4 decode"] = (500 / (2 / rate_p + 4 / rate_d)
                                              if rate_p and rate_d else 0.0)
    return [Checked("aiconfigurator_qwen3_32b_fp8_32xh200_agg_vs_disagg",
                    "output tokens/s a GPU within TTFT 300 ms, TPOT 10 ms",
                    ("disagg TP2 prefill + TP4 decode", "agg TP4", "agg TP8", "agg TP2"), out)]


def vllm_disagg_no_throughput_gain() -> list[Checked]:
    """vLLM's docs: disaggregated prefill does not improve throughput (Llama-3.1-70B FP8 on
    H100, TP2 pools, 3,000 + 150 tokens as Dynamo's example; no targets)."""
    lengths = Lengths(3000, 150)
    agg = engine("llama-3.1-70b", "h100", "fp8", 2, prompt=3000, output=150)
    rate_p = most_rate(agg, Lengths(3000, 1))
    rate_d = most_rate(decode_only(agg), lengths)
    per_gpu = {"aggregated": most_rate(agg, lengths) / 2,
               "disaggregated": 1 / (2 / rate_p + 2 / rate_d)}
    return [Checked("vllm_docs_disagg_prefill_no_throughput_gain",
                    "requests/s a GPU at saturation", ("aggregated", "disaggregated"), per_gpu)]


def gpt_oss_120b_burst() -> list[Checked]:
    """GPUStack: gpt-oss-120b on H100 under vLLM, 1,000 ShareGPT prompts sent at once
    (means 215 + 196 tokens); total tokens/s a GPU."""
    reqs = [Request(0.0, 215, 196) for _ in range(1000)]
    out: dict[str, float] = {}
    for name, tp, pp in (("TP2", 2, 1), ("TP1", 1, 1), ("TP4", 4, 1), ("PP2", 1, 2)):
        e = engine("gpt-oss-120b", "h100", "mxfp4", tp, pp, prompt=215, output=196)
        share = reqs[: len(reqs) // pp]  # a pipeline's engines each take their share
        trace = simulate(e, share)
        s = summary(trace, NO_TARGETS)
        out[name] = s.requests * (215 + 196) / s.duration_s * pp / (tp * pp)
    return [Checked("gpt_oss_120b_h100_vllm_tp1_tp2_tp4_pp2",
                    "total tokens/s a GPU, 1,000 requests at once",
                    ("TP2", "TP1", "TP4", "PP2"), out)]


CHECKS: tuple[Callable[[], list[Checked]], ...] = (
    llama70b_tp4x2_vs_tp8, llama405b_tp_vs_pp, qwen3_32b_agg_vs_disagg,
    vllm_disagg_no_throughput_gain, gpt_oss_120b_burst)
NOT_MODELLED = {
    "dynamo_r1_distill_llama70b_fp8_h100_disagg_vs_agg":
        "no latency targets published (its +30% is at targets the post does not give)",
    "distserve_opt_a100_disagg_vs_vllm_goodput": "OPT models are not in the catalogue; a cluster",
    "glm46_fp8_8xh200_sglang_tp8_vs_2xtp4": "GLM-4.6 is not in the catalogue",
    "deepseek_v32_8xh200_tp8_vs_dp8_ep_vs_dp_attention":
        "SGLang's data-parallel attention and DeepSeek's sparse attention are not modelled",
}


def main() -> None:
    published = {e["id"] for e in json.loads(DATA.read_text())["entries"]}
    results = [c for check in CHECKS for c in check()]
    print("| source | metric | published order | gpuwise's order | agrees |")
    print("|---|---|---|---|---|")
    for c in results:
        assert c.entry in published, c.entry
        ours = " > ".join(f"{k} ({c.values[k]:.3g})" for k in c.ours)
        print(f"| {c.entry} | {c.metric} | {' > '.join(c.published)} | {ours} | "
              f"{'yes' if c.agrees else 'no'} |")
    for entry, why in NOT_MODELLED.items():
        assert entry in published, entry
        print(f"| {entry} | - | - | not compared: {why} | - |")
    agree = sum(c.agrees for c in results)
    print(f"\n{agree} of {len(results)} published orderings reproduced")
    if "--json" in sys.argv:
        path = Path(sys.argv[sys.argv.index("--json") + 1])
        path.write_text(json.dumps({"checked": [
            {"entry": c.entry, "metric": c.metric, "published": c.published, "gpuwise": c.ours,
             "values": c.values, "agrees": c.agrees} for c in results],
            "not_compared": NOT_MODELLED}, indent=1) + "\n")


if __name__ == "__main__":
    main()
