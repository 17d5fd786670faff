"""Claim: small quantized models run fine on CPUs. The experiment: a small random-weight llama
model at 8 and 4 bits (llama.cpp's q8_0 and q4_0, quantized by llama.cpp itself) generating on
every core of this CPU, timed as llama-bench times it, against human reading speed; beside it,
what the llama.cpp time model gives for a few catalogue models here. Without llama.cpp,
transformers with torch's dynamic int8 quantization is timed instead, and 4 bits estimated."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import runtime_for, timed_here, use
from gpuwise.app.claims.llama_models import SIZES, llama_cpp_missing, time_decode
from gpuwise.app.claims.machine_rates import local_rates
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, Verdict
from gpuwise.app.claims.torch_runs import decode_timing, llama_config
from gpuwise.app.lookup import model_named
from gpuwise.catalog.claims import claim_thresholds
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.workload.plans import InferencePlan

ID = "quantized-cpu"
TITLE = "Small quantized models run fine on CPUs"
CLAIM = ("A small language model quantized to 8 or 4 bits generates text on an ordinary CPU "
         "at least as fast as people read it.")
QTYPES = {"q8_0": "int8", "q4_0": "int4"}
CATALOGUE = ("llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b")


@dataclass(frozen=True)
class Speed:
    label: str  # "1.1B q4_0 (int4)"
    bits: str  # int8, int4, f16, fp32
    tokens_per_s: float
    source: str  # measured or estimated


def rule() -> str:
    t = claim_thresholds()
    return (f"holds when the small model, measured at int8 or int4, generates at least "
            f"{t.reading_tokens_per_s:.1f} tokens/s: {t.reading_words_per_minute:.0f} words a "
            f"minute (adults reading silently; Brysbaert 2019) x {t.tokens_per_word:.2f} tokens "
            "a word (OpenAI's rule of thumb for English)")


def judge(speeds: list[Speed]) -> Verdict:
    reading = claim_thresholds().reading_tokens_per_s
    measured = [s for s in speeds if s.source == "measured" and s.bits in ("int8", "int4")]
    if not measured:
        return Verdict(None, "no quantized model could be run here", rule())
    best = max(measured, key=lambda s: s.tokens_per_s)
    words = ", ".join(f"{s.label} {s.tokens_per_s:.1f} tokens/s" for s in measured)
    if best.tokens_per_s >= reading:
        return Verdict(True, f"{words}: {best.tokens_per_s / reading:.1f}x reading speed "
                       f"({reading:.1f} tokens/s)", rule())
    return Verdict(False, f"{words}: below reading speed ({reading:.1f} tokens/s)", rule())


def run(ctx: Context) -> ClaimResult:
    missing = llama_cpp_missing()
    notes: list[str] = []
    people = runtime_for("decode", "cpu")  # the claim is about CPUs, whatever else is here
    if missing is None:
        size = ctx.pick("0.2B", "1.1B")
        speeds = _llama_speeds(ctx, size)
        runtime = f"llama.cpp on {ctx.cores} threads"
        what = f"a random-weight {size}-parameter llama model ({_shape(size)})"
        used = use(people, ("decode",), "llama.cpp", " and ".join(QTYPES))
    else:
        size = "0.11B"
        notes.append(f"llama.cpp is not available ({missing}): transformers was timed in fp32 "
                     "and with torch's dynamic int8 quantization; 4 bits appears only in the "
                     "llama.cpp time model's estimates for catalogue models")
        speeds, runtime = _torch_speeds(ctx, size), "transformers (PyTorch eager) on the CPU"
        used = use(people, ("decode",), "transformers", "fp32 and int8 (torch dynamic)",
                   f"not available here ({missing}); eager dispatch adds to every token")
        what = f"a random-weight {size}-parameter llama model ({_shape(size)})"
    if ctx.quick:
        notes.append("--quick times a 0.2B model; a full run times TinyLlama-1.1B's shape")
    estimated, why = _catalogue_speeds(ctx)
    if why:
        notes.append(why)
    speeds += estimated
    reading = claim_thresholds().reading_tokens_per_s
    table = [("model", "weights", "tokens/s", "x reading speed", "source")]
    for s in speeds:
        table.append((s.label, s.bits, f"{s.tokens_per_s:.1f}", f"{s.tokens_per_s / reading:.1f}x",
                      s.source))
    best = {s.bits: s.tokens_per_s for s in speeds if s.source == "measured"}
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"Decode of {what} under {runtime}, one sequence, at 8 and 4 bits; beside it the "
        "llama.cpp time model's estimate for catalogue models on this machine.",
        judge(speeds),
        ", ".join(f"{b} {v:.0f} tokens/s" for b, v in best.items() if b in ("int8", "int4"))
        + f" (reading: {reading:.1f})",
        tuple(Measurement(f"decode {s.label}", round(s.tokens_per_s, 3), "tokens/s", s.source)
              for s in speeds),
        {"labels": [s.label for s in speeds], "bits": [s.bits for s in speeds],
         "tokens_per_s": [s.tokens_per_s for s in speeds],
         "sources": [s.source for s in speeds], "reading_tokens_per_s": reading},
        tuple(table), tuple(notes),
        judged_on=JudgedOn((used,), timed_here(
            f"decode timed here on {ctx.cores} threads (the catalogue models beside it are "
            "estimates and do not decide)")),
    )


def _shape(size: str) -> str:
    cfg = SIZES[size]
    return f"hidden {cfg.hidden}, {cfg.layers} layers, vocabulary {cfg.vocab}"


def _llama_speeds(ctx: Context, size: str) -> list[Speed]:
    n_gen, reps = ctx.pick((16, 3), (64, 5))
    speeds = []
    for i, (qtype, bits) in enumerate(QTYPES.items()):
        ctx.step(f"llama.cpp {qtype} of the {size} model", i / len(QTYPES))
        t = time_decode(ctx, size, qtype, n_gen, reps)
        speeds.append(Speed(f"{size} {qtype}", bits, 1.0 / t.s_per_token, "measured"))
    return speeds


def _torch_speeds(ctx: Context, size: str) -> list[Speed]:
    cfg = SIZES[size]
    config = llama_config(cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab)
    speeds = []
    for i, int8 in enumerate((False, True)):
        ctx.step(f"transformers {'int8' if int8 else 'fp32'} decode", i / 2)
        t = decode_timing(config, "cpu", "fp32", prompt=16, new_tokens=ctx.pick(17, 65),
                          repeats=ctx.pick(3, 5), int8=int8)
        speeds.append(Speed(f"{size} {'int8 (torch dynamic)' if int8 else 'fp32'}",
                            "int8" if int8 else "fp32", 1.0 / t.seconds, "measured"))
    return speeds


def _catalogue_speeds(ctx: Context) -> tuple[list[Speed], str]:
    """The llama.cpp time model for catalogue models on this CPU (none where the machine's
    rates are a GPU's: the claim is about CPUs)."""
    ctx.step("llama.cpp time model for catalogue models", 0.9)
    if ctx.on_gpu:
        return [], "catalogue estimates left out: this machine's rates are its GPU's"
    try:
        rates = local_rates(ctx).rates
    except GpuwiseError as exc:
        return [], f"catalogue estimates left out: {exc.message}"
    speeds = []
    for name in CATALOGUE:
        _, arch = model_named(name)
        for qtype, bits in QTYPES.items():
            plan = InferencePlan(runtime="llama.cpp", weights=qtype, threads=ctx.cores)
            try:
                t = estimate_inference_time(arch, plan, rates)
            except GpuwiseError:
                continue
            speeds.append(Speed(f"{name} {qtype}", bits, t.tokens_per_s, "estimated"))
    return speeds, ""
