"""The largest batch that runs, found with as few tries as the estimate allows: the step
doubles away from a starting batch (the estimator's own largest batch) until one try runs and
one fails, then bisection. Pure: benchmarks/gpu_memory_check.py hands it a try that runs the
plan in a fresh process on the GPU; the tests hand it a fake one."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

MAX_BATCH = 1024
# What torch, cuBLAS and the CUDA runtime say when device memory runs out.
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                           r"CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", re.I)


def is_out_of_memory(message: str) -> bool:
    return bool(OUT_OF_MEMORY.search(message))


def largest_batch(try_batch: Callable[[int], dict], start: int, budget_s: float, *,
                  cap: int = MAX_BATCH, clock: Callable[[], float] = time.monotonic,
                  on_try: Callable[[dict], None] | None = None) -> dict:
    """The largest batch in [1, cap] that `try_batch` runs ({"outcome": "ok"}, or "oom", or
    "error" which stops the search), assuming a batch that runs has every smaller one run.

    From `start` the step doubles (start+1, +3, +7... while tries run; start-1, -3... while
    they fail) until one try runs and one fails, then bisection: an estimate off by d takes
    about 2 log2(d) + 2 tries. No try starts after `budget_s`; the state then says the
    bracket: `largest_ok` ran, `smallest_failed` did not (None: none failed), `stopped` says
    why the search ended ("exact", "cap", "budget", "error", "not monotone")."""
    deadline = clock() + budget_s
    state: dict[str, Any] = {"start": start, "largest_ok": 0, "smallest_failed": None,
                             "tries": [], "stopped": ""}
    batch: int | None = min(max(start, 1), cap)
    step = 1
    while batch is not None:
        if clock() >= deadline:
            state["stopped"] = "budget"
            break
        outcome = _record_try(state, batch, try_batch(batch))
        if on_try is not None:
            on_try(state)
        if outcome not in ("ok", "oom"):
            state["stopped"] = "error"
            break
        batch, step = _next_batch(state, step, cap)
    return state


def _record_try(state: dict, batch: int, result: dict) -> str:
    state["tries"].append({"batch": batch, **result})
    outcome = result["outcome"]
    if outcome == "ok":
        state["largest_ok"] = max(state["largest_ok"], batch)
    elif outcome == "oom":
        failed = state["smallest_failed"]
        state["smallest_failed"] = batch if failed is None else min(failed, batch)
    return outcome


def _next_batch(state: dict, step: int, cap: int) -> tuple[int | None, int]:
    """The next batch to try and the next step; None (and `stopped` set) when done."""
    ok, failed = state["largest_ok"], state["smallest_failed"]
    if failed is None:  # every try ran: step up
        if ok >= cap:
            state["stopped"] = "cap"
            return None, step
        return min(ok + step, cap), 2 * step
    if ok == 0 and failed > 1:  # every try failed: step down
        return max(failed - step, 1), 2 * step
    if ok >= failed:
        state["stopped"] = "not monotone"
        return None, step
    if failed - ok > 1:
        return (ok + failed) // 2, step
    state["stopped"] = "exact"
    return None, step
