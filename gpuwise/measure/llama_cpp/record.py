"""What `gpuwise probe --runtime llama.cpp` saves in the profile's `llama_cpp` part: one
definition for the writer (probe.py builds these and saves `dataclasses.asdict` of them) and
the reader (measure/probe/profile_schema.py derives its check from the same classes), so a
field the probe writes is always one the loader knows (issue 37: they had drifted apart and
every llama.cpp probe was refused)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwise.estimate.speed.ggml_time import GgmlRates


@dataclass(frozen=True)
class LlamaCppTiming:
    """One probe model's llama-bench style timings at one ggml type and thread count."""

    model: str
    type: str  # the quantisation written (f16, q8_0, q4_0, q4_k_m)
    threads: int
    pp_s: float  # the whole prompt of n_prompt tokens
    tg_s: float  # one generated token
    bytes: int  # the GGUF file's tensor bytes
    embedding_bytes: int
    pp_half_s: float = 0.0  # a prompt of half a ubatch (0.0: not timed)
    # decode steps by "d{depth}/s{seqs}[/t{chunk}][/o{other}]", seconds a step (fit.fit_decode)
    decode_steps: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheSweep:
    """One thread's read rate by array size ("<MiB>": bytes a second) and the span over which
    streams leave the last-level cache (measure/llama_cpp/cache_sweep.py)."""

    read_bytes_per_s: dict[str, float]
    full_bytes: float
    none_bytes: float


@dataclass(frozen=True)
class LlamaCppPart:
    """llama.cpp's rates on this CPU by "ggml type/threads", with the timings they came from."""

    version: str  # llama-cpp-python's
    system_info: str  # llama.cpp's own line: the CPU features its kernels use
    n_prompt: int
    n_gen: int
    models: tuple[str, ...]
    rates: dict[str, GgmlRates]
    timings: tuple[LlamaCppTiming, ...]
    quick: bool = False  # `--quick`: fewer types and repetitions (the types not timed use the datasheet)
    # cache_sweep.sweep(): read rates by array size, and the cache's span found in them
    cache_sweep: CacheSweep | None = None
