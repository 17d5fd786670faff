"""The runtimes' time models vs published measurements (docs/speed.md, "Runtimes other than
transformers, against published runs").

Each entry of benchmarks/data/runtime_measurements.json whose device and model map to catalogue
entries (tables below) is estimated as `gpuwise infer MODEL --on DEVICE --runtime RT --json`
gives it (the datasheet with the default efficiencies): once with its own runtime's time model (RUNTIME_OF: llama.cpp, vLLM, SGLang,
torch.compile; AutoAWQ and ExLlama as `compiled` with their kernels) and once with
`transformers` (eager), the model every runtime had before. Some runtime constants were set
from some of these entries: catalog/data/runtime_speed.toml names them ("calibrated on
rm-NNN"); the others set nothing. `--json` writes the rows that tools/write_time_intervals.py
turns into the 80% intervals.

Run:  .venv/bin/python benchmarks/validate_runtimes.py [--json OUT]

error = estimated / published - 1 on the entry's own quantity: for rates (tokens/s) + means the
estimate is faster than measured; for times (tpot_ms, e2e_latency_s) + means slower.

Device mapping (entry's device string -> catalogue id). `*`: the source does not state the form
factor or memory size; the SXM 80GB part is assumed.

  RTX 3090 24GB, 1x RTX 3090                          -> rtx-3090
  RTX 4090 24GB, RTX 4090, 1x RTX 4090, stock RTX 4090,
    NVIDIA GeForce RTX 4090                           -> rtx-4090
  A100 PCIe 80GB                                      -> a100-pcie-80gb
  A100 SXM 80GB, NVIDIA A100-SXM4-80GB                -> a100-sxm-80gb
  A100 (single GPU), 1x A100 (80GB), A100 (80GB) x64  -> a100-sxm-80gb *
  H100 PCIe 80GB                                      -> h100-pcie
  H100 SXM 80GB (DGX H100) [, 2 GPUs]                 -> h100-sxm
  H100, H100 (1 GPU), H100 (4 GPUs), 2x H100,
    NVIDIA H100                                       -> h100-sxm *
  H200 SXM 141GB (DGX H200)                           -> h200-sxm
  NVIDIA B200                                         -> b200
  L40S 48GB                                           -> l40s
  M2 Ultra 76-Core GPU 192GB                          -> m2-ultra
  M2 Ultra (core count not stated; 800 GB/s either way) -> m2-ultra *
  M3 Max 40-Core GPU 64GB                             -> m3-max (catalogue: 40-core 128GB; same
                                                         GPU and 400 GB/s, memory size only)
  Not in the catalogue (skipped): RTX 3090 Ti, RTX A6000, RTX 6000 Ada, A40, Tesla P40,
  RTX 2080 Ti, M1 Max, M1 Ultra, H100 96GB HBM2e.

Model mapping (entry's model -> catalogue id; only identical layer shapes and vocabularies):

  Llama 3.1 8B (all spellings, Instruct)        -> llama-3.1-8b   exact
  Llama 3 8B / Meta-Llama-3-8B                  -> llama-3.1-8b   same shapes; 3.1 adds rope
                                                                   scaling and 128k positions
  Llama 3 70B                                   -> llama-3.1-70b  same, as for 8B
  Llama 3.3 70B (Instruct)                      -> llama-3.1-70b  identical config
  Llama 2 7B (all spellings)                    -> llama-2-7b     exact
  llama 7B / Llama 7B (LLaMA-1 or 2, 6.74 B)    -> llama-2-7b     same shapes; LLaMA-1 has 2048
                                                                   positions
  Vicuna 7B, Vicuna 7B v1.5                     -> llama-2-7b     fine-tune, same shapes
  Llama 2 13B                                   -> llama-2-13b    exact
  Llama 13B (LLaMA-1)                           -> llama-2-13b    same shapes; 2048 positions
  Llama 2 70B                                   -> llama-2-70b    exact
  Mistral 7B (AutoAWQ 0.1.6, Oct 2023: v0.1)    -> mistral-7b     exact
  Mistral 7B Instruct, Mistral-7B-Instruct-v0.2 -> mistral-7b     same shapes and vocab; v0.2
                                                                   has rope theta 1e6 and no
                                                                   sliding window (no effect
                                                                   below 4096 tokens)
  TinyLlama 1.1B                                -> tinyllama-1.1b same shapes
  Llama 3.2 3B Instruct                         -> llama-3.2-3b   exact
  Not mapped (skipped): CodeLlama 7B (vocab 32016, no catalogue entry), llama.cpp "llama 3B"
  (an OpenLLaMA-3B-style model, no catalogue entry).

Weights: Q4_K_M, Q4_0, int4 AWQ/GPTQ/Marlin/tinygemm, EXL2 4.0 bpw -> int4; Q8_0, int8
weight-only -> int8; F16 -> fp16; bf16 -> bf16; fp8 -> fp8. EXL2 2.5 bpw: no catalogue format,
skipped.

Lengths: as the entry states. llama-bench `tg N` (prompt 0) is a prompt of 1 token and N new
tokens; `pp N` is a prompt of N. Not stated: batch 1, and llama-bench's defaults (pp512, tg128:
a prefill of 512 tokens, or 128 tokens generated from a 1-token prompt). ExLlama v1 (rm-085,
rm-086) states a 2048-token sequence in its settings: prompt 1920 + 128 generated, and a
2048-token prompt.

Quantities: decode_tokens_per_s = batch / decode_s_per_token; prefill_tokens_per_s = batch x
prompt / prefill_s; tpot_ms = decode_s_per_token; e2e_latency_s (vLLM benchmark_latency, one
whole batch) = prefill + new_tokens decode steps (`InferenceTime.total_s`). Throughput only where
the whole batch is offered at once with fixed lengths (vLLM `bench throughput` and
`benchmark_throughput` runs): output tokens/s = batch x new / total_s, total tokens/s = batch x
(prompt + new) / total_s; the torchao table's "prefill toks/s" column is read as vLLM's total
tokens/s of the prefill run and "decode toks/s" as output tokens/s of the decode run.
Serving benchmarks (scheduler-chosen batches, mixed lengths), TensorRT-LLM max-throughput runs
(batch not stated) and training entries are skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from public_cli import gpuwise_json

DATA = Path(__file__).resolve().parent / "data" / "runtime_measurements.json"
MODEL_RUNTIMES = ("runtime", "transformers")
# The entry's runtime -> (gpuwise --runtime, --quant-kernel). AutoAWQ's fused modules and
# ExLlama run without transformers' per-op Python dispatch: the dispatch-free roofline
# (`compiled`) with their own kernels stands in. TensorRT-LLM has no time model (skipped).
RUNTIME_OF = {"llama.cpp-cuda": ("llama.cpp", ""), "llama.cpp-metal": ("llama.cpp", ""),
              "vllm": ("vllm", ""), "sglang": ("sglang", ""), "marlin": ("vllm", "marlin"),
              "awq": ("compiled", "awq-gemm"), "exllama": ("compiled", "exllama"),
              "torch-compile": ("compiled", "")}

DEVICES = {
    "RTX 3090 24GB": "rtx-3090", "1x RTX 3090": "rtx-3090",
    "RTX 4090 24GB": "rtx-4090", "RTX 4090": "rtx-4090", "1x RTX 4090": "rtx-4090",
    "stock RTX 4090": "rtx-4090", "NVIDIA GeForce RTX 4090": "rtx-4090",
    "A100 PCIe 80GB": "a100-pcie-80gb",
    "A100 SXM 80GB": "a100-sxm-80gb", "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "A100 (single GPU)": "a100-sxm-80gb*", "1x A100 (80GB)": "a100-sxm-80gb*",
    "A100 (80GB), 64 GPUs": "a100-sxm-80gb*",
    "H100 PCIe 80GB": "h100-pcie",
    "H100 SXM 80GB (DGX H100)": "h100-sxm", "H100 SXM 80GB (DGX H100), 2 GPUs": "h100-sxm",
    "H100": "h100-sxm*", "H100 (1 GPU)": "h100-sxm*", "H100 (4 GPUs)": "h100-sxm*",
    "2x H100": "h100-sxm*", "NVIDIA H100": "h100-sxm*",
    "H200 SXM 141GB (DGX H200)": "h200-sxm",
    "NVIDIA B200": "b200",
    "L40S 48GB": "l40s",
    "M2 Ultra 76-Core GPU 192GB": "m2-ultra", "M2 Ultra": "m2-ultra*",
    "M3 Max 40-Core GPU 64GB": "m3-max",
}

MODELS = {
    "Llama 3.1 8B": "llama-3.1-8b", "Llama3.1-8B": "llama-3.1-8b",
    "Llama-3.1-8B": "llama-3.1-8b", "Llama 3.1 8B Instruct": "llama-3.1-8b",
    "Llama 3 8B (Meta-Llama-3-8B)": "llama-3.1-8b", "Llama 3 8B": "llama-3.1-8b",
    "Llama-3-8B (meta-llama/Meta-Llama-3-8B)": "llama-3.1-8b",
    "Llama 3 70B": "llama-3.1-70b", "Llama3.3-70B": "llama-3.1-70b",
    "Llama 3.3 70B Instruct": "llama-3.1-70b",
    "LLaMA 2 7B": "llama-2-7b", "Llama 2 7B": "llama-2-7b",
    "Llama-2-7B (meta-llama/Llama-2-7b-chat-hf)": "llama-2-7b",
    "llama 7B (6.74 B params)": "llama-2-7b", "llama 7B": "llama-2-7b", "Llama 7B": "llama-2-7b",
    "Vicuna 7B": "llama-2-7b",
    "Vicuna 7B v1.5 (IlyasMoutawwakil/vicuna-7b-v1.5-awq-gemm)": "llama-2-7b",
    "Llama 2 13B (llama 13B, 13.02 B params)": "llama-2-13b", "Llama 2 13B": "llama-2-13b",
    "Llama 13B": "llama-2-13b",
    "Llama 2 70B": "llama-2-70b",
    "Mistral 7B": "mistral-7b", "Mistral 7B Instruct": "mistral-7b",
    "Mistral-7B-Instruct-v0.2 (TheBloke/Mistral-7B-Instruct-v0.2-AWQ)": "mistral-7b",
    "TinyLlama 1.1B (llama 1B, 1.10 B params)": "tinyllama-1.1b",
    "Llama 3.2 3B Instruct (llama 3B, 3.21 B params)": "llama-3.2-3b",
}

UNMAPPED_MODELS = {
    "CodeLlama 7B (llama 7B, 6.74 B params)": "CodeLlama 7B: vocab 32016, no catalogue entry",
    "llama 3B": "llama.cpp 'llama 3B' (OpenLLaMA-3B style): no catalogue entry",
}

# The phase whose time each quantity measures ("any": prefill and decode together).
PHASE_OF = {"decode_tokens_per_s": "decode", "tpot_ms": "decode", "prefill_tokens_per_s": "prefill"}
# llama.cpp's types as the other runtimes' formats of the same bits.
GENERIC = {"q4_k_m": "int4", "q4_0": "int4", "q8_0": "int8"}
# (prompt_tokens, new_tokens) read from the entry's settings where the fields are null.
LENGTHS_FROM_SETTINGS = {"rm-085": (1920, 128), "rm-086": (2048, 0)}
# Throughput entries whose whole batch is offered at once with fixed lengths: which count.
THROUGHPUT = {"rm-054": "total", "rm-058": "total", "rm-060": "total", "rm-062": "total",
              "rm-064": "total", "rm-059": "output", "rm-061": "output", "rm-063": "output",
              "rm-065": "output"}
BATCH_FROM_SETTINGS = {"rm-054": 100, "rm-058": 32, "rm-060": 32, "rm-062": 32, "rm-064": 32,
                       "rm-059": 128, "rm-061": 128, "rm-063": 128, "rm-065": 128}


def weights(text: str) -> str | None:
    t = text.lower()
    if "2.5 bpw" in t:
        return None
    for ggml in ("q4_k_m", "q4_0", "q8_0"):  # llama.cpp's own types
        if t.startswith(ggml):
            return ggml
    if t.startswith("int4") or "4.0 bpw" in t:
        return "int4"
    if t.startswith("int8"):
        return "int8"
    if t.startswith("f16"):
        return "fp16"
    for fmt in ("bf16", "fp8"):
        if t.startswith(fmt):
            return fmt
    return None


def skip_reason(e: dict) -> str | None:
    if e["quantity"] == "train_tokens_per_s_per_gpu":
        return "training (no inference estimate applies)"
    if e["runtime"] not in RUNTIME_OF:
        return f"no time model for {e['runtime']}"
    if e["quantity"] == "throughput_tokens_per_s" and e["id"] not in THROUGHPUT:
        return "throughput at a scheduler-chosen or unstated batch: not directly comparable"
    if e["device"] not in DEVICES:
        return f"device not in the catalogue: {e['device']}"
    if e["model"] in UNMAPPED_MODELS:
        return UNMAPPED_MODELS[e["model"]]
    if e["model"] not in MODELS:
        return f"model not mapped: {e['model']}"
    if weights(e["weights"]) is None:
        return f"weights without a catalogue format: {e['weights']}"
    return None


def lengths(e: dict) -> tuple[int, int, int]:
    """(batch, prompt_tokens, new_tokens) for the plan."""
    batch = e["batch"] or BATCH_FROM_SETTINGS.get(e["id"], 1)
    if e["id"] in LENGTHS_FROM_SETTINGS:
        prompt, new = LENGTHS_FROM_SETTINGS[e["id"]]
        return batch, prompt, new
    prompt, new = e["prompt_tokens"], e["output_tokens"]
    if e["quantity"] == "prefill_tokens_per_s":
        return batch, prompt or 512, new or 0
    if e["quantity"] in ("decode_tokens_per_s", "tpot_ms"):
        return batch, max(1, prompt or 0), new or 128
    return batch, prompt or 512, new or 128


def infer_time(e: dict, runtime: str) -> dict:
    """The time record of `gpuwise infer` for the entry's plan under `runtime` ("runtime": the
    entry's own time model and kernel; "transformers": eager)."""
    batch, prompt, new = lengths(e)
    kernel = ""
    if runtime == "runtime":
        runtime, kernel = RUNTIME_OF[e["runtime"]]
    wts = weights(e["weights"]) or ""
    if runtime != "llama.cpp":
        wts = GENERIC.get(wts, wts)
    return gpuwise_json("infer", MODELS[e["model"]], "--on", DEVICES[e["device"]].rstrip("*"),
                        "--batch", str(batch), "--prompt", str(prompt), "--new-tokens", str(new),
                        "--weights", wts, "--runtime", runtime, "--quant-kernel", kernel,
                        "--tp", str(e["tensor_parallel"] or 1))["time"]


def estimate(e: dict, runtime: str) -> float:
    """The entry's quantity from the estimate."""
    batch, prompt, new = lengths(e)
    t = infer_time(e, runtime)
    q = e["quantity"]
    if q == "decode_tokens_per_s":
        return batch / t["decode_s_per_token"]
    if q == "prefill_tokens_per_s":
        return batch * prompt / t["prefill_s"]
    if q == "tpot_ms":
        return 1000 * t["decode_s_per_token"]
    if q == "e2e_latency_s":
        return t["generate_s"]
    counted = new if THROUGHPUT[e["id"]] == "output" else prompt + new
    return batch * counted / t["generate_s"]


def quantity_label(e: dict) -> str:
    if e["quantity"] == "throughput_tokens_per_s":
        return f"throughput_{THROUGHPUT[e['id']]}"
    return e["quantity"]


def summarise(rows: list[dict], key: str) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    groups["all"] = rows
    out = []
    for name, rs in groups.items():
        entry: dict = {"group": name, "count": len(rs)}
        for rt in MODEL_RUNTIMES:
            errs = [r["error"][rt] for r in rs]
            worst = max(rs, key=lambda r, rt=rt: abs(r["error"][rt]))
            entry[rt] = {"median_error": statistics.median(errs),
                         "median_abs_error": statistics.median(abs(x) for x in errs),
                         "worst": worst["error"][rt], "worst_id": worst["id"]}
        out.append(entry)
    return out


def print_summary(title: str, summary: list[dict]) -> None:
    print(f"\n{title:22s} {'n':>3s}  {'runtime: median':>16s} {'med|err|':>8s} {'worst':>8s}"
          f"  {'eager: median':>13s} {'med|err|':>8s} {'worst':>8s}")
    for s in summary:
        c, t = s["runtime"], s["transformers"]
        print(f"{s['group']:22s} {s['count']:3d}  {100 * c['median_error']:+15.0f}% "
              f"{100 * c['median_abs_error']:7.0f}% {100 * c['worst']:+7.0f}%  "
              f"{100 * t['median_error']:+12.0f}% {100 * t['median_abs_error']:7.0f}% "
              f"{100 * t['worst']:+7.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write rows, summaries and skips here")
    args = parser.parse_args()
    entries = json.loads(DATA.read_text())["entries"]
    rows, skipped = [], []
    for e in entries:
        reason = skip_reason(e)
        if reason:
            skipped.append({"id": e["id"], "runtime": e["runtime"], "reason": reason})
            continue
        est = {rt: estimate(e, rt) for rt in MODEL_RUNTIMES}
        batch, prompt, new = lengths(e)
        rows.append({"id": e["id"], "runtime": e["runtime"], "model_runtime": RUNTIME_OF[e["runtime"]][0],
                     "phase": PHASE_OF.get(e["quantity"], "any"), "device": DEVICES[e["device"]],
                     "model": MODELS[e["model"]], "weights": weights(e["weights"]),
                     "tp": e["tensor_parallel"] or 1, "batch": batch, "prompt": prompt,
                     "new": new, "quantity": quantity_label(e), "published": e["value"],
                     "estimated": est,
                     "error": {rt: v / e["value"] - 1 for rt, v in est.items()}})

    print(f"{'id':7s} {'runtime':15s} {'device':15s} {'model':14s} {'wts':5s} {'b/p/n':13s} "
          f"{'quantity':21s} {'published':>9s} {'runtime':>9s} {'err':>6s} {'eager':>9s} "
          f"{'err':>6s}")
    for r in rows:
        shape = f"{r['batch']}/{r['prompt']}/{r['new']}" + (f" tp{r['tp']}" if r["tp"] > 1 else "")
        print(
            f"{r['id']:7s} {r['runtime']:15s} {r['device']:15s} {r['model']:14s} "
            f"{r['weights']:5s} {shape:13s} {r['quantity']:21s} {r['published']:9.4g} "
            f"{r['estimated']['runtime']:9.4g} {100 * r['error']['runtime']:+5.0f}% "
            f"{r['estimated']['transformers']:9.4g} {100 * r['error']['transformers']:+5.0f}%"
        )
    by_runtime, by_quantity = summarise(rows, "runtime"), summarise(rows, "quantity")
    print_summary("by runtime", by_runtime)
    print_summary("by quantity", by_quantity)
    print(f"\n{len(rows)} entries estimated, {len(skipped)} skipped:")
    for s in skipped:
        print(f"  {s['id']} {s['runtime']:15s} {s['reason']}")
    if args.json:
        args.json.write_text(json.dumps({"data": str(DATA.name), "rows": rows,
                                         "by_runtime": by_runtime, "by_quantity": by_quantity,
                                         "skipped": skipped}, indent=1) + "\n")


if __name__ == "__main__":
    main()
