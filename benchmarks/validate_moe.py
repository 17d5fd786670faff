"""Mixture-of-experts decode vs published runs (docs/speed.md, "Mixture of experts").

Each entry of benchmarks/data/moe_measurements.json is estimated as
`gpuwise infer MODEL --on DEVICE --runtime RT --batch B --prompt P --new-tokens N --tp TP --json`
gives it, from the datasheet with the default efficiencies. Entries marked "fit" set llama.cpp's
[ggml.cuda] expert_memory (runtime_speed.toml); the rest are held out, and the medians say which.
vLLM's moe_layer_s is fitted to no entry here (fused_moe kernel runs, docs/speed.md). error =
estimated / published - 1 for tokens/s, published / estimated - 1 for a request's latency
(`e2e_latency_s`: infer's generate_s): + always means the estimate is faster.

Mappings: gpt-fast (torch.compile) -> `compiled`; llama.cpp CUDA -> `llama.cpp`. A100 SXM 80GB
(power-limited to 330 W, as gpt-fast's other entries in ../shared/validation/published.json)
-> a100-sxm-80gb; RTX 3090 -> rtx-3090. Mixtral-8x7B-Instruct -> mixtral-8x7b (same shapes);
DeepSeek-V2-Lite (llama.cpp's "deepseek2 16B") -> deepseek-v2-lite. Weights: int8 weight-only
-> int8, bf16 -> bf16, Q4_0 -> q4_0, the ggml-org gpt-oss GGUF -> mxfp4. vLLM on an "A100"
(80 GB, form not stated) -> a100-sxm-80gb. An entry's `options` are gpuwise's flags for the
run's own (llama-server --n-cpu-moe 36 -> --n-cpu-moe 36); such a run's host is the catalogue
cloud host infer takes for a catalogue GPU (100 GB/s), not the poster's desktop, and a GPU the
post does not name is estimated as an RTX 3090 (the experts on the host set its decode). A llama-bench pp512 run at microbatch N is N tokens a
step at a mean context of 256: a decode step of batch N at a prompt of 256.

Run:  .venv/bin/python benchmarks/validate_moe.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from public_cli import gpuwise_json

DATA = Path(__file__).resolve().parent / "data" / "moe_measurements.json"
RUNTIMES = {"torch-compile": "compiled", "llama.cpp-cuda": "llama.cpp", "vllm": "vllm"}
DEVICES = {"A100 SXM 80GB (330 W)": "a100-sxm-80gb", "RTX 3090 24GB": "rtx-3090",
           "A100 80GB": "a100-sxm-80gb",
           "CUDA GPU, unstated (about 8 GB of it used); Core i9-14900K host": "rtx-3090"}
MODELS = {"Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
          "DeepSeek-V2-Lite (deepseek2 16B)": "deepseek-v2-lite", "gpt-oss-120b": "gpt-oss-120b",
          "Qwen3-30B-A3B": "qwen3-30b-a3b"}
WEIGHTS = {"int8 (weight-only)": "int8", "bf16": "bf16", "Q4_0": "q4_0",
           "MXFP4 (ggml-org GGUF)": "mxfp4"}


def group(e: dict) -> str:
    """The rows a median is taken over: by runtime, expert offload apart."""
    offload = any(o in ("--cpu-moe", "--n-cpu-moe") for o in e.get("options", ()))
    return RUNTIMES[e["runtime"]] + (" --n-cpu-moe" if offload else "")


def estimate(e: dict) -> float:
    """tokens/s of decode, or seconds of the whole request for `e2e_latency_s`."""
    t = gpuwise_json("infer", MODELS[e["model"]], "--on", DEVICES[e["device"]],
                     "--runtime", RUNTIMES[e["runtime"]], "--weights", WEIGHTS[e["weights"]],
                     "--batch", str(e["batch"]), "--prompt", str(e["prompt_tokens"]),
                     "--new-tokens", str(e["output_tokens"]), "--tp", str(e["tensor_parallel"]),
                     *e.get("options", ()))
    if e["quantity"] == "e2e_latency_s":
        return t["time"]["generate_s"]
    return e["batch"] / t["time"]["decode_s_per_token"]


def error(e: dict, est: float) -> float:
    """+ where the estimate is faster than the run."""
    return e["value"] / est - 1 if e["quantity"] == "e2e_latency_s" else est / e["value"] - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = []
    print(f"{'id':7s} {'runtime':10s} {'device':14s} {'model':17s} {'wts':5s} {'batch':>5s} "
          f"{'tp':>3s} {'published':>9s} {'estimated':>9s} {'err':>6s}")
    for e in json.loads(DATA.read_text())["entries"]:
        est = estimate(e)
        err = error(e, est)
        rows.append({"id": e["id"], "model": MODELS[e["model"]], "device": DEVICES[e["device"]],
                     "runtime": RUNTIMES[e["runtime"]], "weights": WEIGHTS[e["weights"]],
                     "batch": e["batch"], "tp": e["tensor_parallel"], "group": group(e),
                     "fit": bool(e.get("fit")), "quantity": e["quantity"],
                     "published": e["value"],
                     "estimated": est, "error": err})
        print(f"{e['id']:7s} {RUNTIMES[e['runtime']]:10s} {DEVICES[e['device']]:14s} "
              f"{MODELS[e['model']]:17s} {WEIGHTS[e['weights']]:5s} {e['batch']:5d} "
              f"{e['tensor_parallel']:3d} {e['value']:9.4g} {est:9.4g} {100 * err:+5.0f}%")
    for name in sorted({r["group"] for r in rows}):
        for fit, label in ((True, "fitted"), (False, "held out")):
            errors = [abs(r["error"]) for r in rows if r["group"] == name and r["fit"] == fit]
            if errors:
                print(f"{name:22s} {label:8s} median |error| "
                      f"{100 * statistics.median(errors):5.1f}% over {len(errors)}")
    held = [r for r in rows if not r["fit"]]
    errs = [abs(r["error"]) for r in held]
    worst = max(held, key=lambda r: abs(r["error"]))
    print(f"\nheld out: median |error| {100 * statistics.median(errs):.1f}% over {len(held)} "
          f"entries; worst {100 * worst['error']:+.1f}% ({worst['id']})")
    if args.json:
        args.json.write_text(json.dumps({"data": DATA.name, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
