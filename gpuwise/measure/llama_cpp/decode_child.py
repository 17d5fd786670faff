"""Decode steps at a depth and a batch, as llama-batched-bench times them (tools/batched-bench):
the child side of `bench.time_decode_steps` (docs/speed.md, "llama.cpp on this CPU").

Job: {"kind": "decode", "path", "threads", "cases": [[depth, seqs, tokens], ...], "n_gen",
"reps", "seed"}. For each case a context holds `seqs` sequences in one unified KV cache (as
llama-server's default slots do); each sequence's prompt of `depth` random tokens (one token
for depth 0) is decoded untimed, then steps each decode `tokens` new tokens of every sequence
(1: a decode step; more: a prompt chunk at that depth), synchronising after each, and are
timed together: `n_gen` steps of one token, or one step of more. A fourth number, `other`,
first fills one more sequence with that many cells: they are in the cache the steps' attention
spans but masked out for the timed sequences (as running slots' cells are in llama-server,
llama-kv-cache.cpp `get_n_kv`). Before each of `reps` timed
runs the new positions are removed again, so every run starts at the same depth. The result
holds, per case, the seconds of one step in each run.
"""

from __future__ import annotations

import random
import time
from types import ModuleType
from typing import Any

N_UBATCH = 512


def _context(lc: ModuleType, model: Any, threads: int, n_ctx: int, seqs: int) -> Any:
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = N_UBATCH
    cparams.n_seq_max = seqs
    cparams.kv_unified = True
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context (n_ctx {n_ctx}, {seqs} seqs)")
    return ctx


def _decode(lc: ModuleType, ctx: Any, batch: Any, items: list[tuple[int, int, int]]) -> None:
    """One llama_decode of (token, position, sequence) items, logits for every item."""
    for i, (token, pos, seq) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, True
    batch.n_tokens = len(items)
    code = lc.llama_decode(ctx, batch)
    if code != 0:
        raise RuntimeError(f"llama_decode returned {code}")


def _case(lc: ModuleType, model: Any, job: dict, depth: int, seqs: int, tokens: int,
          other: int = 0) -> list[float]:
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    rng = random.Random(job["seed"])
    prompt, n_gen = max(1, depth), job["n_gen"] if tokens == 1 else 1
    n_ctx = seqs * (prompt + n_gen * tokens) + other + 256
    ctx = _context(lc, model, job["threads"], n_ctx, seqs + (other > 0))
    batch = lc.llama_batch_init(max(N_UBATCH, seqs * tokens), 0, seqs + (other > 0))
    try:
        fills = [(seq, prompt) for seq in range(seqs)] + ([(seqs, other)] if other else [])
        for seq, length in fills:
            for start in range(0, length, N_UBATCH):
                part = range(start, min(length, start + N_UBATCH))
                _decode(lc, ctx, batch, [(rng.randrange(n_vocab), p, seq) for p in part])
        lc.llama_synchronize(ctx)
        memory = lc.llama_get_memory(ctx)
        runs = []
        for _ in range(job["reps"] + 1):  # the first run warms up
            for seq in range(seqs):
                lc.llama_memory_seq_rm(memory, seq, prompt, -1)
            steps = [[(rng.randrange(n_vocab), prompt + k * tokens + i, s)
                      for s in range(seqs) for i in range(tokens)]
                     for k in range(n_gen)]
            start_ns = time.perf_counter_ns()
            for items in steps:
                _decode(lc, ctx, batch, items)
                lc.llama_synchronize(ctx)
            runs.append((time.perf_counter_ns() - start_ns) / 1e9 / n_gen)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return runs[1:]


def decode_job(job: dict) -> dict:
    import llama_cpp as lc

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(job["path"].encode(), lc.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {job['path']}")
    try:
        cases = []
        for c in job["cases"]:
            tokens = c[2] if len(c) > 2 else 1
            other = c[3] if len(c) > 3 else 0
            cases.append({"depth": c[0], "seqs": c[1], "tokens": tokens, "other": other,
                          "step_s": _case(lc, model, job, c[0], c[1], tokens, other)})
    finally:
        lc.llama_model_free(model)
    return {"cases": cases}
