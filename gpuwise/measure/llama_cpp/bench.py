"""llama-bench style timing of a GGUF model on this machine, and the bytes its weights hold.

`time_llama_cpp` runs llama-bench's two tests in a fresh child process (`bench_child`, whose
docstring has the loops): pp, n_prompt random tokens decoded in batches of n_batch into an
empty KV cache, and tg, n_gen tokens decoded one at a time into an empty cache, each after one
warm-up and with the cache cleared before each of `reps` timed runs. Rates are llama-bench's:
tokens / seconds per repetition, averaged, with the sample standard deviation.

The child calls llama.cpp's C API (llama_decode on llama_batch_get_one, then
llama_synchronize) as llama-bench does, not `Llama.eval`, whose per-call Python work (a
Python loop filling the batch, a KV-cache trim, copying the token ids) llama-bench does not
have. What stays is a few ctypes calls per token, microseconds against milliseconds.

Unlike llama-bench the child attaches no ggml threadpool of its own (llama-cpp-python exposes
none); with an OpenMP build of ggml, as here, the graph's threads come from OpenMP either way.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.llama_cpp.bench_child import run_child
from gpuwise.measure.llama_cpp.gguf_model import need_gguf, need_llama_cpp
from gpuwise.measure.probe.run import others_cpu_s

DEFAULT_TIMEOUT_S = 900.0
SEED = 1234
# Tensors whose bytes a token does not read in full: the embedding (one row per token) and the
# output head (read once per decode, whatever the batch); listed apart for the estimator.
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


def _gguf_file(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.is_file():
        raise GpuwiseError(f"no GGUF file at {path}",
                           "write one with gguf_model.write_random_gguf()")
    return path


def _rates(samples_ns: list[int], n_tokens: int) -> tuple[float | None, ...]:
    """(mean tokens/s, its sample stdev, mean seconds per run) as llama-bench reports them;
    Nones for a test not run."""
    if not samples_ns:
        return None, None, None
    rates = [n_tokens * 1e9 / ns for ns in samples_ns]
    stdev = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return statistics.fmean(rates), stdev, statistics.fmean(samples_ns) / 1e9


def others_share(before: float | None, wall_s: float) -> float | None:
    """The share of all CPUs that other processes used while the child ran: on 2 vCPUs one
    busy neighbour stalls llama.cpp's 2-thread barriers, so a high share flags a bad run."""
    after = others_cpu_s()
    if before is None or after is None or wall_s <= 0:
        return None
    return max(0.0, (after - before) / (wall_s * (os.cpu_count() or 1)))


def _check_counts(threads: int, n_prompt: int, n_gen: int, reps: int, n_batch: int,
                  n_ubatch: int) -> None:
    if min(threads, reps, n_batch, n_ubatch) < 1 or min(n_prompt, n_gen) < 0:
        raise GpuwiseError("threads, reps, n_batch and n_ubatch must be >= 1, "
                           "n_prompt and n_gen >= 0")
    if n_prompt == 0 and n_gen == 0:
        raise GpuwiseError("nothing to time: n_prompt and n_gen are both 0")


def time_llama_cpp(
    path: str | os.PathLike[str],
    *,
    threads: int,
    n_prompt: int = 512,
    n_gen: int = 128,
    reps: int = 3,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    flash_attn: bool | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Time prompt processing (pp) and generation (tg) of the GGUF at `path` as llama-bench
    does, in a fresh process; n_prompt=0 or n_gen=0 skips that test (its fields are None).
    `flash_attn` None leaves llama.cpp's choice (auto: enabled on the CPU)."""
    model = _gguf_file(path)
    _check_counts(threads, n_prompt, n_gen, reps, n_batch, n_ubatch)
    need_llama_cpp()
    job = {"kind": "time", "path": str(model.resolve()), "threads": threads,
           "n_prompt": n_prompt, "n_gen": n_gen, "reps": reps, "n_batch": n_batch,
           "n_ubatch": n_ubatch, "flash_attn": flash_attn, "seed": SEED}
    what = f"llama.cpp timing of {model.name} ({threads} threads, pp{n_prompt} tg{n_gen})"
    others_before, started = others_cpu_s(), time.perf_counter()
    raw = run_child(job, timeout_s, what)
    others = others_share(others_before, time.perf_counter() - started)
    pp, pp_stdev, pp_s = _rates(raw["pp_ns"], n_prompt)
    tg, tg_stdev, tg_s = _rates(raw["tg_ns"], n_gen)
    return {
        "model": model.name, "file_bytes": model.stat().st_size, "threads": threads,
        "n_prompt": n_prompt, "n_gen": n_gen, "n_batch": n_batch, "n_ubatch": n_ubatch,
        "flash_attn": flash_attn, "reps": reps,
        "pp_tokens_per_s": pp, "pp_stdev": pp_stdev, "pp_s": pp_s,
        "tg_tokens_per_s": tg, "tg_stdev": tg_stdev,
        "tg_s_per_token": tg_s / n_gen if tg_s is not None else None,
        "pp_samples_s": [ns / 1e9 for ns in raw["pp_ns"]],
        "tg_samples_s": [ns / 1e9 for ns in raw["tg_ns"]],
        "llama_cpp_python": raw["llama_cpp_python"], "system_info": raw["system_info"],
        "llama_log_notes": raw["notes"], "others_cpu_share": others,
    }


def time_decode_steps(path: str | os.PathLike[str], *, threads: int,
                      cases: list[tuple[int, ...]], n_gen: int = 32, reps: int = 3,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Seconds of one step at each (depth, sequences[, tokens]) case, llama-batched-bench
    style (decode_child.py), in a fresh process: the median of `reps` runs. Keys
    "d{depth}/s{seqs}", "/t{tokens}" for a prompt chunk of more than one token, and
    "/o{other}" for masked cells of another sequence in the cache."""
    model = _gguf_file(path)
    if min(threads, n_gen, reps) < 1 or any(c[0] < 0 or min(c[1:3]) < 1 for c in cases):
        raise GpuwiseError("threads, n_gen, reps, sequences and tokens must be >= 1, "
                           "depths >= 0")
    need_llama_cpp()
    job = {"kind": "decode", "path": str(model.resolve()), "threads": threads,
           "cases": [list(c) for c in cases], "n_gen": n_gen, "reps": reps, "seed": SEED}
    others_before, started = others_cpu_s(), time.perf_counter()
    raw = run_child(job, timeout_s, f"llama.cpp decode steps of {model.name} ({threads} threads)")
    others = others_share(others_before, time.perf_counter() - started)
    steps = {f"d{c['depth']}/s{c['seqs']}" + (f"/t{c['tokens']}" if c["tokens"] > 1 else "")
             + (f"/o{c['other']}" if c.get("other") else ""): statistics.median(c["step_s"])
             for c in raw["cases"]}
    return {"model": model.name, "threads": threads, "n_gen": n_gen, "reps": reps,
            "step_s": steps, "others_cpu_share": others}


def tensor_bytes(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The bytes of the GGUF's weight tensors: in all, by ggml type name, and those of the
    token embedding and the output head apart (with the bytes of one embedding row)."""
    gguf, _ = need_gguf()
    model = _gguf_file(path)
    reader = gguf.GGUFReader(model)
    by_type: dict[str, int] = {}
    named: dict[str, dict[str, Any]] = {}
    for tensor in reader.tensors:
        size = int(tensor.n_bytes)
        type_name = gguf.GGMLQuantizationType(tensor.tensor_type).name
        by_type[type_name] = by_type.get(type_name, 0) + size
        if tensor.name in (EMBEDDING, OUTPUT):
            rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
            named[tensor.name] = {"bytes": size, "type": type_name, "row_bytes": size // rows}
    total = sum(by_type.values())
    embd = named.get(EMBEDDING, {"bytes": 0, "type": None, "row_bytes": 0})
    out = named.get(OUTPUT, {"bytes": 0, "type": None, "row_bytes": 0})
    return {
        "total": total, "by_type": dict(sorted(by_type.items())),
        "token_embd": embd["bytes"], "token_embd_type": embd["type"],
        "token_embd_row": embd["row_bytes"], "output": out["bytes"], "output_type": out["type"],
        "per_token": total - embd["bytes"] + embd["row_bytes"],
        "tensors": len(reader.tensors),
    }
