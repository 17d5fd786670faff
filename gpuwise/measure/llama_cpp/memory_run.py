"""Peak resident memory of llama.cpp as a user runs it through llama-cpp-python.

`measure_llama_cpp_memory(path, ...)` runs the same job in `runs` fresh child processes
(`python -m gpuwise.measure.llama_cpp.memory_run`, the job as JSON on stdin, one JSON result
line on stdout, llama.cpp's log on stderr) and reports the median. Each child:

1. imports llama_cpp (and with it numpy and the llama.cpp libraries) and reads its resident
   set: the baseline;
2. resets the kernel's resident high-water mark to it (writing "5" to /proc/self/clear_refs;
   where that is refused, a thread samples the resident set every millisecond instead);
3. loads the model with `Llama(model_path)` and llama-cpp-python's defaults (n_ctx 512 unless
   the job gives one, n_batch and n_ubatch 512, mmap on, flash attention off unless the job
   turns it on, one thread per two cores), then `create_completion` of a prompt of `prompt_tokens` token ids (BOS, then
   ids drawn from the vocabulary past its special and byte tokens) for `new_tokens` tokens;
4. reads `VmHWM` (and the anonymous and file-backed parts of the resident set).

The peak above the baseline is what gpuwise's llama.cpp estimate, less its process overhead,
is compared with. Nothing in the environment is changed: glibc's allocator runs with its
defaults, as in a user's process.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.llama_cpp.gguf_model import N_BYTE_TOKENS, SPECIAL_TOKENS, need_llama_cpp
from gpuwise.measure.runs.child_process import child_main, last_json_line

CHILD = "gpuwise.measure.llama_cpp.memory_run"
DEFAULT_TIMEOUT_S = 900.0
SEED = 1234
STDERR_LINES = 12
MIB = 1 << 20
# llama.cpp's log lines that size its buffers, e.g. "load_tensors: CPU_REPACK model buffer
# size = 5.06 MiB" or "sched_reserve: CPU compute buffer size = 64.00 MiB".
_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")
_STATUS_KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def measure_llama_cpp_memory(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    prompt_tokens: int = 64,
    new_tokens: int = 8,
    flash_attn: bool = False,
    runs: int = 3,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """The median peak resident memory above the baseline of `runs` fresh processes that
    load the GGUF at `path` with llama-cpp-python's defaults (but `n_ctx`, and flash
    attention where `flash_attn`) and complete one prompt."""
    model = Path(path)
    if not model.is_file():
        raise GpuwiseError(f"no GGUF file at {model}", "write one with write_random_gguf()")
    if runs < 1 or prompt_tokens < 1 or new_tokens < 0:
        raise GpuwiseError("runs and prompt_tokens must be >= 1, new_tokens >= 0")
    if n_ctx is not None and prompt_tokens + new_tokens > n_ctx:
        raise GpuwiseError(f"{prompt_tokens} + {new_tokens} tokens do not fit n_ctx {n_ctx}")
    need_llama_cpp()
    job = {"path": str(model.resolve()), "n_ctx": n_ctx, "prompt_tokens": prompt_tokens,
           "new_tokens": new_tokens, "flash_attn": flash_attn, "seed": SEED}
    records = [_run_child(job, timeout_s) for _ in range(runs)]
    peaks = [r["peak_bytes"] for r in records]
    return {
        "model": model.name, "file_bytes": model.stat().st_size, "n_ctx": n_ctx,
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "flash_attn": flash_attn,
        "runs": runs,
        "peak_bytes": int(statistics.median(peaks)), "peak_bytes_runs": peaks,
        "baseline_bytes": int(statistics.median(r["baseline_bytes"] for r in records)),
        "method": records[0]["method"], "buffers_mib": records[0]["buffers_mib"],
        "anon_bytes": records[0]["anon_bytes"], "file_bytes_resident": records[0]["file_bytes"],
        "llama_cpp_python": records[0]["llama_cpp_python"],
        "system_info": records[0]["system_info"],
    }


def _run_child(job: dict, timeout_s: float) -> dict:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])  # the child imports this package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    what = f"llama.cpp memory run of {Path(job['path']).name}"
    try:
        proc = subprocess.run([sys.executable, "-m", CHILD], input=json.dumps(job),
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise GpuwiseError(f"{what} took longer than {timeout_s:g} s and was stopped") from None
    result = last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None or "error" in result:
        reason = result["error"] if result and "error" in result else f"exit code {proc.returncode}"
        lines = [line for line in proc.stderr.splitlines() if line.strip()][-STDERR_LINES:]
        raise GpuwiseError(f"{what} failed: {reason}", " | ".join(lines))
    result["buffers_mib"] = buffer_sizes(proc.stderr)
    return result


def buffer_sizes(log: str) -> dict[str, float]:
    """llama.cpp's logged buffer sizes in MiB by "<buffer> <kind>", e.g. "CPU_REPACK model"."""
    out: dict[str, float] = {}
    for name, kind, mib in _BUFFER.findall(log):
        out[f"{name} {kind}"] = out.get(f"{name} {kind}", 0.0) + float(mib)
    return out


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _STATUS_KEYS:
                out[key] = int(value.split()[0]) * 1024
    return out


def prompt_ids(n_vocab: int, count: int, seed: int) -> list[int]:
    """BOS (1), then ids drawn past the special and byte tokens of gguf_model's vocabulary."""
    rng = random.Random(seed)
    first = len(SPECIAL_TOKENS) + N_BYTE_TOKENS
    return [1] + [rng.randrange(first, n_vocab) for _ in range(count - 1)]


def memory_job(job: dict) -> dict:
    import llama_cpp
    from gpuwise.measure.runs.rss import RssSampler, reset_hwm

    before = _status()
    baseline = before["VmRSS"]
    n_ctx = None if job["n_ctx"] is None else int(job["n_ctx"])
    flash = bool(job.get("flash_attn"))

    def run() -> llama_cpp.Llama:
        # settings given only where the job changes them: otherwise llama-cpp-python's own
        if n_ctx is None:
            llm = llama_cpp.Llama(model_path=job["path"], flash_attn=flash)
        else:
            llm = llama_cpp.Llama(model_path=job["path"], n_ctx=n_ctx, flash_attn=flash)
        ids = prompt_ids(llm.n_vocab(), int(job["prompt_tokens"]), int(job["seed"]))
        llm.create_completion(ids, max_tokens=int(job["new_tokens"]), seed=int(job["seed"]))
        return llm

    if reset_hwm():
        llm = run()
        after = _status()
        peak, method = after["VmHWM"], "VmHWM reset through /proc/self/clear_refs"
    else:
        with RssSampler() as sampler:
            llm = run()
        after = _status()
        peak, method = sampler.peak, "resident set sampled every 1 ms (clear_refs unavailable)"
    return {
        "peak_bytes": peak - baseline, "baseline_bytes": baseline, "method": method,
        "anon_bytes": after["RssAnon"] - before["RssAnon"],
        "file_bytes": after["RssFile"] - before["RssFile"],
        "n_ctx": llm.n_ctx(), "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }


if __name__ == "__main__":
    sys.exit(child_main(memory_job))
