"""`gpuwise serve` vs published serving and energy measurements (issue 23; the data and its
reading rules: benchmarks/data/serving_README.md).

Each serving entry of benchmarks/data/serving_measurements.json whose runtime has a time model
and whose device and model map to catalogue entries (tables below) is run through the public
path, `gpuwise serve ... --trace FILE [--concurrency C] --json` in this process
(benchmarks/public_cli.py), as its source describes the run: the runtime's scheduler (vLLM: V1
mixed steps with chunked prefill; SGLang: prefill-first; `--no-overlap-schedule` for SGLang
0.3), the catalogue device's datasheet rates with default efficiencies, the stated tensor
parallelism (`--tp`, `--gpus`), `--gpu-memory-utilization`, `--ctx` (max_model_len),
`--max-batched-tokens`, `--kv-dtype` and load, written to the trace: Poisson arrivals at the
stated rate, every request at t=0 (`"request_rate": "inf"`), or C clients in a closed loop. Each request
count is the source's own (the whole run takes well under two minutes). Every quantity the source
gives among TTFT, TPOT, ITL and E2E (mean, p50, p99: like with like), output tokens/s, total
tokens/s and requests/s is compared: error = simulated / published - 1 (+: the simulation is
slower for times, faster for rates). Nothing in gpuwise is tuned to these entries; this is a
check.

Run:  .venv/bin/python benchmarks/validate_serving.py [--json OUT] [--spread exp|normal]

Simulated figures: `serve --json`'s means and nearest-rank percentiles. TPOT per request = (done - first token) / (output - 1) as the
benchmarks define it; ITL is the step lengths, each counted once for every token it delivered
(the benchmarks pool the gaps between streamed chunks); throughput is over first arrival to
last completion, as benchmark_serving and bench_serving count it.

Device mapping (the entry's device -> catalogue id). `*`: the form factor or memory is not
stated; the SXM part is assumed.

  NVIDIA A100-SXM4-40GB                                 -> a100-sxm-40gb
  NVIDIA A100 80GB (SGLang benchmark_vllm_060)          -> a100-sxm-80gb *
  NVIDIA A100 PCIe 80GB (dennislee22/vLLM-benchmarking: "A100 80GB", the PCIe card
    inferred from the same cluster's logs; the entries' `device_inferred`)
                                                        -> a100-pcie-80gb *
  NVIDIA H100 80GB (SGLang benchmark_vllm_060, x4; the evalscope blog, x1)
                                                        -> h100-sxm *
  NVIDIA H100 (single GPU; vLLM FP8 KV-cache blog)      -> h100-sxm *
  NVIDIA H100 80GB HBM3 (ML.ENERGY; HBM3 is the SXM5)   -> h100-sxm
  NVIDIA H200 141GB (datacrunch)                        -> h200-sxm
  NVIDIA B200 (ML.ENERGY; memory not stated)            -> b200 *
  NVIDIA H100 SXM (a Qwen3 entry's "single H100 SXM GPU")  -> h100-sxm *
  Not simulated: NIM's, and an A100 whose memory the source leaves open.

Model mapping (only identical layer shapes and vocabularies):

  Llama-3.1-8B(-Instruct), Meta-Llama-3.1-8B-Instruct   -> llama-3.1-8b   exact
  Meta-Llama-3-8B-Instruct                              -> llama-3.1-8b   same shapes; 3.1 adds
                                                                          rope scaling, 128k pos.
  Llama-3.1-70B-Instruct, Meta-Llama-3.1-70B-Instruct   -> llama-3.1-70b  exact
  Meta-Llama-3-70B-Instruct                             -> llama-3.1-70b  same, as for 8B
  Llama-3.3-70B-Instruct                                -> llama-3.1-70b  identical config
  Qwen2-7B-Instruct                                     -> qwen2.5-7b     same shapes (hidden
                                                                          3584, 28 layers, 28/4
                                                                          heads, FFN 18944, vocab
                                                                          152064)
  Qwen3-8B, Qwen3-14B                                   -> qwen3-8b, qwen3-14b  exact (catalogue
                                                                          since the families of
                                                                          2025 were added)

Runtimes. vLLM -> `vllm` (V1 mixed steps), SGLang -> `sglang` (prefill-first). NVIDIA NIM
(TensorRT-LLM or vLLM profile, not stated): no time model, skipped. gpuwise models vLLM's V1
engine and SGLang from v0.4 (the overlap scheduler); entries from older engines are simulated
the same way and reported apart, in `group`:

  current  vLLM V1 (0.8 and later; the FP8 KV-cache blog compares 0.10.2 and 0.19.1, both V1;
           the evalscope blog's "vLLM V1 v0.9.0"; dennislee22's 0.10.1.1, whose startup log
           says "Initializing a V1 LLM engine"), SGLang v0.4 era (datacrunch's Dec 2024 dev
           image; the evalscope blog's v0.4.9), ML.ENERGY v3 (vLLM 0.11.1)
  older    vLLM 0.6.0 with `--num-scheduler-steps 10` (V0 multi-step: 10 decode steps per
           schedule, tokens streamed in bursts, so TTFT and ITL far above TPOT; gpuwise has no
           multi-step), vLLM 0.4.2 (V0, no chunked prefill: prompts scheduled before decodes,
           which is closer to SGLang's policy than to V1's), SGLang 0.3.0 (before the overlap
           scheduler), ML.ENERGY v2 (vLLM 0.5.4, V0)

Lengths (`lengths` in each row: stated, derived or assumed):

  random, fixed            the stated lengths (vLLM `--dataset-name random`, range ratio 0)
  random, SGLang           bench_serving with --random-range-ratio 0.0 draws each length
                           uniformly from 1 to the stated maximum (parsed from `settings`); the
                           derived means in `totals` confirm it (509 of 1024)  -> derived
  ~20k / ~2k +-15%         uniform over +-15% of the stated means (sv-042/043)  -> stated
  longalpaca (evalscope)   (sv-072..093): outputs fixed by --min-tokens = --max-tokens = 2000;
                           prompts are LongAlpaca-12k instructions of 5000 to 10000 characters
                           (evalscope's filter counts characters), taken as uniform over 1250
                           to 2500 tokens at an assumed 4 characters a token  -> prompt assumed
  ShareGPT with totals     the entry's own means, total / completed (`totals`)  -> derived
  ShareGPT, SGLang client  (sv-001..012, sv-026/027; sglang.bench_serving, no totals printed):
                           224.7 in / 190.8 out, the means that the same client and dataset
                           gave with the Llama-3 tokenizer in sv-018/019/025 (6,080 requests;
                           the commonly quoted ~220 / ~190 of benchmark_serving's ShareGPT
                           filter)  -> assumed
  ML.ENERGY rate sweep     (sv-028..041, vLLM 0.4.2): 500 requests, inferred: every stored
                           version of the leaderboard's sweep scripts (ml-energy/leaderboard
                           benchmark/llm_text_generation/chat/scripts) passes the 500-prompt
                           sharegpt/ShareGPT_V3_filtered_500.json, though the version that made
                           these files is not pinned; outputs are the
                           model's own answers (max_tokens 1024, no ignore_eos): their means are
                           taken from ML.ENERGY v2 on the same 500 prompts with Llama-3.1 (483
                           for 8B, 456 for 70B); prompts (first human turn, <= 800 tokens, plus
                           the chat template and a one-line system prompt): 220  -> assumed
  ML.ENERGY v2 / v3        outputs: the stated mean output length; prompts are not published:
                           220 (v2: the ShareGPT set above; v3: LMArena chat, taken as
                           ShareGPT-like)  -> prompt assumed

Spread of ShareGPT-like lengths (`--spread`, default `exp`): exponential, because ShareGPT's
prompt and reference-answer lengths are right-skewed (median well below the mean; a few
answers of 1,000+ tokens); benchmark_serving's and bench_serving's ShareGPT filter (drop
prompts or outputs under 4 tokens, prompts over 1024, prompt + output over 2048) is applied by
rejection, then the sample is rescaled to the target means. gpuwise's own `normal` (sd = a
quarter of the mean) is much narrower, which moves medians toward means and shrinks the p99s
of per-request quantities and the drain tail of all-at-once runs; `--spread normal` runs it
for comparison. Model-generated outputs (ML.ENERGY) are drawn the same way, capped at their
max_tokens (1024; v3: 4096).

Server settings taken from the entries: `server_args` where the source states them (the
startup log's non-default args and max_num_batched_tokens: gpu_memory_utilization,
max_model_len as context_alloc, max_num_batched_tokens); vLLM 0.6.0 --max_model_len 4096;
SGLang mem_frac 0.88 at TP1 and 0.85 at TP4 (benchmark_vllm_060 README; sv-011 states
--mem-frac 0.88) as the memory fraction; ML.ENERGY: --gpu-memory-utilization 0.90,
max_num_seqs as swept, v3 max-num-batched-tokens 8192. Otherwise the runtime's defaults in
catalog/data/schedulers.toml.

Energy. gpuwise's power model as `gpuwise serve` uses it (app/serve.py): busy = TDP x
costs.busy_power_fraction, idle = TDP x costs.idle_power_fraction, times the replica's GPUs.
The ML.ENERGY leaderboard (v2, v3) submits every request at once with the server's
max_num_seqs = B and measures GPU energy in the steady state (v2: until the queue empties), so
each point is simulated all-at-once with max_seqs = B and J/output token is taken over the
simulated steady window: from the B-th first token (the batch full) to the last first token
(the queue empty), where the engine is busy throughout, at the busy power; tokens are each
request's output made inside the window (linear between its first token and its last). The
whole-run figure of `summary(..., power=...)` (drain tail included) is reported beside it.
Requests: v3 1024, repeated for the larger max_num_seqs ("2 to 3 times": 2x from B = 768, 3x
from B = 1536; assumed); v2 500 (stated), but its B = 512..1024 points report an average batch
of 500 to 975, which 500 requests cannot give: there the 500 prompts are taken repeated to at
least 2B (1500, 2000, 2500; assumed). The steady-state output tokens/s, the average
batch in the window, and (v3) the ITL p50 and the measured power are compared too, so a J/token
error splits into a power and a throughput part. The rate-sweep entries (sv-028..041) give
client-side energy over the whole run per completed request (idle included): compared with
`summary`'s whole-run energy per request, reported apart.

An entry with `excluded` (its reason) is not simulated: sv-076..082 and sv-087..093, whose own
figures (requests/s x mean latency, Little's law) show about 36 requests in flight where 40 to
100 were stated. Quantities an entry lists under `not_compared` (with the reason) are not compared: TTFT where
the source's own setup makes it unrepresentative of the simulated run (prompts re-sent across
a sweep's levels, so the prefix cache served them: sv-072..111). Where an entry states the
server's KV cache size (`server_args.kv_cache_tokens`), the simulated replica's KV positions
are printed beside it (`diag.kv_tokens`) as a check of the memory model.

Run on another data file (e.g. an earlier version, for a before/after comparison) with
`--data FILE`.

Targets (issue 23), per runtime: median |error| <= 15% on throughput (output tokens/s,
requests/s, total tokens/s) and on TPOT (TPOT and ITL, any statistic), <= 25% on TTFT;
energy: median |error| <= 20% on J/output token. Checked over all simulated entries and over
the `current` group alone.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from public_cli import gpuwise_json

DATA = Path(__file__).resolve().parent / "data" / "serving_measurements.json"
SEED = 0

DEVICES = {
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100 80GB": "a100-sxm-80gb*",
    "NVIDIA A100 PCIe 80GB": "a100-pcie-80gb*",
    "NVIDIA H100 80GB": "h100-sxm*",
    "NVIDIA H100 (single GPU; SXM/PCIe and memory not stated)": "h100-sxm*",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    'NVIDIA H100 SXM (doc: "A single NVIDIA H100 SXM GPU."; memory not stated)': "h100-sxm*",
    "NVIDIA H200 141GB": "h200-sxm",
    "NVIDIA B200": "b200*",
}

MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B (as named in the post)": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",
    "Qwen/Qwen2-7B-Instruct": "qwen2.5-7b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-14B": "qwen3-14b",
}

NO_TIME_MODEL = {"nim": "NVIDIA NIM (TensorRT-LLM or vLLM profile, not stated): no time model"}
RUNTIMES = ("vllm", "sglang")

# ShareGPT means of sglang.bench_serving with the Llama-3 tokenizer, from sv-018/019/025's
# totals: (269081 + 540779 + 448102) / 6080 prompt, (226901 + 461874 + 383064) / 6080 output.
SGLANG_SHAREGPT = (224.7, 190.8)
# ML.ENERGY v2's measured mean outputs on the same 500 ShareGPT prompts (en-059..072, 8B;
# en-043..058, 70B), for the pre-V2 rate sweep's Llama-3 runs.
MLENERGY_OUTPUT = {"llama-3.1-8b": 483.0, "llama-3.1-70b": 456.0}
ASSUMED_PROMPT = 220.0
# SGLang's memory fraction in benchmark_vllm_060 (README: 0.88 at TP1, 0.85 at TP4).
SGLANG_060_MEM = {1: 0.88, 4: 0.85}
# evalscope's longalpaca filter keeps instructions of 5000 to 10000 characters; tokens are
# taken at 4 characters each (assumed; English prose with the Llama-3 tokenizer).
LONGALPACA_CHARS = (5000, 10000)
CHARS_PER_TOKEN = 4.0

QUANTITIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
RATES = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
STATS = ("mean", "p50", "p90", "p99")
CLASS_OF = {"ttft": "TTFT", "tpot": "TPOT", "itl": "TPOT", "e2e": "E2E",
            "output_tokens_per_s": "throughput", "total_tokens_per_s": "throughput",
            "requests_per_s": "throughput"}
TARGETS = {"throughput": 0.15, "TPOT": 0.15, "TTFT": 0.25}
ENERGY_TARGET = 0.20


@dataclass(frozen=True)
class Work:
    """The run to simulate: how many requests, their lengths, and the load."""

    n: int
    prompt: float  # mean (uniform1: the maximum)
    output: float
    dist: str  # sharegpt | uniform1 | band15 | fixed
    lengths: str  # stated | derived | assumed
    rate: float | None = None  # Poisson; None with clients None: all at t=0
    clients: int | None = None
    max_prompt: int = 1 << 30
    max_total: int = 1 << 30
    max_output: int = 1 << 30
    min_len: int = 1
    prompt_range: tuple[int, int] | None = None  # dist "range": prompts uniform over it

    @property
    def load(self) -> str:
        if self.clients:
            return f"C={self.clients}"
        return f"{self.rate:g}/s" if self.rate else "all@0"


def device_of(text: str) -> str | None:
    return DEVICES.get(text)


def device_text(e: dict) -> str:
    """The device as the source names it, or as its own evidence shows it (`device_inferred`,
    with that evidence) where the source leaves the form factor open."""
    return e.get("device_inferred", {}).get("device", e["device"])


def as_released(e: dict) -> list[str]:
    """The scheduler the entry's version ran: SGLang before v0.4 picked a batch after the
    previous one's result, not during it (the overlap scheduler became the default in
    sgl-project/sglang pull request #2067, 2024-11-18, for v0.4)."""
    if e["runtime"] == "sglang" and e["runtime_version"].startswith("0.3"):
        return ["--no-overlap-schedule"]
    return []


def model_of(text: str) -> str | None:
    return MODELS.get(text)


def skip_reason(e: dict) -> str | None:
    if e.get("excluded"):  # the source's own numbers contradict its stated load (entry notes)
        return "excluded by the data: " + e["excluded"].split(":")[0]
    if e["runtime"] in NO_TIME_MODEL:
        return NO_TIME_MODEL[e["runtime"]]
    if model_of(e["model"]) is None:
        return f"model not mapped: {e['model']}"
    if device_of(device_text(e)) is None:
        return f"device not in the catalogue: {e['device']}"
    return None


def era(e: dict) -> tuple[str, str]:
    """(group, setup): whether gpuwise's scheduler is the engine that ran, and which ran."""
    version = e["runtime_version"]
    if e["runtime"] == "sglang":
        if version.startswith("0.3"):
            return "older", "SGLang 0.3.0 (before the v0.4 overlap scheduler)"
        if version[:1].isdigit():
            return "current", f"SGLang {version.split()[0]}"
        return "current", "SGLang dev image, Dec 2024 (v0.4 era)"
    if "--num-scheduler-steps" in e.get("settings", ""):
        return "older", f"vLLM {version} V0, multi-step (--num-scheduler-steps 10)"
    if version.startswith("0.4") or version.startswith("0.5"):
        return "older", f"vLLM {version.split()[0]} V0 (no chunked prefill by default)"
    if version[:1].isdigit():
        return "current", f"vLLM {version.split()[0]} V1"
    return "current", "vLLM V1 (0.10.2 / 0.19.1 blog)"


def _sglang_random_max(e: dict) -> tuple[int, int]:
    m = re.search(r"--random-input (\d+) --random-output (\d+)", e["settings"])
    if not m:
        raise ValueError(f"{e['id']}: no --random-input/--random-output in settings")
    return int(m.group(1)), int(m.group(2))


def work_of(e: dict, model: str) -> Work:
    """The entry's run as its source describes it (the module docstring, 'Lengths')."""
    rate = e["request_rate"]
    rate = None if rate in ("inf", None) else float(rate)
    clients = e["concurrency"]
    n = e["num_prompts"] or 500  # sv-028..041: the 500-prompt ShareGPT file
    share = {"max_prompt": 1024, "max_total": 2048, "min_len": 4}  # benchmark_serving's filter
    if e["dataset"].startswith("longalpaca") and e["output_tokens"]:
        lo, hi = (round(c / CHARS_PER_TOKEN) for c in LONGALPACA_CHARS)
        return Work(n, (lo + hi) / 2, e["output_tokens"], "range", "prompt assumed", rate,
                    clients, prompt_range=(lo, hi))
    if e["prompt_tokens"] and e["output_tokens"]:
        dist = "band15" if "15%" in e["dataset"] else "fixed"
        return Work(n, e["prompt_tokens"], e["output_tokens"], dist, "stated", rate, clients)
    if e["dataset"] == "random" and e["runtime"] == "sglang":
        p, o = _sglang_random_max(e)
        return Work(n, p, o, "uniform1", "derived", rate, clients)
    totals = e.get("totals")
    if totals and e["dataset"].startswith("sharegpt"):
        return Work(n, totals["prompt_tokens_mean_derived"], totals["output_tokens_mean_derived"],
                    "sharegpt", "derived", rate, clients, **share)
    if e["id"] in ML_ENERGY_SWEEP:
        return Work(n, ASSUMED_PROMPT, MLENERGY_OUTPUT[model], "sharegpt", "assumed", rate,
                    clients, max_prompt=1024, max_output=1024)
    if e["dataset"].startswith("sharegpt"):
        p, o = SGLANG_SHAREGPT
        return Work(n, p, o, "sharegpt", "assumed", rate, clients, **share)
    raise ValueError(f"{e['id']}: no lengths")


ML_ENERGY_SWEEP = {f"sv-{i:03d}" for i in range(28, 42)}


def _sharegpt(rng: random.Random, w: Work, n: int, spread: str) -> list[tuple[int, int]]:
    """Right-skewed (exponential) lengths within the benchmark's filter, rescaled to the
    means; or gpuwise's `normal` spread."""
    if spread == "normal":  # `gpuwise serve --prompt-dist normal`: sd a quarter of the mean
        p, o = round(w.prompt), round(w.output)
        return [(max(1, round(rng.gauss(p, p / 4))), max(1, round(rng.gauss(o, o / 4))))
                for _ in range(n)]
    out: list[tuple[float, float]] = []
    while len(out) < n:
        p, o = rng.expovariate(1 / w.prompt), rng.expovariate(1 / w.output)
        if (p < w.min_len or o < w.min_len or p > w.max_prompt or o > w.max_output
                or p + o > w.max_total):
            continue
        out.append((p, o))
    sp = w.prompt / statistics.fmean(p for p, _ in out)
    so = w.output / statistics.fmean(o for _, o in out)
    return [(max(1, round(p * sp)), max(1, min(w.max_output, round(o * so)))) for p, o in out]


def draw_lengths(w: Work, spread: str, seed: int = SEED) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    if w.dist == "sharegpt":
        return _sharegpt(rng, w, w.n, spread)
    if w.dist == "uniform1":
        return [(rng.randint(1, int(w.prompt)), rng.randint(1, int(w.output))) for _ in range(w.n)]
    if w.dist == "range" and w.prompt_range:
        lo, hi = w.prompt_range
        return [(rng.randint(lo, hi), int(w.output)) for _ in range(w.n)]
    if w.dist == "band15":
        return [(round(rng.uniform(0.85, 1.15) * w.prompt), round(rng.uniform(0.85, 1.15) * w.output))
                for _ in range(w.n)]
    return [(int(w.prompt), int(w.output))] * w.n


def requests_of(w: Work, spread: str) -> tuple[list[tuple[float, int, int]], int]:
    """(arrival s, prompt, output) of each request, and the closed loop's clients (0: none):
    Poisson arrivals at the rate (seed 0, as `gpuwise serve --rate`), else all at t=0."""
    lengths = draw_lengths(w, spread)
    if w.rate:
        rng, t, times = random.Random(SEED), 0.0, []
        for _ in lengths:
            t += rng.expovariate(w.rate)
            times.append(t)
        return [(t, p, o) for t, (p, o) in zip(times, lengths, strict=True)], 0
    return [(0.0, p, o) for p, o in lengths], w.clients or 0


def server_of(e: dict) -> dict:
    """Plan and replica settings the entry's server command states."""
    s, out = e.get("settings", ""), {}
    args = e.get("server_args", {})
    if "gpu_memory_utilization" in args:
        out["gpu_memory_utilization"] = float(args["gpu_memory_utilization"])
    if "max_model_len" in args:
        out["context_alloc"] = int(args["max_model_len"])
    if "max_num_batched_tokens" in args:  # a replica option, not a plan field
        out["max_batched_tokens"] = int(args["max_num_batched_tokens"])
    m = re.search(r"--max_model_len (\d+)", s)
    if m:
        out["context_alloc"] = int(m.group(1))
    m = re.search(r"--mem-frac (0\.\d+)", s)
    if m:
        out["gpu_memory_utilization"] = float(m.group(1))
    elif e["runtime"] == "sglang" and e["runtime_version"] == "0.3.0":
        out["gpu_memory_utilization"] = SGLANG_060_MEM[e["tensor_parallel"]]
    if "KV cache fp8" in e["weights"]:
        out["kv_dtype"] = "fp8"
    return out


def weights_of(text: str) -> str:
    t = text.lower()
    return "fp8" if t.startswith("fp8") else "bf16"


def serve_args(model: str, device: str, runtime: str, weights: str, tp: int, server: dict,
               max_seqs: int | None = None) -> list[str]:
    """`gpuwise serve`'s options for the entry's server: the model, the devices, the weights
    and what its command line or startup log states."""
    args = ["serve", model, "--on", device.rstrip("*"), "--runtime", runtime, "--tp", str(tp),
            "--gpus", str(tp), "--weights", weights]
    options = {"gpu_memory_utilization": "--gpu-memory-utilization", "context_alloc": "--ctx",
               "max_batched_tokens": "--max-batched-tokens", "kv_dtype": "--kv-dtype"}
    for key, flag in options.items():
        if key in server:
            args += [flag, str(server[key])]
    return args + (["--max-seqs", str(max_seqs)] if max_seqs else [])


def serve_cli(args: list[str], reqs: list[tuple[float, int, int]], clients: int,
              tmp: Path) -> dict:
    """`gpuwise serve ARGS --trace FILE [--concurrency C] --json`, the requests in FILE."""
    trace = tmp / "requests.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
                             + "\n" for t, p, o in reqs))
    load = ["--trace", str(trace)] + (["--concurrency", str(clients)] if clients else [])
    return gpuwise_json(*args, *load)


def _ms(d: dict) -> dict[str, float | None]:
    return {k: None if v is None else 1e3 * v for k, v in d.items()}


def measured(rec: dict, reqs: list[tuple[float, int, int]]) -> dict:
    """`serve`'s figures in the benchmarks' units (ms; tokens and requests a second)."""
    out: dict = {key[:-2] + "_ms": _ms(rec[key]) for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s")}
    window = rec["duration_s"]
    out["output_tokens_per_s"] = rec["output_tokens_per_s"]
    out["requests_per_s"] = rec["requests_per_s"]
    out["total_tokens_per_s"] = sum(p + o for _, p, o in reqs) / window
    out["diag"] = {"preemptions": rec["preemptions"], "kv_peak": round(rec["kv_peak_fraction"], 3),
                   "saturated": rec["saturated"], "duration_s": round(window, 2),
                   "steps": rec["steps"], "kv_tokens": rec["kv_cache_tokens"]}
    return out


def compared(e: dict, sim: dict) -> list[tuple[str, float, float]]:
    """(quantity, published, simulated) for every figure the source gives that a simulation
    has (energy goes to the energy section; throughput of unstated kind is not compared)."""
    out = []
    skip = e.get("not_compared", {})
    for key, value in e["metrics"].items():
        if key in skip:
            continue
        if key in QUANTITIES:
            for stat in STATS:
                if stat in value:
                    out.append((f"{key[:-3]}_{stat}", value[stat], sim[key][stat]))
        elif key in RATES:
            out.append((key, value, sim[key]))
    return out


def class_of(quantity: str) -> str:
    return CLASS_OF.get(quantity, CLASS_OF.get(quantity.rsplit("_", 1)[0], "other"))


def stats(rows: list[dict], key: str = "error") -> dict:
    errs = [r[key] for r in rows]
    worst = max(rows, key=lambda r: abs(r[key]))
    return {"count": len(rows), "median_abs_error": statistics.median(abs(x) for x in errs),
            "median_error": statistics.median(errs), "worst": worst[key],
            "worst_id": worst["id"]}


def grouped(rows: list[dict], *keys: str) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return [{**dict(zip(keys, k, strict=True)), **stats(rs)} for k, rs in sorted(groups.items())]


def targets(rows: list[dict]) -> list[dict]:
    out = []
    for scope in ("all", "current"):
        rs = [r for r in rows if scope == "all" or r["group"] == scope]
        for runtime in RUNTIMES:
            for cls, limit in TARGETS.items():
                sel = [r for r in rs if r["runtime"] == runtime and r["class"] == cls]
                if not sel:
                    out.append({"scope": scope, "runtime": runtime, "class": cls,
                                "target": limit, "count": 0, "met": None})
                    continue
                s = stats(sel)
                out.append({"scope": scope, "runtime": runtime, "class": cls, "target": limit,
                            **s, "met": s["median_abs_error"] <= limit})
    return out


# --- energy --------------------------------------------------------------------------------


def energy_work(e: dict) -> Work:
    b, base = e["max_num_seqs"], e["num_prompts"]
    if e["source_set"].endswith("v3.0"):
        n, cap = base * (3 if b >= 1536 else 2 if b >= 768 else 1), 4096
    else:  # an average batch near B needs more than B requests: the 500 prompts repeated
        n, cap = (base if base >= 1.5 * b else base * math.ceil(2 * b / base)), 1024
    return Work(n, ASSUMED_PROMPT, e["output_tokens_mean"], "sharegpt",
                "prompt assumed" + ("" if n == base else ", n assumed"),
                max_prompt=1024, max_output=cap)


def energy_row(e: dict, spread: str, tmp: Path) -> dict:
    """One ML.ENERGY point: every request at once, the batch capped at max_num_seqs = B; J per
    output token over `serve`'s steady state (the batch full to the queue empty) at the
    engine's busy power, and over the whole run."""
    model, device = model_of(e["model"]), device_of(e["device"])
    assert model and device
    w = energy_work(e)
    b, tp = e["max_num_seqs"], e["tensor_parallel"]
    v3 = e["source_set"].endswith("v3.0")
    server = {"max_batched_tokens": 8192} if v3 else {}
    reqs, _ = requests_of(w, spread)
    args = serve_args(model, device, "vllm", "bf16", tp, server, max_seqs=b)
    args += ["--prompt", str(round(w.prompt)), "--new-tokens", str(max(1, round(w.output)))]
    rec = serve_cli(args, reqs, 0, tmp)
    win = rec["steady_state"]
    steady_j = win["per_output_token_j"]
    watts = steady_j * win["output_tokens_per_s"]
    m = e["metrics"]
    published = m.get("energy_per_output_token_j", m.get("energy_per_output_token_j_derived"))
    thr = win["output_tokens_per_s"]
    whole_j = rec["energy"]["per_output_token_j"]
    row = {"id": e["id"], "set": "v3" if v3 else "v2", "group": "current" if v3 else "older",
           "device": device, "model": model, "tp": tp, "max_num_seqs": b, "requests": w.n,
           "prompt": w.prompt, "output": w.output, "lengths": w.lengths,
           "published_j_per_token": published, "simulated_j_per_token": steady_j,
           "error": steady_j / published - 1,
           "whole_run_j_per_token": whole_j, "whole_run_error": whole_j / published - 1,
           "published_tokens_per_s": m["throughput_tokens_per_s"], "simulated_tokens_per_s": thr,
           "throughput_error": thr / m["throughput_tokens_per_s"] - 1,
           "published_avg_batch": e["avg_batch_size"], "simulated_avg_batch": win["average_batch"],
           "steady_window_s": win["seconds"], "steady_is_whole_run": win["whole_run"],
           "busy_w": watts, "preemptions": rec["preemptions"]}
    if "avg_power_w" in m:
        row["published_power_w"] = m["avg_power_w"]
        row["power_error"] = watts / m["avg_power_w"] - 1
    if "itl_ms" in m:
        row["published_itl_p50_ms"] = m["itl_ms"]["p50"]
        row["simulated_itl_p50_ms"] = 1e3 * rec["itl_s"]["p50"]
        row["itl_error"] = row["simulated_itl_p50_ms"] / m["itl_ms"]["p50"] - 1
    return row


# --- output --------------------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:+5.0f}%"


def print_rows(rows: list[dict]) -> None:
    print(f"{'id':7s} {'rt':6s} {'group':7s} {'device':14s} {'model':13s} {'tp':>2s} "
          f"{'load':>7s} {'n':>5s} {'lengths':8s} {'p/o':>11s} {'quantity':19s} "
          f"{'published':>10s} {'simulated':>10s} {'err':>6s}")
    last = None
    for r in rows:
        head = r["id"] != last
        last = r["id"]
        lead = (f"{r['id']:7s} {r['runtime']:6s} {r['group']:7s} {r['device']:14s} "
                f"{r['model']:13s} {r['tp']:2d} {r['load']:>7s} {r['requests']:5d} "
                f"{r['lengths']:8s} {round(r['prompt']):>5d}/{round(r['output']):<5d}"
                if head else " " * 97)
        print(f"{lead} {r['quantity']:19s} {r['published']:10.4g} {r['simulated']:10.4g} "
              f"{pct(r['error'])}")


def print_summary(title: str, summ: list[dict], keys: tuple[str, ...]) -> None:
    width = [max(len(k), *(len(str(s[k])) for s in summ)) for k in keys]
    print(f"\n{title}")
    print("  " + " ".join(f"{k:{n}s}" for k, n in zip(keys, width, strict=True))
          + f" {'n':>3s} {'med|err|':>8s} {'median':>7s} {'worst':>7s}  worst id")
    for s in summ:
        print("  " + " ".join(f"{s[k]!s:{n}s}" for k, n in zip(keys, width, strict=True))
              + f" {s['count']:3d} {100 * s['median_abs_error']:7.0f}% "
              f"{100 * s['median_error']:+6.0f}% {100 * s['worst']:+6.0f}%  "
              f"{s['worst_id']}")


def print_targets(tgts: list[dict]) -> None:
    print("\ntargets (median |error| per runtime)")
    for t in tgts:
        if t["met"] is None:
            print(f"  {t['scope']:7s} {t['runtime']:6s} {t['class']:10s} <= "
                  f"{100 * t['target']:.0f}%: no entries")
            continue
        print(f"  {t['scope']:7s} {t['runtime']:6s} {t['class']:10s} <= {100 * t['target']:.0f}%:"
              f" {100 * t['median_abs_error']:5.1f}% over {t['count']:2d} -> "
              f"{'met' if t['met'] else 'NOT met'}")


def print_kv_check(rows: list[dict]) -> None:
    """The simulated replica's KV positions beside the server's own startup log."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        if "kv_tokens_stated" in r["diag"]:
            key = (r["device"], r["model"], r["diag"]["kv_tokens"], r["diag"]["kv_tokens_stated"])
            if r["id"] not in seen.setdefault(key, []):
                seen[key].append(r["id"])
    if not seen:
        return
    print("\nKV cache: simulated positions vs the server's startup log")
    for (device, model, sim, pub), ids in seen.items():
        print(f"  {ids[0]}..{ids[-1]} {device:14s} {model:12s} {sim:9,d} vs {pub:9,d} "
              f"({pct(sim / pub - 1)})")


def print_energy(rows: list[dict]) -> None:
    print(f"\n{'id':7s} {'set':3s} {'device':13s} {'model':13s} {'tp':>2s} {'B':>5s} {'n':>5s} "
          f"{'J/tok pub':>9s} {'sim':>8s} {'err':>6s} {'whole':>8s} {'err':>6s} "
          f"{'tok/s pub':>9s} {'sim':>8s} {'err':>6s} {'batch':>6s} {'sim':>6s} {'P err':>6s}")
    for r in rows:
        print(f"{r['id']:7s} {r['set']:3s} {r['device']:13s} {r['model']:13s} {r['tp']:2d} "
              f"{r['max_num_seqs']:5d} {r['requests']:5d} {r['published_j_per_token']:9.4f} "
              f"{r['simulated_j_per_token']:8.4f} {pct(r['error'])} "
              f"{r['whole_run_j_per_token']:8.4f} {pct(r['whole_run_error'])} "
              f"{r['published_tokens_per_s']:9.0f} {r['simulated_tokens_per_s']:8.0f} "
              f"{pct(r['throughput_error'])} {r['published_avg_batch']:6.0f} "
              f"{r['simulated_avg_batch']:6.0f} {pct(r.get('power_error'))}")


def energy_summary(rows: list[dict]) -> list[dict]:
    out = []
    for name, sel in (("v3 (vLLM 0.11.1)", "v3"), ("v2 (vLLM 0.5.4)", "v2"), ("all", None)):
        rs = [r for r in rows if sel is None or r["set"] == sel]
        entry = {"set": name, **stats(rs), "met": stats(rs)["median_abs_error"] <= ENERGY_TARGET,
                 "whole_run": stats(rs, "whole_run_error"),
                 "throughput": stats(rs, "throughput_error")}
        power = [r for r in rs if "power_error" in r]
        if power:
            entry["power"] = stats(power, "power_error")
        itl = [r for r in rs if "itl_error" in r]
        if itl:
            entry["itl_p50"] = stats(itl, "itl_error")
        out.append(entry)
    by_config: dict[tuple, list[dict]] = {}
    for r in rows:
        by_config.setdefault((r["set"], r["device"], r["model"], r["tp"]), []).append(r)
    for (s, dev, model, tp), rs in sorted(by_config.items()):
        out.append({"set": f"{s} {dev} {model} tp{tp}", **stats(rs),
                    "met": stats(rs)["median_abs_error"] <= ENERGY_TARGET,
                    "throughput": stats(rs, "throughput_error")})
    return out


def print_energy_summary(summ: list[dict]) -> None:
    print(f"\nenergy: J/output token over the steady window (target median |error| <= "
          f"{100 * ENERGY_TARGET:.0f}%)")
    print(f"  {'set':38s} {'n':>3s} {'med|err|':>8s} {'bias':>6s} {'worst':>6s} {'met':>7s}"
          f"  {'whole-run med|err|/bias':>23s}  {'tok/s med|err|/bias':>19s}  "
          f"{'power bias':>10s}")
    for s in summ:
        whole = s.get("whole_run")
        w = (f"{100 * whole['median_abs_error']:9.0f}% / {100 * whole['median_error']:+4.0f}%"
             if whole else "")
        t = s["throughput"]
        p = s.get("power")
        print(f"  {s['set']:38s} {s['count']:3d} {100 * s['median_abs_error']:7.0f}% "
              f"{100 * s['median_error']:+5.0f}% {100 * s['worst']:+5.0f}% "
              f"{'met' if s['met'] else 'NOT met':>7s}  {w:>23s}  "
              f"{100 * t['median_abs_error']:9.0f}% / {100 * t['median_error']:+4.0f}%  "
              f"{pct(p['median_error']) if p else '':>10s}")


def serving_rows(e: dict, spread: str, tmp: Path, sweep_energy: list[dict]) -> list[dict]:
    """The entry's run through `gpuwise serve`, one row per quantity the source gives; the
    rate sweep's whole-run energy per request goes to `sweep_energy`."""
    model, device = model_of(e["model"]), device_of(device_text(e))
    assert model and device
    group, setup = era(e)
    w = work_of(e, model)
    tp = e["tensor_parallel"] or 1
    args = serve_args(model, device, e["runtime"], weights_of(e["weights"]), tp, server_of(e))
    args += ["--prompt", str(max(1, round(w.prompt))), "--new-tokens", str(max(1, round(w.output)))]
    reqs, clients = requests_of(w, spread)
    rec = serve_cli(args + as_released(e), reqs, clients, tmp)
    sim = measured(rec, reqs)
    stated_kv = e.get("server_args", {}).get("kv_cache_tokens")
    if stated_kv:
        sim["diag"]["kv_tokens_stated"] = stated_kv
    base = {"id": e["id"], "runtime": e["runtime"], "group": group, "setup": setup,
            "device": device, "model": model, "tp": tp, "load": w.load, "requests": w.n,
            "lengths": w.lengths, "dist": w.dist, "prompt": w.prompt, "output": w.output,
            "diag": sim["diag"]}
    rows = [{**base, "quantity": quantity, "class": class_of(quantity), "published": pub,
             "simulated": val, "error": val / pub - 1}
            for quantity, pub, val in compared(e, sim)]
    if "energy_per_response_j" in e["metrics"]:
        per_req = rec["energy"]["per_1000_requests_j"] / 1000
        pub = e["metrics"]["energy_per_response_j"]
        sweep_energy.append({"id": e["id"], "model": model, "rate": w.rate,
                             "published_j_per_request": pub, "simulated_j_per_request": per_req,
                             "error": per_req / pub - 1, "busy_fraction": rec["busy_fraction"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write rows, summaries and skips here")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the measurements file (default: %(default)s)")
    parser.add_argument("--spread", choices=("exp", "normal"), default="exp",
                        help="ShareGPT-like length spread (default: exponential)")
    args = parser.parse_args()
    data = json.loads(args.data.read_text())
    rows, skipped, sweep_energy = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for e in data["serving"]:
            reason = skip_reason(e)
            if reason:
                skipped.append({"id": e["id"], "runtime": e["runtime"], "model": e["model"],
                                "reason": reason})
                continue
            rows += serving_rows(e, args.spread, Path(tmp), sweep_energy)
        energy_rows = [energy_row(e, args.spread, Path(tmp)) for e in data["energy"]]

    print_rows(rows)
    by_rq = grouped(rows, "runtime", "quantity")
    by_rc = grouped(rows, "runtime", "class")
    by_group = grouped(rows, "group", "runtime", "class")
    by_setup = grouped(rows, "setup", "class")
    print_summary("by runtime x quantity", by_rq, ("runtime", "quantity"))
    print_summary("by runtime x class", by_rc, ("runtime", "class"))
    print_summary("by group x runtime x class", by_group, ("group", "runtime", "class"))
    print_summary("by setup x class", by_setup, ("setup", "class"))
    tgts = targets(rows)
    print_targets(tgts)
    print_kv_check(rows)

    print_energy(energy_rows)
    e_summary = energy_summary(energy_rows)
    print_energy_summary(e_summary)
    print("\nML.ENERGY rate sweep (sv-028..041): whole-run energy per request, idle included")
    for r in sweep_energy:
        print(f"  {r['id']} {r['model']:13s} {r['rate']:4.0f}/s  published "
              f"{r['published_j_per_request']:7.1f} J  simulated {r['simulated_j_per_request']:7.1f}"
              f" J  {pct(r['error'])}  busy {100 * r['busy_fraction']:3.0f}%")
    sweep_summary = stats(sweep_energy) if sweep_energy else None
    if sweep_summary:
        print(f"  median |error| {100 * sweep_summary['median_abs_error']:.0f}%, median "
              f"{100 * sweep_summary['median_error']:+.0f}%")

    simulated = sorted({r["id"] for r in rows})
    print(f"\n{len(simulated)} serving entries simulated ({len(rows)} quantities), "
          f"{len(energy_rows)} energy entries, {len(skipped)} skipped:")
    reasons: dict[str, list[str]] = {}
    for s in skipped:
        reasons.setdefault(s["reason"], []).append(s["id"])
    for reason, ids in reasons.items():
        print(f"  {ids[0]}..{ids[-1]} ({len(ids)}): {reason}")
    if args.json:
        args.json.write_text(json.dumps({
            "data": args.data.name, "spread": args.spread, "seed": SEED, "rows": rows,
            "by_runtime_quantity": by_rq, "by_runtime_class": by_rc, "by_group": by_group,
            "by_setup": by_setup, "targets": tgts,
            "energy": {"rows": energy_rows, "summary": e_summary, "target": ENERGY_TARGET,
                       "rate_sweep": {"rows": sweep_energy, "summary": sweep_summary}},
            "skipped": skipped}, indent=1, default=_jsonable) + "\n")


def _jsonable(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"not JSON: {type(x).__name__}")


if __name__ == "__main__":
    main()
