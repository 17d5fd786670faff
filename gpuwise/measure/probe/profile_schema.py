"""The saved profile's schema: the type and shape of every field, the kernel grids too
(`gpuwise.estimate.speed.probe_record` holds the checks). `Profile.from_json` runs it, so a
profile that reaches an estimate has numbers where numbers are read."""

from __future__ import annotations

from typing import Any

from gpuwise.estimate.speed.probe_record import (
    check_kernels,
    flag,
    integer,
    list_of,
    maybe,
    number,
    point,
    record,
    size,
    table_of,
    text,
)

BANDWIDTH = record(
    {"kind": text, "gbs": maybe(number), "array_bytes": integer, "bytes_per_pass": integer,
     "best_s": maybe(number)},
    {"fraction_of_spec": maybe(number)},
)  # fmt: skip
MATMUL_POINT = record({"m": size, "n": size, "k": size, "dtype": text, "seconds": number,
                       "median_s": number, "flops_per_s": number,
                       "repeats": number})  # a median of counts after --repeat  # fmt: skip
# The transformers runtime's costs: seconds and factors by name, GEMV rates by dtype.
RUNTIME = table_of(number, {"gemv": table_of(list_of(point(1))), "device": text})
# llama.cpp's rates by "ggml type/threads" (estimate/speed/ggml_time.GgmlRates' fields).
GGML_RATES = record({key: number for key in (
    "weight_bytes_per_s", "kv_bytes_per_s", "matmul_flops", "attention_flops", "layer_s",
    "token_s", "layer_token_s")})  # fmt: skip
LLAMA_CPP = record({"version": text, "system_info": text, "n_prompt": integer, "n_gen": integer,
                    "models": list_of(text), "rates": table_of(GGML_RATES),
                    "timings": list_of(record({"model": text, "type": text, "threads": integer,
                                               "pp_s": number, "tg_s": number, "bytes": integer,
                                               "embedding_bytes": integer}))})  # fmt: skip
PROFILE = record(
    {
        "fingerprint": text, "device": text, "backend": text, "threads": maybe(integer),
        "bandwidth": list_of(BANDWIDTH), "links": list_of(BANDWIDTH),
        "matmul_points": list_of(MATMUL_POINT), "matmul_best": table_of(maybe(MATMUL_POINT)),
        "matmul_fraction_of_spec": table_of(maybe(number)), "overhead_s": table_of(maybe(number)),
        "missing": table_of(text), "created_at": text, "versions": table_of(text),
        "schema": integer,
    },
    {
        "cache_bytes": maybe(integer), "spec_id": maybe(text), "quick": flag,
        "notes": list_of(text), "runtime": maybe(RUNTIME), "kernels": maybe(check_kernels),
        "steadiness": maybe(table_of(number)), "warnings": list_of(text),
        "llama_cpp": maybe(LLAMA_CPP),
    },
)  # fmt: skip


def check_profile(raw: Any) -> None:
    """ValueError naming the first field of a saved profile that is missing, unknown or of
    the wrong type or shape."""
    PROFILE(raw, "profile")
