"""Steady runs (docs/serve.md, "How fast it simulates"): decode steps that run unchanged, the
same sequences one token each with nobody admitted, simulated as one. A run ends where the
first sequence finishes, or where an arrival could be admitted; its steps' time is one step's
at the run's middle context (the KV read grows linearly)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

from gpuwise.estimate.serve.decoding import Decoding
from gpuwise.estimate.serve.engine import Histogram, KvPool, Seq
from gpuwise.estimate.serve.schedulers import Limits

Parts = tuple[float, float, float]


class Engine(Protocol):
    """What a steady run reads of simulate.Engine (defined there, which imports this)."""

    @property
    def policy(self) -> str: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def shared_cells(self) -> bool: ...
    @property
    def token_host_s(self) -> float: ...

    @property
    def step_parts(self) -> Callable[[int, int, float, float, float], Parts]: ...

    def step_seconds(self, tokens: int, prompt: int, kv_read: float, flops: float,
                     masked: float = 0.0) -> float: ...


# Where llama.cpp's shared cells are kept, fewer steps than this in a steady run are simulated
# one by one (each step places its tokens in cells); elsewhere a run of any length is one.
STEADY_MIN_STEPS = 4
RUNS = True  # False: every step simulated one by one (the tests' reference)

def steady_run(engine: Engine, running: list[Seq], waiting: deque[Seq], kv: KvPool, now: float,
               next_arrival: float, group: Decoding) -> tuple[Parts, int] | None:
    """(seconds, steps) of the decode steps that run unchanged from here, their blocks taken:
    every running sequence past its prompt, nobody admitted (none waiting, no free slot or
    batch, or the first in line does not fit and will not while the run takes blocks), the
    first of them to finish or the next arrival that could be admitted ends the run. None:
    step by step."""
    lim = engine.limits
    if not running or not RUNS or len(running) > lim.max_batched_tokens:
        return None
    # No scheduler admits a request while its running limit is reached (a static batch
    # never does); one that picks a step ahead (SGLang's overlap) still sees each arrival.
    closed = engine.policy == "static" or len(running) >= lim.max_seqs
    blocked = bool(waiting) and not closed
    if blocked and not lim.reserve_output and not _blocked(engine, running, waiting[0], kv, 0):
        return None
    sums = _group_sums(group) if group.enabled else _batch_sums(running)
    if sums is None:
        return None  # some are in their prompts
    k, kv_now, left = sums
    if blocked and lim.reserve_output and not _blocked(engine, running, waiting[0], kv, left):
        return None
    n = len(running)
    sees_arrivals = not blocked and (not closed or (lim.overlap and engine.policy != "static"))
    least = STEADY_MIN_STEPS if engine.shared_cells else 1
    if sees_arrivals and math.isfinite(next_arrival) and least <= k < math.inf:
        first = engine.step_seconds(n, 0, kv_now + n, 0.0) + n * engine.token_host_s  # as _server_s
        # an arrival during the first step is not seen before the second (step by step too)
        k = max(min(k, int((next_arrival - now) / first)), 1)
    if not least <= k < math.inf:
        return None
    k = int(k)
    if not _take_blocks(running, k, kv, group):
        return None
    middle = engine.step_parts(n, 0, kv_now + n * (k + 1) / 2, 0.0, 0.0)
    return (k * middle[0], k * middle[1], k * (middle[2] + n * engine.token_host_s)), k


def _group_sums(group: Decoding) -> tuple[float, int, int] | None:
    if group.others:
        return None
    return group.steps_to_first_end(), group.positions(), group.left()


def _batch_sums(running: list[Seq]) -> tuple[float, int, int] | None:
    """(steps to the first done, positions held, outputs to come) of a batch past its prompts
    (None: one is in its prompt); one pass: a hot loop."""
    k, kv_now, left = math.inf, 0, 0
    for s in running:
        if s.computed < s.target:
            return None
        rest = s.req.output - s.generated
        if 0 < rest < k:
            k = rest
        kv_now += s.computed
        left += rest
    return k, kv_now, left


def _blocked(engine: Engine, running: list[Seq], head: Seq, kv: KvPool, left: int) -> bool:
    """The request first in line is not admitted now, nor at any step of a decode run from
    here: the blocks in use only grow in a run, so one that does not fit now never does (with
    SGLang's reserve on a token-granular pool, the blocks in use grow by a token a sequence a
    step and the reserve shrinks by its share of one: their sum grows too). `left`: the
    running sequences' outputs still to come (for the reserve)."""
    lim, bt = engine.limits, kv.block_tokens
    budget = lim.max_batched_tokens - (len(running) if engine.policy == "mixed" else 0)
    if budget <= 0:
        return True  # the decode tokens take the step's whole budget (mixed)
    if engine.policy not in ("mixed", "prefill_first"):
        return False
    if lim.reserve_output and not (bt == 1 and lim.reserve_output <= 1):
        return False
    n = min(head.target - head.computed, budget)
    need = kv.need(head, head.computed + n)
    if lim.reserve_output:  # as schedulers._admit
        reserved = lim.reserve_output * left / bt
        more = lim.reserve_output * (head.req.output - head.generated) / bt
        need += math.ceil(reserved + more)
    return not kv.fits(need)


def _take_blocks(running: list[Seq], k: int, kv: KvPool, group: Decoding) -> bool:
    """The blocks `k` more positions of each running sequence need, taken if the pool has
    them (the decoding group's from its phases, else each sequence's)."""
    bt = kv.block_tokens
    if group.enabled:
        blocks = group.blocks(k)
        if not kv.fits(blocks):
            return False
        kv.used += blocks
        kv.peak = max(kv.peak, kv.used)
        return True
    needs = [max(0, -(-(s.computed + k - s.base) // bt) - s.blocks) for s in running]  # kv.need
    blocks = sum(needs)
    if not kv.fits(blocks):
        return False
    for s, more in zip(running, needs, strict=True):
        s.blocks += more
    kv.used += blocks
    kv.peak = max(kv.peak, kv.used)
    return True


def apply_run(running: list[Seq], k: int, start: float, end: float, policy: str,
              itl: Histogram, group: Decoding) -> list[Seq]:
    """`k` decode steps of every running sequence from `start` to `end`, evenly spaced (their
    blocks taken by steady_run); the sequences done at its end."""
    if group.enabled:
        return group.step(k, start, end, itl, run=True)
    gap = (end - start) / k
    since: dict[float, int] = {}
    after_last_step = 0  # tokens whose previous one came out at `start` (most)
    finished: list[Seq] = []
    for seq in running:
        seq.computed += k
        output = seq.req.output
        if seq.generated < output:
            seq.generated += k
            last = seq.last_token_s
            if last == start:
                after_last_step += 1
            else:
                since[last] = since.get(last, 0) + 1
            seq.last_token_s = end
            if seq.generated == output:
                seq.done_s = end
                finished.append(seq)
    if after_last_step:
        since[start] = after_last_step
    for last, count in since.items():
        itl.add(start + gap - last, count)
        if k > 1:
            itl.add(gap, count * (k - 1))
    if policy == "static":
        return list(running) if all(s.done_s >= 0 for s in running) else []
    return finished


def receive_through(waiting: deque[Seq], pending: deque[Seq], last_start: float) -> None:
    """After a run, the requests a scheduler that picks a step ahead has seen, as step by step:
    each step sees every request waiting when it starts (schedulers._not_yet_received), so
    the run's last step (starting at `last_start`) has seen those that arrived by then."""
    for seq in reversed(waiting):
        if seq.received:
            break
        seq.received = True
    for seq in pending:
        if seq.req.arrival_s > last_start:
            break
        seq.received = True
