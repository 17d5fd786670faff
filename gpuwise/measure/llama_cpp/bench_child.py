"""The child process of every llama.cpp job, and the parent's call of it.

`run_child(job, timeout_s, what)` starts `python -m gpuwise.measure.llama_cpp.bench_child`,
sends the job as JSON on stdin and reads one JSON result line from stdout; llama.cpp's log goes
to the child's stderr, which the parent quotes only when the child fails. A child that runs
past `timeout_s` is killed. Either way the caller gets a GpuwiseError.

Jobs:
- {"kind": "quantize", "src", "dst", "ftype" (a llama_cpp LLAMA_FTYPE_* name), "nthread"}
- {"kind": "time", "path", "threads", "n_prompt", "n_gen", "reps", "n_batch", "n_ubatch",
  "flash_attn" (null: llama.cpp's auto), "seed"}: llama-bench's loops (tools/llama-bench):
  the pp test decodes n_prompt random tokens (BOS first) in batches of n_batch into an empty
  KV cache; the tg test decodes n_gen tokens one at a time, synchronising after each, into
  an empty cache. Each test has its own context (n_ctx = its tokens, as llama-bench) and one
  warm-up (the whole prompt; one generated token); the cache is cleared before each timed
  repetition. The result holds each repetition's nanoseconds.
- {"kind": "decode", ...}: decode steps at a depth and a batch (decode_child.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.runs.child_process import child_main, last_json_line

CHILD = "gpuwise.measure.llama_cpp.bench_child"
STDERR_LINES = 12
# llama.cpp log lines worth keeping in a record: buffers chosen, attention kernels, fallbacks.
NOTE_MARKERS = ("REPACK", "model buffer size", "Flash Attention", "flash_attn", "fallback")
_LOG: list[str] = []
_LOG_CALLBACK: list[Any] = []  # keeps the ctypes callback alive while llama.cpp holds it


def run_child(job: dict, timeout_s: float, what: str) -> dict:
    """Run one job in a fresh process and return its result; GpuwiseError when it fails."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])  # the child imports this package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run([sys.executable, "-m", CHILD], input=json.dumps(job),
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        stderr = (
            exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        )
        raise GpuwiseError(f"{what} took longer than {timeout_s:g} s and was stopped",
                           _tail(stderr) or "give it a longer timeout_s") from None
    result = last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None or "error" in result:
        reason = result["error"] if result and "error" in result else f"exit code {proc.returncode}"
        if proc.returncode == -signal.SIGILL:  # an instruction this CPU lists but cannot run
            raise GpuwiseError(f"{what} failed: llama.cpp ran an instruction this CPU cannot "
                               "(SIGILL; AMX on a VM that lists it without enabling it)",
                               "reinstall llama-cpp-python built without AMX: CMAKE_ARGS=\"-DGGML_NATIVE=OFF "
                               "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON ...\" (docs/speed.md, "
                               "\"llama.cpp on this CPU\")")
        raise GpuwiseError(f"{what} failed: {reason}", _tail(proc.stderr))
    return result


def _tail(stderr: str | None) -> str:
    lines = [line for line in (stderr or "").splitlines() if line.strip()][-STDERR_LINES:]
    return "child stderr (last lines): " + " | ".join(lines) if lines else ""


def _capture_log(lc: ModuleType) -> None:
    """Keep llama.cpp's log lines (for the notes) and pass them on to stderr."""

    @lc.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode(errors="replace")
        _LOG.append(line)
        sys.stderr.write(line)

    _LOG_CALLBACK.append(callback)
    lc.llama_log_set(callback, ctypes.c_void_p(0))


def log_notes(log: list[str]) -> list[str]:
    """The distinct log lines that say how llama.cpp ran the model."""
    notes: list[str] = []
    for line in "".join(log).splitlines():
        line = " ".join(line.split())
        if any(marker in line for marker in NOTE_MARKERS) and line not in notes:
            notes.append(line)
    return notes


def quantize_job(job: dict) -> dict:
    import llama_cpp as lc

    _capture_log(lc)
    params = lc.llama_model_quantize_default_params()
    params.nthread = int(job["nthread"])
    params.ftype = getattr(lc, job["ftype"])
    part = job["dst"] + ".part"
    code = lc.llama_model_quantize(job["src"].encode(), part.encode(), ctypes.byref(params))
    if code != 0:
        with contextlib.suppress(OSError):
            os.remove(part)
        raise RuntimeError(f"llama_model_quantize returned {code}")
    os.replace(part, job["dst"])
    return {"dst": job["dst"], "bytes": os.path.getsize(job["dst"])}


def _context(lc: ModuleType, model: Any, job: dict, n_ctx: int) -> Any:
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = job["n_batch"]
    cparams.n_ubatch = job["n_ubatch"]
    cparams.n_threads = cparams.n_threads_batch = job["threads"]
    fa = job["flash_attn"]
    cparams.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_AUTO if fa is None else
                               lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa else
                               lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context (n_ctx {n_ctx})")
    lc.llama_set_n_threads(ctx, job["threads"], job["threads"])
    return ctx


def _token_batches(lc: ModuleType, tokens: list[int], size: int) -> list[Any]:
    """The tokens as ctypes arrays of at most `size` each (made before the clock starts)."""
    return [(lc.llama_token * len(part))(*part)
            for part in (tokens[i : i + size] for i in range(0, len(tokens), size))]


def _decode_all(lc: ModuleType, ctx: Any, batches: list[Any], sync_each: bool) -> int:
    """llama_decode each batch; returns nanoseconds from the first decode to the last sync."""
    start = time.perf_counter_ns()
    for arr in batches:
        code = lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(arr)))
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        if sync_each:
            lc.llama_synchronize(ctx)
    lc.llama_synchronize(ctx)
    return time.perf_counter_ns() - start


def _run_test(lc: ModuleType, model: Any, job: dict, test: str) -> list[int]:
    """One llama-bench test ("pp" or "tg"): a warm-up, then `reps` timed runs (ns each)."""
    n = job["n_prompt"] if test == "pp" else job["n_gen"]
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    bos = lc.llama_vocab_bos(vocab) if lc.llama_vocab_get_add_bos(vocab) else None
    rng = random.Random(job["seed"])

    def tokens(count: int) -> list[int]:
        drawn = [rng.randrange(n_vocab) for _ in range(count)]
        return [bos, *drawn[1:]] if bos is not None and drawn else drawn

    size = job["n_batch"] if test == "pp" else 1
    ctx = _context(lc, model, job, n)
    try:
        memory = lc.llama_get_memory(ctx)
        lc.llama_memory_clear(memory, False)
        _decode_all(lc, ctx, _token_batches(lc, tokens(n if test == "pp" else 1), size), True)
        samples = []
        for _ in range(job["reps"]):
            batches = _token_batches(lc, tokens(n), size)
            lc.llama_memory_clear(memory, False)
            samples.append(_decode_all(lc, ctx, batches, sync_each=test == "tg"))
    finally:
        lc.llama_free(ctx)
    return samples


def time_job(job: dict) -> dict:
    import llama_cpp as lc

    _capture_log(lc)
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(job["path"].encode(), lc.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {job['path']}")
    result: dict[str, Any] = {"pp_ns": [], "tg_ns": []}
    try:
        if job["n_prompt"] > 0:
            result["pp_ns"] = _run_test(lc, model, job, "pp")
        if job["n_gen"] > 0:
            result["tg_ns"] = _run_test(lc, model, job, "tg")
    finally:
        lc.llama_model_free(model)
    result["llama_cpp_python"] = lc.__version__
    result["system_info"] = lc.llama_print_system_info().decode(errors="replace").strip()
    result["notes"] = log_notes(_LOG)
    return result


def run_job(job: dict) -> dict:
    from gpuwise.measure.llama_cpp.decode_child import decode_job

    kinds = {"quantize": quantize_job, "time": time_job, "decode": decode_job}
    if job.get("kind") not in kinds:
        raise ValueError(f"unknown job kind {job.get('kind')!r}")
    return kinds[job["kind"]](job)


if __name__ == "__main__":
    sys.exit(child_main(run_job))
