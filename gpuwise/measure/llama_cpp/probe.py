"""`gpuwise probe --runtime llama.cpp`: time llama.cpp on this CPU with two small random-weight
models in each ggml type and thread count, and fit the llama.cpp time model's rates to them
(fit.py). The models are not the validation's (benchmarks/validate_llama_cpp.py): what that
checks is how the rates carry over to models they were not fitted to."""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwise.estimate.speed.cache_share import CacheSpan
from gpuwise.estimate.speed.ggml_time import HALF_UBATCH_TOKENS, GgmlRates
from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_decode_steps, time_llama_cpp
from gpuwise.measure.llama_cpp.cache_sweep import sweep
from gpuwise.measure.llama_cpp.fit import (
    GGML_TYPE,
    ModelTiming,
    fit_rates,
    llama_arch,
    timing_plans,
)
from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, quantize, write_random_gguf
from gpuwise.measure.llama_cpp.record import LlamaCppPart, LlamaCppTiming

# Two shapes whose bytes per layer differ by ~7x, so layer costs and bandwidth separate. Both
# are over 100 MB in Q4_0, several times a CPU's last-level cache (32 MiB on a Zen 5 CCD): a
# model that stays partly in cache streams faster than the models people run (docs/speed.md,
# "llama.cpp on this CPU").
PROBE_MODELS = (GgufConfig(hidden=768, layers=24, heads=12, kv_heads=4, ffn=2048),
                GgufConfig(hidden=2048, layers=4, heads=16, kv_heads=4, ffn=5632))
# And a small one whose generated token reads 14-50 MB (q4_0-f16), within most CPUs'
# last-level cache, for the cache's rate (fit.fit_cache; the cache's span from cache_sweep.py):
# models that fit there decode 1.5-2.7x faster than the streaming rate of those that do not.
SMALL_MODEL = GgufConfig(hidden=768, layers=3, heads=12, kv_heads=4, ffn=2048, vocab=8000)
TYPES = ("f16", "q8_0", "q4_0", "q4_k_m")
N_PROMPT = 512  # pp at one full ubatch: a served prompt step's size
# Steps on the narrow model (head_dim 64, 24 layers: attention is most of a deep step there):
# decodes of one sequence and of a batch, and a prompt chunk, at no depth and at DEPTH (a
# served request's context), for attention's rates and a small batch's matmuls (fit.py).
DEPTH, SEQS, CHUNK = 1024, 4, 256
DECODE_CASES = [(0, 1), (DEPTH, 1), (0, SEQS), (DEPTH, SEQS), (0, 1, CHUNK), (DEPTH, 1, CHUNK),
                (0, 1, CHUNK, DEPTH)]  # the last: beside DEPTH cells of another sequence
# Fits that read only the f16 cache, whatever the weights' type
TYPE_FREE = ("attention_flops", "decode_attention_flops", "batch_attention_flops", "masked_head_s")
ATTEMPTS, QUIET = 3, 0.05  # runs of a timing at most; others' share of the CPUs that is quiet


@dataclass(frozen=True)
class LlamaCppPlan:
    """What the llama.cpp probe times: every type at one thread and at every core, each timing
    run again (up to ATTEMPTS) while other processes disturb it (full); or every type at every
    core only, half the generated tokens, two repetitions, one run each and the attention
    steps on one type (`--quick`: for CI and a first look).
    """

    threads_all_cores_only: bool
    n_gen: int
    reps: int
    attempts: int
    half_ubatch: bool  # time a half-ubatch prompt too (half_matmul_flops)
    decode_types: tuple[str, ...]  # the types whose narrow model times the decode steps

    @classmethod
    def for_mode(cls, quick: bool) -> LlamaCppPlan:
        if quick:
            return cls(True, 16, 2, 1, False, ("q4_0",))
        return cls(False, 32, 5, ATTEMPTS, True, TYPES)

    def threads(self, cores: int) -> list[int]:
        return [max(1, cores)] if self.threads_all_cores_only else probe_threads(cores)


FULL = LlamaCppPlan.for_mode(False)
N_GEN, REPS = FULL.n_gen, FULL.reps

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


def quietest(measure: Callable[[], dict[str, Any]], attempts: int = ATTEMPTS) -> dict[str, Any]:
    """The run with the least of the CPUs taken by other processes, of up to `attempts`: on a
    few cores one busy neighbour stalls llama.cpp's thread barriers."""
    best: dict[str, Any] | None = None
    for _ in range(attempts):
        run = measure()
        share = run.get("others_cpu_share") or 0.0
        if best is None or share < (best.get("others_cpu_share") or 0.0):
            best = run
        if share < QUIET:
            break
    assert best is not None
    return best


def _timing(cfg: GgufConfig, path: Path, qtype: str, threads: int,
            plan: LlamaCppPlan) -> tuple[LlamaCppTiming, dict[str, Any]]:
    """One model's pp and tg: the median repetition of the quietest run (a repetition that
    another process stalled is an outlier, not a reading); with the run's own record."""
    run = quietest(lambda: time_llama_cpp(path, threads=threads, n_prompt=N_PROMPT,
                                           n_gen=plan.n_gen, reps=plan.reps), plan.attempts)
    tb = tensor_bytes(path)
    half_s, steps = 0.0, {}
    if plan.half_ubatch and cfg != SMALL_MODEL:  # the prompt's rate at half a ubatch too (pp only)
        half = quietest(lambda: time_llama_cpp(path, threads=threads, n_prompt=HALF_UBATCH_TOKENS,
                                               n_gen=0, reps=plan.reps), plan.attempts)
        half_s = statistics.median(half["pp_samples_s"])
    if cfg == PROBE_MODELS[0] and qtype in plan.decode_types:
        steps = dict(quietest(lambda: time_decode_steps(path, threads=threads, cases=DECODE_CASES,
                                                        n_gen=plan.n_gen, reps=min(3, plan.reps)),
                              plan.attempts)["step_s"])
    timing = LlamaCppTiming(model=cfg.name, type=qtype, threads=threads,
                            pp_s=statistics.median(run["pp_samples_s"]),
                            tg_s=statistics.median(run["tg_samples_s"]) / plan.n_gen,
                            bytes=tb["total"], embedding_bytes=tb["token_embd"],
                            pp_half_s=half_s, decode_steps=steps)
    return timing, run


def rates_from_timings(timings: list[dict[str, Any]] | list[LlamaCppTiming], n_prompt: int = 0,
                       n_gen: int = 0, span: CacheSpan | None = None) -> dict[str, GgmlRates]:
    """The fitted rates by "ggml type/threads" from the probe models' timings (taken at
    `n_prompt` and `n_gen` tokens: the full probe's unless said), the small model's with the
    cache's `span` giving the cache's rate. Attention's rates do not
    depend on the weights' type (the cache is f16 in each), so each thread count takes the
    median of its types' fits: one type's reading is a difference of two steps, and noisy."""
    models = {cfg.name: cfg for cfg in (*PROBE_MODELS, SMALL_MODEL)}
    pairs: dict[tuple[str, int], list[ModelTiming]] = {}
    small: dict[tuple[str, int], ModelTiming] = {}
    for raw in timings:
        t = raw if isinstance(raw, LlamaCppTiming) else LlamaCppTiming(**raw)
        cfg = models[t.model]
        arch = llama_arch(cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab)
        pp, tg = timing_plans(t.type, t.bytes, t.embedding_bytes, n_prompt or N_PROMPT,
                              n_gen or N_GEN, t.threads)
        timing = ModelTiming(arch, pp, tg, t.pp_s, t.tg_s, t.decode_steps, t.pp_half_s)
        if cfg == SMALL_MODEL:
            small[(t.type, t.threads)] = timing
        else:
            pairs.setdefault((t.type, t.threads), []).append(timing)
    out = {}
    for (q, n), found in pairs.items():
        if len(found) < 2:
            continue
        out[f"{GGML_TYPE[q]}/{n}"] = fit_rates(found[0], found[1], DEPTH, SEQS, CHUNK,
                                               small.get((q, n)), span)
    for threads in {key.split("/")[1] for key in out}:
        fits = [r for key, r in out.items() if key.endswith(f"/{threads}")]
        for name in TYPE_FREE:
            values = [r[name] for r in fits if r.get(name)]
            pooled = statistics.median(values) if values else 0.0
            for r in fits:
                r[name] = pooled
    # GgmlRates takes exactly the fields it defines: a fit that emits another is a TypeError
    # here, at the probe, never a profile its loader refuses.
    return {key: GgmlRates(**fit, source="measured") for key, fit in out.items()}


def probe_llama_cpp(cores: int, progress: Progress | None = None,
                    quick: bool = False) -> dict[str, Any]:
    """llama.cpp's rates on this machine by "ggml type/threads", with what they came from:
    `dataclasses.asdict` of a LlamaCppPart, as the profile saves it."""
    plan = LlamaCppPlan.for_mode(quick)
    threads = plan.threads(cores)
    steps = 1 + (len(PROBE_MODELS) + 1) * (1 + len(TYPES) * len(threads))
    if progress:
        progress("llama.cpp: this CPU's cache", 0.0)
    cache = sweep(max(threads))
    done, timings, last = 1, [], dict[str, Any]()
    with tempfile.TemporaryDirectory(prefix="gpuwise-llama-") as tmp:
        for cfg in (*PROBE_MODELS, SMALL_MODEL):
            if progress:
                progress(f"llama.cpp: writing {cfg.name}", done / steps)
            files = _model_files(cfg, Path(tmp))
            done += 1
            for qtype in TYPES:
                for t in threads:
                    if progress:
                        progress(f"llama.cpp: {cfg.name} {qtype} on {t} thread(s)", done / steps)
                    timing, last = _timing(cfg, files[qtype], qtype, t, plan)
                    timings.append(timing)
                    done += 1
            for path in set(files.values()):
                path.unlink()
    part = LlamaCppPart(version=last["llama_cpp_python"], system_info=last["system_info"],
                        n_prompt=N_PROMPT, n_gen=plan.n_gen,
                        models=tuple(cfg.name for cfg in (*PROBE_MODELS, SMALL_MODEL)),
                        rates=rates_from_timings(timings, N_PROMPT, plan.n_gen,
                                                 CacheSpan(cache.full_bytes, cache.none_bytes)),
                        timings=tuple(timings), quick=quick, cache_sweep=cache)
    return saved_form(part)


def saved_form(part: LlamaCppPart) -> dict[str, Any]:
    """The part as the profile saves it and reads it back (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(part)))  # type: ignore[no-any-return]
