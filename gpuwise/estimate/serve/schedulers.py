"""Which sequences each runtime's scheduler runs in the next step (catalog/data/schedulers.toml,
docs/serve.md, "Schedulers"). A scheduler moves sequences from `waiting` into `running` and
returns the step's work; the simulation applies it. The paged schedulers (mixed,
prefill_first) step their decoding sequences as one group where every one of them decodes
(decoding.py), and one by one otherwise."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpuwise.estimate.serve.decoding import Decoding
from gpuwise.estimate.serve.engine import KvPool, Seq, Step


@dataclass
class Limits:
    max_batched_tokens: int
    max_seqs: int
    reserve_output: float = 0.0  # share of outputs kept free at admission (SGLang)
    overlap: bool = False  # the next step is picked while this one runs (SGLang)


def _grow(seq: Seq, n: int, kv: KvPool) -> bool:
    """Give `seq` the blocks for `n` more positions, if the pool has them."""
    blocks = kv.need(seq, seq.computed + n)
    if not kv.fits(blocks):
        return False
    kv.take(seq, blocks)
    return True


def _preempt(victim: Seq, running: list[Seq], waiting: deque[Seq], kv: KvPool,
             group: Decoding) -> None:
    """Preemption by recompute: the blocks freed, the prompt and its output so far to be
    computed again, the request first in line."""
    kv.free(victim)
    running.remove(victim)
    if group.enabled:
        group.others.remove(victim)
    victim.target = victim.req.prompt + victim.generated
    victim.computed = victim.base = 0
    waiting.appendleft(victim)


def mixed(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits,
          group: Decoding) -> Step:
    """vLLM V1: running sequences first (a token each, or their next prompt chunk), newest
    preempted while blocks run out; then waiting ones, in order, within the token budget."""
    step, budget = Step(), lim.max_batched_tokens
    if group.enabled and _all_fit(running, kv, budget, step, group):
        budget -= len(group) + sum(n for _, n in step.work)
        _admit(waiting, running, kv, lim, step, budget, group)
        return step
    group.sync(running)
    gone: set[int] = set()
    for seq in list(running):
        if budget <= 0 or seq.id in gone:
            continue
        left = seq.target - seq.computed  # > 0: a prompt (chunk) to compute
        n = min(left, budget) if left > 0 else 1
        if left <= 0 and (seq.computed - seq.base) % kv.block_tokens:
            step.work.append((seq, n))  # room in its last block: nothing to allocate
            budget -= n
            continue
        while not _grow(seq, n, kv):
            victim = running[-1]
            _preempt(victim, running, waiting, kv, group)
            gone.add(victim.id)
            step.preempted += 1
            if victim is seq:
                break
        else:
            step.work.append((seq, n))
            budget -= n
    if step.preempted:
        return step
    _admit(waiting, running, kv, lim, step, budget, group)
    return step


def _all_fit(running: list[Seq], kv: KvPool, budget: int, step: Step, group: Decoding) -> bool:
    """The common step of a busy engine: every decoding sequence a token (the group's step)
    and every other running one the rest of its prompt, when the budget and the free blocks
    hold them all (so no sequence waits for another, whatever their order)."""
    if not running:
        return True
    rest = [(s, s.target - s.computed) for s in group.others]  # their prompts' rest
    if len(group) + sum(n for _, n in rest) > budget:
        return False
    decoding = group.blocks(1)
    if not kv.fits(decoding + sum(kv.need(s, s.computed + n) for s, n in rest)):
        return False
    for seq, n in rest:
        kv.take(seq, kv.need(seq, seq.computed + n))
    kv.used += decoding
    kv.peak = max(kv.peak, kv.used)
    step.group = bool(len(group))
    step.work = rest
    return True


def _admit(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits, step: Step,
           budget: int, group: Decoding) -> None:
    """Waiting requests in order, while the budget, the running limit and the KV cache allow:
    with `reserve_output`, the cache must also keep that share of every admitted request's
    remaining output free (SGLang), so few are ever preempted."""
    reserved = 0.0
    if lim.reserve_output:
        others = group.others if group.enabled else running
        left = group.left() + sum(s.req.output - s.generated for s in others)
        reserved = lim.reserve_output * left / kv.block_tokens
    while waiting and budget > 0 and len(running) < lim.max_seqs:
        seq = waiting[0]
        n = min(seq.target - seq.computed, budget)
        more = lim.reserve_output * (seq.req.output - seq.generated) / kv.block_tokens
        if lim.reserve_output and not kv.fits(kv.need(seq, seq.computed + n)
                                              + math.ceil(reserved + more)):
            return
        reserved += more
        if not _grow(seq, n, kv):
            return
        running.append(waiting.popleft())
        if group.enabled:
            group.others.append(seq)
        step.work.append((seq, n))
        budget -= n


def prefill_first(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits,
                  group: Decoding) -> Step:
    """SGLang: a step of prompt chunks (unfinished ones first, then new requests) whenever
    any wait and fit, else a step of every running sequence's next token."""
    late = _not_yet_received(waiting, running, lim)
    step = _prefill_first(waiting, running, kv, lim, group)
    waiting.extend(reversed(late))
    return step


def _not_yet_received(waiting: deque[Seq], running: list[Seq], lim: Limits) -> list[Seq]:
    """With an overlap scheduler (SGLang v0.4 scheduler.py event_loop_overlap), the loop
    receives requests, picks and launches step k+1, then waits for step k's result: the step
    that follows the one running was chosen when that one began. Requests that arrived
    since the last choice (the end of the queue) are taken off it for this one; an idle
    engine has no step in flight and takes them at once."""
    late: list[Seq] = []
    if lim.overlap and running:
        while waiting and not waiting[-1].received:
            late.append(waiting.pop())
    for seq in reversed(waiting):  # the rest are known from here on
        if seq.received:
            break
        seq.received = True
    for seq in late:
        seq.received = True
    return late


def _prefill_first(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits,
                   group: Decoding) -> Step:
    step, budget = Step(), lim.max_batched_tokens
    for seq in group.others if group.enabled else running:  # the group's are past prompts
        if seq.prefilling and budget > 0:
            n = min(seq.target - seq.computed, budget)
            if _grow(seq, n, kv):
                step.work.append((seq, n))
                budget -= n
    _admit(waiting, running, kv, lim, step, budget, group)
    if step.work:
        return step
    return mixed(waiting, running, kv, Limits(lim.max_batched_tokens, len(running)), group)


def slots(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits,
          group: Decoding) -> Step:
    """llama.cpp server: free slots take waiting requests; one batch carries every generating
    slot's next token and prompt tokens up to n_batch. Each slot holds its own share of
    the context, so blocks here are slots' cells and never run out mid-request."""
    while waiting and len(running) < lim.max_seqs:
        running.append(waiting.popleft())
    step, budget = Step(), lim.max_batched_tokens
    for seq in running:
        if not seq.prefilling:
            step.work.append((seq, 1))
            budget -= 1
    for seq in running:
        if seq.prefilling and budget > 0:
            n = min(seq.target - seq.computed, budget)
            step.work.append((seq, n))
            budget -= n
    return step


def static(waiting: deque[Seq], running: list[Seq], kv: KvPool, lim: Limits,
           group: Decoding) -> Step:
    """transformers' generate(): a batch of the requests waiting when it is free (up to
    max_seqs), prompts padded to the longest, run until its longest output is done; finished
    sequences keep their rows (padding) until then."""
    if not running:
        while waiting and len(running) < lim.max_seqs:
            running.append(waiting.popleft())
        longest = max((s.target for s in running), default=0)
        for seq in running:
            seq.target = longest  # padded: every row computes the longest prompt
        return Step([(seq, longest) for seq in running])
    return Step([(seq, 1) for seq in running])


POLICY = {"mixed": mixed, "prefill_first": prefill_first, "slots": slots, "static": static}
