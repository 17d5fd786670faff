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

The train and infer entries are estimated as users run it: `gpuwise train|infer MODEL --on
DEVICE` with the plan's options, `--json` (a model the data file describes goes in as a
config.json in a temporary folder). The vLLM entries still call the vLLM memory model
directly: `infer --runtime vllm` has no per-GPU memory under --tp and no choice of vLLM V0's
CUDA graphs outside the budget (issue 37, item 4: what is left).

Nothing is fitted to these entries. error = estimated / published - 1.

Run:  .venv/bin/python benchmarks/validate_published_memory.py
      (writes benchmarks/results/memory_published.json)
Target (issue 24): median |error| <= 5%, worst <= 15%.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from public_cli import gpuwise_json

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.memory.serving_runtimes import vllm_pool
from gpuwise.workload import Architecture, from_config
from gpuwise.workload.plans import InferencePlan

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "memory_measurements.json"
OUT = ROOT / "results" / "memory_published.json"
GIB, GB = 1024**3, 1e9
# The plan's keys that are not a command's options: what the entry is, its device, notes.
NOT_OPTIONS = {"kind", "model", "on", "weights_dtype_note", "total_gpu_memory_gib"}
# Plan keys whose option is named otherwise.
OPTION_NAME = {"context_alloc": "ctx"}
# Boolean plan keys whose option has a --no- form (their default is on).
ON_BY_DEFAULT = {"kbit_prepare", "reshard_after_forward", "double_quant"}


def architecture(name: str, models: dict[str, Any]) -> Architecture:
    """A catalogue model, or one the data file describes (with its source)."""
    spec = models.get(name)
    if spec is None:
        return from_config(resolve_model(name).config)
    return from_config(model_config(spec))


def model_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The config.json of a model the data file describes: its own, or a catalogue model's
    with the keys it overrides."""
    if "config" in spec:
        return dict(spec["config"])
    config = dict(resolve_model(spec["catalog"]).config)
    config.update(spec.get("override", {}))
    return config


def model_argument(name: str, models: dict[str, Any], folder: Path) -> str:
    """MODEL as the command takes it: a catalogue name, or a config.json written to `folder`."""
    if name not in models:
        return name
    path = folder / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model_config(models[name])))
    return str(path)


def options(plan: dict[str, Any]) -> list[str]:
    """The command-line options of the plan's fields."""
    out = []
    for key, value in plan.items():
        if key in NOT_OPTIONS:
            continue
        flag = "--" + OPTION_NAME.get(key, key).replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else ([f"--no-{flag[2:]}"] if key in ON_BY_DEFAULT else [])
        elif isinstance(value, list):
            out += [flag, ",".join(value)]
        else:
            out += [flag, str(value)]
    return out


def vllm_bytes(entry: dict[str, Any], models: dict[str, Any]) -> float:
    """A vLLM entry's statistic, from the vLLM memory model (see the docstring)."""
    plan, stat = entry["plan"], entry["statistic"]
    arch = architecture(plan["model"], models)
    hw = replace(find_hardware(plan["on"]), memory_bytes=int(plan["total_gpu_memory_gib"] * GIB))
    ip = InferencePlan(runtime="vllm", gpu_memory_utilization=plan["gpu_memory_utilization"])
    # The log is vLLM V0 (2024-12): CUDA graphs were captured after the KV pool was sized.
    _, weights, acts, pool = vllm_pool(arch, ip, hw, plan.get("tp", 1),
                                       cudagraphs_in_budget=False)
    return {"vllm_weights": weights, "vllm_activation_peak": acts, "vllm_kv_cache": pool}[stat]


def estimated_bytes(entry: dict[str, Any], models: dict[str, Any], folder: Path) -> float:
    """The estimate of the entry's statistic, in bytes: `gpuwise train|infer ... --json`."""
    plan, stat = entry["plan"], entry["statistic"]
    if plan["kind"] == "vllm":
        return vllm_bytes(entry, models)
    memory = gpuwise_json(plan["kind"], model_argument(plan["model"], models, folder), "--on",
                          plan["on"], *options(plan))["memory"]
    key = {"allocated": "allocated_bytes", "reserved": "model_bytes", "nvidia-smi": "total_bytes"}
    return float(memory[key[stat]])


def describe(p: dict[str, Any]) -> str:
    """A short name of the plan: model, shape and the options that differ from the defaults."""
    if p["kind"] == "vllm":
        return f"{p['model']} vllm tp{p.get('tp', 1)}"
    shape = (f"b{p['batch']} s{p['seq']}" if p["kind"] == "train"
             else f"b{p['batch']} p{p['prompt']}+{p['new_tokens']}")
    flags = [p.get("weights", p.get("dtype", "")), p.get("finetune", ""), p.get("optimizer", "")]
    if p.get("gpus", 1) > 1:
        flags.append(f"{p['gpus']}gpu {p.get('sharding', 'zero')}")
    if p.get("checkpointing"):
        flags.append("ckpt" + ("-" + p["checkpointing_policy"]
                               if p.get("checkpointing_policy", "full") != "full" else ""))
    flags += [f"loss-{p['loss']}" if p.get("loss") else "",
              "opt-in-bwd" if p.get("optimizer_in_backward") else "",
              "offload-" + "+".join(p["offload"]) if p.get("offload") else "",
              "compiled" if p.get("runtime") == "compiled" else "",
              p.get("quant_kernel", ""), "fused" if p.get("fuse_layers") else "",
              p.get("attention", "") if p["kind"] == "infer" else ""]
    return " ".join([p["model"], p["kind"], shape, *[f for f in flags if f and f != "full"]])


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="gpuwise-published-memory-") as tmp:
        estimates = [estimated_bytes(e, data.get("models", {}), Path(tmp)) for e in data["entries"]]
    for e, est in zip(data["entries"], estimates, strict=True):
        published = e["value"] * (GIB if e["unit"] == "GiB" else GB)
        what = describe(e["plan"])
        out.append({"id": e["id"], "stack": e["stack"], "what": what, "statistic": e["statistic"],
                    "published_gib": published / GIB, "estimated_gib": est / GIB,
                    "error": est / published - 1, "source": e["source"],
                    "settings": e["settings"]})
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in table]
    return {"count": len(errors), "median_abs_error": statistics.median(errors),
            "worst_abs_error": max(errors),
            "within_15pct": sum(e <= 0.15 for e in errors)}


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    data = json.loads(path.read_text())
    table = rows(data)
    for r in table:
        print(f"{r['id']}  {r['stack']:<12} {r['what']:<60} {r['statistic']:<21} "
              f"pub {r['published_gib']:8.2f} GiB  est {r['estimated_gib']:8.2f} GiB  "
              f"err {r['error']:+7.1%}")
    s = summary(table)
    by_stack = {k: summary([r for r in table if r["stack"] == k])
                for k in sorted({r["stack"] for r in table})}
    print(f"memory (published): median |error| {s['median_abs_error']:.1%}, worst "
          f"{s['worst_abs_error']:.1%} over {s['count']} entries")
    OUT.write_text(json.dumps({"data": DATA.name, "summary": s, "by_stack": by_stack,
                               "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
