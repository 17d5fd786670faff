"""Random-weight llama models as GGUF files, written and quantized once per run and shared by
the experiments, and their decode timed by llama.cpp as llama-bench times it (one warm-up,
then `reps` runs of `n_gen` tokens into an empty cache, in a fresh process; the quietest of up
to three such runs, as the llama.cpp probe takes)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from gpuwise.app.claims.context import Context
from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_llama_cpp
from gpuwise.measure.llama_cpp.gguf_model import (
    GgufConfig,
    need_gguf,
    need_llama_cpp,
    quantize,
    write_random_gguf,
)
from gpuwise.measure.llama_cpp.probe import quietest

# llama-shaped models from ~0.1B to 1.1B parameters (vocab 32000, untied head): the first
# three in --quick, all in a full run. TinyLlama-1.1B's shape is the "small model" people run
# on CPUs; the others are its family at smaller widths and depths.
SIZES = {
    "0.06B": GgufConfig(hidden=512, layers=8, heads=8, kv_heads=4, ffn=1408),
    "0.11B": GgufConfig(hidden=768, layers=10, heads=12, kv_heads=4, ffn=2048),
    "0.2B": GgufConfig(hidden=1024, layers=12, heads=16, kv_heads=4, ffn=2816),
    "0.7B": GgufConfig(hidden=2048, layers=12, heads=16, kv_heads=8, ffn=5632),
    "1.1B": GgufConfig(hidden=2048, layers=22, heads=32, kv_heads=4, ffn=5632),
}
QUICK_SIZES = ("0.06B", "0.11B", "0.2B")


@dataclass(frozen=True)
class DecodeTiming:
    size: str  # the SIZES key
    qtype: str  # f16, q8_0, q4_0
    params: int
    file_bytes: int
    bytes_per_token: int  # weights a token reads: all but the embedding table, plus one row of it
    s_per_token: float  # the median of the repetitions
    threads: int


def llama_cpp_missing() -> str | None:
    """Why llama.cpp's models cannot be written or timed here, or None when they can."""
    try:
        need_gguf()
        need_llama_cpp()
    except Exception as exc:  # GpuwiseError, or a binding that fails to load its library
        return str(getattr(exc, "message", exc))
    return None


def model_file(ctx: Context, size: str, qtype: str = "f16") -> Path:
    """The GGUF of `size` in `qtype`, written (and quantized) the first time it is asked for."""
    cfg = SIZES[size]

    def f16() -> Path:
        ctx.step(f"writing a random {size} GGUF")
        return write_random_gguf(ctx.workdir / f"{cfg.name}-f16.gguf", cfg)

    source: Path = ctx.once(("gguf", size, "f16"), f16)
    if qtype == "f16":
        return source

    def quantized() -> Path:
        ctx.step(f"quantizing the {size} GGUF to {qtype}")
        return quantize(source, ctx.workdir / f"{cfg.name}-{qtype}.gguf", qtype)

    return ctx.once(("gguf", size, qtype), quantized)  # type: ignore[no-any-return]


def time_decode(ctx: Context, size: str, qtype: str, n_gen: int, reps: int) -> DecodeTiming:
    """llama.cpp's decode of the model on every core (its default: a thread a core)."""
    path = model_file(ctx, size, qtype)
    threads = ctx.cores
    # the quietest of up to 3 runs, as the llama.cpp probe times: on a few cores one busy
    # neighbour stalls llama.cpp's thread barriers
    run = quietest(lambda: time_llama_cpp(path, threads=threads, n_prompt=0, n_gen=n_gen,
                                          reps=reps))
    per_token = statistics.median(run["tg_samples_s"]) / n_gen
    read = tensor_bytes(path)
    return DecodeTiming(size, qtype, SIZES[size].params, os.path.getsize(path),
                        int(read["per_token"]), per_token, threads)
