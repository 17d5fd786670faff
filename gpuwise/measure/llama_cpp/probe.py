"""`gpuwise probe --runtime llama.cpp`: time llama.cpp on this CPU with two small random-weight
models in each ggml type and thread count, and fit the llama.cpp time model's rates to them
(fit.py). The models are not the validation's (benchmarks/validate_llama_cpp.py): what that
checks is how the rates carry over to models they were not fitted to."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwise.estimate.speed.ggml_time import HALF_UBATCH_TOKENS
from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_decode_steps, time_llama_cpp
from gpuwise.measure.llama_cpp.fit import (
    GGML_TYPE,
    ModelTiming,
    fit_rates,
    llama_arch,
    timing_plans,
)
from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, quantize, write_random_gguf

# Two shapes whose bytes per layer differ by ~7x, so layer costs and bandwidth separate. Both
# are over 100 MB in Q4_0, several times a CPU's last-level cache (32 MiB on a Zen 5 CCD): a
# model that stays partly in cache streams faster than the models people run (docs/speed.md,
# "llama.cpp on this CPU").
PROBE_MODELS = (GgufConfig(hidden=768, layers=24, heads=12, kv_heads=4, ffn=2048),
                GgufConfig(hidden=2048, layers=4, heads=16, kv_heads=4, ffn=5632))  # fmt: skip
TYPES = ("f16", "q8_0", "q4_0", "q4_k_m")
N_PROMPT, N_GEN, REPS = 512, 32, 5  # pp at one full ubatch: a served prompt step's size
# Steps on the narrow model (head_dim 64, 24 layers: attention is most of a deep step there):
# decodes of one sequence and of a batch, and a prompt chunk, at no depth and at DEPTH (a
# served request's context), for attention's rates and a small batch's matmuls (fit.py).
DEPTH, SEQS, CHUNK = 1024, 4, 256
DECODE_CASES = [(0, 1), (DEPTH, 1), (0, SEQS), (DEPTH, SEQS), (0, 1, CHUNK), (DEPTH, 1, CHUNK),
                (0, 1, CHUNK, DEPTH)]  # the last: beside DEPTH cells of another sequence
# Fits that read only the f16 cache, whatever the weights' type
TYPE_FREE = ("attention_flops", "decode_attention_flops", "batch_attention_flops", "masked_head_s")
ATTEMPTS, QUIET = 3, 0.05  # runs of a timing at most; others' share of the CPUs that is quiet

Progress = Callable[[str, float], None]


def probe_threads(cores: int) -> list[int]:
    """One thread and every core: llama.cpp's default is one thread a core."""
    return sorted({1, max(1, cores)})


def _model_files(cfg: GgufConfig, folder: Path) -> dict[str, Path]:
    f16 = write_random_gguf(folder / f"{cfg.name}-f16.gguf", cfg)
    files = {"f16": f16}
    for qtype in TYPES[1:]:
        files[qtype] = quantize(f16, folder / f"{cfg.name}-{qtype}.gguf", qtype)
    return files


def quietest(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The run with the least of the CPUs taken by other processes, of up to ATTEMPTS: on a
    few cores one busy neighbour stalls llama.cpp's thread barriers."""
    best: dict[str, Any] | None = None
    for _ in range(ATTEMPTS):
        run = measure()
        share = run.get("others_cpu_share") or 0.0
        if best is None or share < (best.get("others_cpu_share") or 0.0):
            best = run
        if share < QUIET:
            break
    assert best is not None
    return best


def _timing(cfg: GgufConfig, path: Path, qtype: str, threads: int) -> dict[str, Any]:
    """One model's pp and tg: the median repetition of the quietest run (a repetition that
    another process stalled is an outlier, not a reading)."""
    run = quietest(lambda: time_llama_cpp(path, threads=threads, n_prompt=N_PROMPT,
                                           n_gen=N_GEN, reps=REPS))  # fmt: skip
    tb = tensor_bytes(path)
    pp_s = statistics.median(run["pp_samples_s"])
    tg_s = statistics.median(run["tg_samples_s"]) / N_GEN
    record = {"model": cfg.name, "type": qtype, "threads": threads, "pp_s": pp_s,
              "tg_s": tg_s, "bytes": tb["total"],
              "embedding_bytes": tb["token_embd"], "version": run["llama_cpp_python"],
              "system_info": run["system_info"]}  # fmt: skip
    if N_PROMPT > HALF_UBATCH_TOKENS:  # the prompt's rate at half a ubatch too (pp only)
        half = quietest(lambda: time_llama_cpp(path, threads=threads,
                                               n_prompt=HALF_UBATCH_TOKENS, n_gen=0, reps=REPS))  # fmt: skip
        record["pp_half_s"] = statistics.median(half["pp_samples_s"])
    if cfg == PROBE_MODELS[0]:
        steps = quietest(lambda: time_decode_steps(path, threads=threads, cases=DECODE_CASES))
        record["decode_steps"] = dict(steps["step_s"])
    return record


def rates_from_timings(timings: list[dict[str, Any]], n_prompt: int = 0,
                       n_gen: int = 0) -> dict[str, dict[str, float]]:  # fmt: skip
    """The fitted rates by "ggml type/threads" from the probe models' timings (taken at
    `n_prompt` and `n_gen` tokens: this probe's unless said). Attention's rates do not depend
    on the weights' type (the cache is f16 in each), so each thread count takes the median
    of its types' fits: one type's reading is a difference of two steps, and noisy."""
    models = {cfg.name: cfg for cfg in PROBE_MODELS}
    pairs: dict[tuple[str, int], list[ModelTiming]] = {}
    for t in timings:
        cfg = models[t["model"]]
        arch = llama_arch(cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab)
        pp, tg = timing_plans(t["type"], t["bytes"], t["embedding_bytes"], n_prompt or N_PROMPT,
                              n_gen or N_GEN, t["threads"])  # fmt: skip
        pairs.setdefault((t["type"], t["threads"]), []).append(
            ModelTiming(arch, pp, tg, t["pp_s"], t["tg_s"], t.get("decode_steps") or {},
                        t.get("pp_half_s", 0.0)))  # fmt: skip
    out = {}
    for (q, n), found in pairs.items():
        if len(found) < 2:
            continue
        out[f"{GGML_TYPE[q]}/{n}"] = fit_rates(found[0], found[1], DEPTH, SEQS, CHUNK)
    for threads in {key.split("/")[1] for key in out}:
        fits = [r for key, r in out.items() if key.endswith(f"/{threads}")]
        for name in TYPE_FREE:
            values = [r[name] for r in fits if r.get(name)]
            pooled = statistics.median(values) if values else 0.0
            for r in fits:
                r[name] = pooled
    return out


def probe_llama_cpp(cores: int, progress: Progress | None = None) -> dict[str, Any]:
    """llama.cpp's rates on this machine by "ggml type/threads", with what they came from."""
    threads = probe_threads(cores)
    steps = len(PROBE_MODELS) * (1 + len(TYPES) * len(threads))
    done, timings = 0, []
    with tempfile.TemporaryDirectory(prefix="gpuwise-llama-") as tmp:
        for cfg in PROBE_MODELS:
            if progress:
                progress(f"llama.cpp: writing {cfg.name}", done / steps)
            files = _model_files(cfg, Path(tmp))
            done += 1
            for qtype in TYPES:
                for t in threads:
                    if progress:
                        progress(f"llama.cpp: {cfg.name} {qtype} on {t} thread(s)", done / steps)
                    timings.append(_timing(cfg, files[qtype], qtype, t))
                    done += 1
            for path in set(files.values()):
                path.unlink()
    info = {key: timings[-1][key] for key in ("version", "system_info")}
    for record in timings:
        del record["version"], record["system_info"]
    return {**info, "n_prompt": N_PROMPT, "n_gen": N_GEN,
            "models": [cfg.name for cfg in PROBE_MODELS], "rates": rates_from_timings(timings, N_PROMPT, N_GEN),
            "timings": timings}  # fmt: skip
