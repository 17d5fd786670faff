"""GPU memory estimates vs published measurements (docs/memory.md, "Checked against published
GPU runs").

Each entry of benchmarks/data/memory_measurements.json names its source, a verbatim quote, the
statistic it reports and the plan (model, device, batch, stack options) the source states. The
estimate is compared on that statistic:

  allocated             MemoryEstimate.allocated_bytes (live tensors, no allocator slack)
  reserved              MemoryEstimate.model_bytes (the caching allocator's pool)
  nvidia-smi            MemoryEstimate.total_bytes (pool + CUDA context + NCCL)
  vllm_weights          vLLM's weights on one GPU (vllm_pool)
  vllm_activation_peak  vLLM's profiled activation peak
  vllm_kv_cache         the KV pool vLLM's profiling leaves

Nothing is fitted to these entries. error = estimated / published - 1.

Run:  .venv/bin/python benchmarks/validate_published_memory.py
      (writes benchmarks/results/memory_published.json)
Target (issue 24): median |error| <= 5%, worst <= 15%.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.memory.serving_runtimes import vllm_pool
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.workload import Architecture, from_config
from gpuwise.workload.plans import InferencePlan, TrainingPlan

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "memory_measurements.json"
OUT = ROOT / "results" / "memory_published.json"
GIB, GB = 1024**3, 1e9
TRAIN_KEYS = set(TrainingPlan.__dataclass_fields__)
INFER_KEYS = set(InferencePlan.__dataclass_fields__)


def architecture(name: str, models: dict[str, Any]) -> Architecture:
    """A catalogue model, or one the data file describes (with its source)."""
    spec = models.get(name)
    if spec is None:
        return from_config(resolve_model(name).config)
    if "config" in spec:
        return from_config(dict(spec["config"]))
    config = dict(resolve_model(spec["catalog"]).config)
    config.update(spec.get("override", {}))
    return from_config(config)


def _plan_fields(plan: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    fields = {k: v for k, v in plan.items() if k in keys}
    for key in ("offload", "lora_targets"):
        if key in fields:
            fields[key] = tuple(fields[key])
    if "prompt" in plan:
        fields["prompt_tokens"] = plan["prompt"]
    return fields


def estimated_bytes(entry: dict[str, Any], models: dict[str, Any]) -> float:
    """The estimate of the entry's statistic, in bytes."""
    plan, stat = entry["plan"], entry["statistic"]
    arch = architecture(plan["model"], models)
    hw = find_hardware(plan["on"])
    if plan["kind"] == "vllm":
        hw = replace(hw, memory_bytes=int(plan["total_gpu_memory_gib"] * GIB))
        ip = InferencePlan(runtime="vllm", gpu_memory_utilization=plan["gpu_memory_utilization"])
        # The log is vLLM V0 (2024-12): CUDA graphs were captured after the KV pool was sized.
        _, weights, acts, pool = vllm_pool(arch, ip, hw, plan.get("tp", 1),
                                           cudagraphs_in_budget=False)  # fmt: skip
        return {"vllm_weights": weights, "vllm_activation_peak": acts, "vllm_kv_cache": pool}[stat]
    if plan["kind"] == "train":
        est = estimate_training(arch, TrainingPlan(**_plan_fields(plan, TRAIN_KEYS)), hw)
    else:
        est = estimate_inference(arch, InferencePlan(**_plan_fields(plan, INFER_KEYS)), hw)
    return float({"allocated": est.allocated_bytes, "reserved": est.model_bytes,
                  "nvidia-smi": est.total_bytes}[stat])  # fmt: skip


def describe(p: dict[str, Any]) -> str:
    """A short name of the plan: model, shape and the options that differ from the defaults."""
    if p["kind"] == "vllm":
        return f"{p['model']} vllm tp{p.get('tp', 1)}"
    shape = (f"b{p['batch']} s{p['seq']}" if p["kind"] == "train"
             else f"b{p['batch']} p{p['prompt']}+{p['new_tokens']}")  # fmt: skip
    flags = [p.get("weights", p.get("dtype", "")), p.get("finetune", ""), p.get("optimizer", "")]
    if p.get("gpus", 1) > 1:
        flags.append(f"{p['gpus']}gpu {p.get('sharding', 'zero')}")
    if p.get("checkpointing"):
        flags.append("ckpt" + ("-" + p["checkpointing_policy"]
                               if p.get("checkpointing_policy", "full") != "full" else ""))  # fmt: skip
    flags += [f"loss-{p['loss']}" if p.get("loss") else "",
              "opt-in-bwd" if p.get("optimizer_in_backward") else "",
              "offload-" + "+".join(p["offload"]) if p.get("offload") else "",
              "compiled" if p.get("runtime") == "compiled" else "",
              p.get("quant_kernel", ""), "fused" if p.get("fuse_layers") else "",
              p.get("attention", "") if p["kind"] == "infer" else ""]  # fmt: skip
    return " ".join([p["model"], p["kind"], shape, *[f for f in flags if f and f != "full"]])


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for e in data["entries"]:
        published = e["value"] * (GIB if e["unit"] == "GiB" else GB)
        est = estimated_bytes(e, data.get("models", {}))
        what = describe(e["plan"])
        out.append({"id": e["id"], "stack": e["stack"], "what": what, "statistic": e["statistic"],
                    "published_gib": published / GIB, "estimated_gib": est / GIB,
                    "error": est / published - 1, "source": e["source"],
                    "settings": e["settings"]})  # fmt: skip
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in table]
    return {"count": len(errors), "median_abs_error": statistics.median(errors),
            "worst_abs_error": max(errors),
            "within_15pct": sum(e <= 0.15 for e in errors)}  # fmt: skip


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    data = json.loads(path.read_text())
    table = rows(data)
    for r in table:
        print(f"{r['id']}  {r['stack']:<12} {r['what']:<60} {r['statistic']:<21} "
              f"pub {r['published_gib']:8.2f} GiB  est {r['estimated_gib']:8.2f} GiB  "
              f"err {r['error']:+7.1%}")  # fmt: skip
    s = summary(table)
    by_stack = {k: summary([r for r in table if r["stack"] == k])
                for k in sorted({r["stack"] for r in table})}  # fmt: skip
    print(f"memory (published): median |error| {s['median_abs_error']:.1%}, worst "
          f"{s['worst_abs_error']:.1%} over {s['count']} entries")  # fmt: skip
    OUT.write_text(json.dumps({"data": DATA.name, "summary": s, "by_stack": by_stack,
                               "rows": table}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
