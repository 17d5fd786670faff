"""Does `gpuwise plan`'s model rank serving configurations in the order published runs did?
(issue 41, "Against published choices"; docs/plan.md, "Published orderings").

For each entry of benchmarks/data/plan_orderings.json that gpuwise can model (a model in its
catalogue, a runtime it simulates), each configuration the source compared is asked of
`gpuwise plan` as a user narrows its space to one shape (`--tp`, `--pp`, `--prefill-decode`)
or run by `gpuwise serve`, through the command (public_cli.py), and the source's metric read
from its `--json`; the published order is then compared with gpuwise's. Nothing here is fitted to
these sources. Entries gpuwise cannot model are listed with the reason.

Run:  .venv/bin/python benchmarks/validate_plan_orderings.py [--json benchmarks/results/plan_orderings.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from public_cli import gpuwise_json  # the commands, as users run them

DATA = Path(__file__).parent / "data" / "plan_orderings.json"
LIGHT = "0.05"  # requests a second: a light load, each request nearly alone


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


def plan(model: str, device: str, weights: str, tp: int, pp: int = 1, split: str = "aggregated",
         rate: str = LIGHT, prompt: int = 2048, output: int = 128, *targets: str) -> dict:
    """`gpuwise plan` on one replica shape, as a user narrows it: --tp, --pp, --prefill-decode."""
    return gpuwise_json("plan", model, "--on", device, "--runtime", "vllm", "--weights", weights,
                        "--tp", str(tp), "--pp", str(pp), "--prefill-decode", split,
                        "--rate", rate, "--prompt", str(prompt), "--new-tokens", str(output),
                        *targets)


def knee_per_device(answer: dict) -> float:
    """Output tokens a second a device at the choice's knee (without targets: short of
    saturation)."""
    label = answer["choice"]["label"]
    points = [p for p in answer["speed_points"] if p["label"] == label]
    return points[0]["knee_tokens_per_s_per_device"] if points else 0.0


def llama70b_tp4x2_vs_tp8() -> list[Checked]:
    """ISC 2026 poster: Llama-3.3-70B FP8 on 8 x H100 under vLLM, 2,048-token prompts."""
    tp8 = plan("llama-3.1-70b", "h100", "fp8", 8)
    tp4 = plan("llama-3.1-70b", "h100", "fp8", 4)
    most = {"TP4 x 2": knee_per_device(tp4) * 8, "TP8": knee_per_device(tp8) * 8}
    ttft = {"TP8": tp8["at_load"]["ttft_s"]["p50"], "TP4 x 2": tp4["at_load"]["ttft_s"]["p50"]}
    key = "llama33_70b_fp8_8xh100_tp4x2_vs_tp8_vllm"
    return [Checked(key, "output tokens/s on 8 GPUs, 2,048-token prompts", ("TP4 x 2", "TP8"),
                    most),
            Checked(key, "TTFT p50 at light load, s", ("TP8", "TP4 x 2"), ttft, False)]


def llama405b_tp_vs_pp() -> list[Checked]:
    """NVIDIA's blog: Llama-3.1-405B on 8 x H200 (TensorRT-LLM; vLLM's model here)."""
    tp8 = plan("llama-3.1-405b", "h200", "fp8", 8, output=256)
    pp8 = plan("llama-3.1-405b", "h200", "fp8", 1, 8, output=256)
    key = "llama31_405b_8xh200_tp8_vs_pp8_trtllm"
    latency = {"TP8": tp8["at_load"]["tpot_s"]["p50"], "PP8": pp8["at_load"]["tpot_s"]["p50"]}
    most = {"PP8": knee_per_device(pp8), "TP8": knee_per_device(tp8)}
    return [Checked(key, "time per output token p50 at light load, s", ("TP8", "PP8"), latency,
                    False),
            Checked(key, "output tokens/s a GPU short of saturation", ("PP8", "TP8"), most)]


def qwen3_32b_agg_vs_disagg() -> list[Checked]:
    """AIConfigurator's Qwen3-32B FP8 example on H200: 4,000 + 500 tokens, TTFT <= 300 ms,
    TPOT <= 10 ms; output tokens/s a GPU within the targets (plan's disaggregated pools
    have one width: the best of TP2, TP4 and TP8 pools)."""
    targets = ("--ttft-ms", "300", "--tpot-ms", "10")
    agg = {f"TP{tp}": knee_per_device(plan("qwen3-32b", "h200", "fp8", tp, 1, "aggregated",
                                           LIGHT, 4000, 500, *targets)) for tp in (4, 8, 2)}
    disagg = max(knee_per_device(plan("qwen3-32b", "h200", "fp8", tp, 1, "disaggregated",
                                      LIGHT, 4000, 500, *targets)) for tp in (2, 4, 8))
    key = "aiconfigurator_qwen3_32b_fp8_32xh200_agg_vs_disagg"
    metric = "output tokens/s a GPU within TTFT 300 ms, TPOT 10 ms"
    return [Checked(key, metric + ": the best of each", ("disaggregated", "aggregated"),
                    {"disaggregated": disagg, "aggregated": max(agg.values())}),
            Checked(key, metric + ": aggregated widths", ("TP4", "TP8", "TP2"), agg)]


def vllm_disagg_no_throughput_gain() -> list[Checked]:
    """vLLM's docs: disaggregated prefill does not improve throughput (Llama-3.1-70B FP8 on
    H100, TP2 pools, 3,000 + 150 tokens as Dynamo's example; no targets)."""
    per_device = {split: knee_per_device(plan("llama-3.1-70b", "h100", "fp8", 2, 1, split,
                                              LIGHT, 3000, 150))
                  for split in ("aggregated", "disaggregated")}
    return [Checked("vllm_docs_disagg_prefill_no_throughput_gain",
                    "output tokens/s a GPU short of saturation", ("aggregated", "disaggregated"),
                    per_device)]


def gpt_oss_120b_burst() -> list[Checked]:
    """GPUStack: gpt-oss-120b on H100 under vLLM, 1,000 ShareGPT prompts sent at once
    (means 215 + 196 tokens), through `gpuwise serve --trace`; total tokens/s a GPU (its PP2
    run is left out: serve runs no pipeline)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "burst.jsonl"
        trace.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt_tokens": 215,
                                             "output_tokens": 196}) + "\n"
                                 for _ in range(1000)))
        out = {}
        for tp in (2, 1, 4):
            run = gpuwise_json("serve", "gpt-oss-120b", "--on", "h100", "--tp", str(tp),
                               "--runtime", "vllm", "--weights", "mxfp4", "--trace", str(trace))
            out[f"TP{tp}"] = run["requests"] * (215 + 196) / run["duration_s"] / tp
    return [Checked("gpt_oss_120b_h100_vllm_tp1_tp2_tp4_pp2",
                    "total tokens/s a GPU, 1,000 requests at once", ("TP2", "TP1", "TP4"), out)]


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
