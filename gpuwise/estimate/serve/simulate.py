"""A discrete-event simulation of a serving engine (docs/serve.md, "The simulation"): requests
arrive (open loop) or are sent by clients that wait for each answer (closed loop), the
runtime's scheduler picks each step's work, and the runtime's time model times the step."""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.serve import decoding
from gpuwise.estimate.serve.cells import SharedCells, Ubatch
from gpuwise.estimate.serve.decoding import LAZY, Decoding
from gpuwise.estimate.serve.engine import Histogram, KvPool, Seq, Step
from gpuwise.estimate.serve.schedulers import POLICY, Limits
from gpuwise.estimate.serve.steady import apply_run, receive_through, steady_run
from gpuwise.workload.requests import Request

# A step's (compute-bound, memory-bound, host) seconds, from (tokens, prompt tokens, cached
# positions read, prompt attention FLOPs, prompt tokens x other sequences' cells they span).
StepParts = Callable[[int, int, float, float, float], tuple[float, float, float]]
STEP_MEMO = 1 << 15  # steps' times a simulation keeps, the most recently asked


@dataclass(frozen=True)
class Engine:
    """One replica: its scheduler, its KV pool and how long its steps take."""

    policy: str
    limits: Limits
    kv_blocks: int
    block_tokens: int
    step_parts: StepParts
    attention_flops_per_pair: float  # per (query, key) pair of prompt attention, all layers
    max_len: int = 0  # positions a sequence may reach (the model's or the runtime's; 0: any)
    token_host_s: float = 0.0  # the server's host time per streamed token, between steps
    request_host_s: float = 0.0  # and per request, before its first step
    shared_prefix: int = 0  # prompt tokens every request begins with
    prefix_cache: bool = False  # computed once and kept, its blocks shared (vLLM, SGLang)
    shared_cells: bool = False  # one cache whose every cell a prompt spans (llama.cpp)
    tiled_attention: bool = False  # ggml-cpu's flash attention in 64x64 tiles (cells.py)

    def step_seconds(self, tokens: int, prompt: int, kv_read: float, flops: float,
                     masked: float = 0.0) -> float:
        return sum(self.step_parts(tokens, prompt, kv_read, flops, masked))


@dataclass
class Trace:
    """What happened: every request's times, every step's length and decode tokens."""

    seqs: list[Seq]
    steps: int = 0
    itl: Histogram = field(default_factory=Histogram)  # every gap between a request's tokens
    busy_s: float = 0.0
    compute_s: float = 0.0  # of busy_s, compute-bound
    host_s: float = 0.0  # of busy_s, the host's (dispatch, scheduler, collectives' waits)
    end_s: float = 0.0
    preemptions: int = 0
    kv_peak_fraction: float = 0.0
    kv_timeline: list[tuple[float, float]] = field(default_factory=list)
    queue_at_last_arrival: int = 0  # waiting when the last request arrived (open loop)


def simulate(engine: Engine, requests: list[Request], clients: int = 0,
             max_steps: int = 10_000_000) -> Trace:
    """Run `requests` (arrival times used when `clients` is 0; else `clients` send them one
    after another, each as soon as its previous answer is done)."""
    seqs = [Seq(i, r, r.prompt) for i, r in enumerate(requests)]
    _check_fits(engine, seqs, max_steps)
    if engine.shared_cells:  # few slots: the same step recurs, asked of the time model once
        engine = replace(engine, step_parts=lru_cache(STEP_MEMO, typed=True)(engine.step_parts))
    enabled = gc.isenabled()  # its millions of short-lived objects form no cycles
    gc.disable()
    try:
        return _run(engine, requests, seqs, clients, max_steps)
    finally:
        if enabled:
            gc.enable()


def _run(engine: Engine, requests: list[Request], seqs: list[Seq], clients: int,
         max_steps: int) -> Trace:
    kv = KvPool(engine.kv_blocks, engine.block_tokens)
    trace = Trace(seqs)
    pending: deque[Seq] = deque(seqs)
    arrivals: dict[int, float] = {}
    if clients:
        for _ in range(min(clients, len(seqs))):
            arrivals[pending[0].id] = 0.0
            pending.popleft()
    waiting: deque[Seq] = deque(s for s in seqs if s.id in arrivals)
    running: list[Seq] = []
    cells = (SharedCells(engine.kv_blocks * engine.block_tokens,
                         tiled=engine.tiled_attention) if engine.shared_cells else None)
    now, done, cached = 0.0, 0, False
    schedule = POLICY[engine.policy]
    group = Decoding(engine.block_tokens, decoding.GROUPED and engine.policy in LAZY)
    note_every = max(1e-3, (requests[-1].arrival_s if not clients else 1.0) / 500)
    prefix = engine.prefix_cache and engine.shared_prefix > 0
    policy, itl, overlap = engine.policy, trace.itl, engine.limits.overlap
    for _ in range(max_steps):
        if not clients and pending and pending[0].req.arrival_s <= now:
            _arrive(pending, waiting, arrivals, now, trace)
        if not running and not waiting:
            if not pending:
                break
            now = pending[0].req.arrival_s
            continue
        if prefix:
            cached = _prefix(engine, waiting, running, kv, cached, group)
        nxt_arrival = pending[0].req.arrival_s if pending and not clients else math.inf
        run = steady_run(engine, running, waiting, kv, now, nxt_arrival, group)
        if run is not None:
            parts, k = run
            took = sum(parts)
            if cells:
                cells.take_run([s.id for s in running], k)
            finished = apply_run(running, k, now, now + took, policy, itl, group)
            if overlap:
                receive_through(waiting, pending if not clients else deque(),
                                now + took * (k - 1) / k)
        else:
            step = schedule(waiting, running, kv, engine.limits, group)
            trace.preemptions += step.preempted
            if not step.work and not step.group:
                group.join_decoders()
                continue
            c, m, h = (_shared_step(engine, step, cells) if cells
                       else engine.step_parts(*_step_work(engine, step, group)))
            parts, k = (c, m, h + _server_s(engine, step, group)), 1
            took = sum(parts)
            finished = _apply(step, now, now + took, policy, itl, group)
        now += took
        _account(trace, parts, took, k)
        for seq in finished:
            running.remove(seq)
            kv.free(seq)
            if cells:
                cells.finish(seq.id)
            done += 1
            if clients and pending:
                nxt = pending.popleft()
                arrivals[nxt.id] = now
                waiting.append(nxt)
        if group.enabled:
            group.join_decoders()
        kv.note(now, note_every)
    else:
        raise GpuwiseError(f"the simulation did not finish in {max_steps:,} steps",
                           "fewer --requests, or a lower --rate")
    trace.end_s, trace.kv_timeline = now, kv.timeline
    trace.kv_peak_fraction = kv.peak / kv.blocks if kv.blocks else 0.0
    for seq in seqs:  # arrival times as the clients sent them (closed loop)
        seq.req = Request(arrivals.get(seq.id, seq.req.arrival_s), seq.req.prompt, seq.req.output)
    return trace


def _prefix(engine: Engine, waiting: deque[Seq], running: list[Seq], kv: KvPool,
            cached: bool, group: Decoding) -> bool:
    """The prefix cache: once a request has computed the shared prefix, its blocks stay in
    the pool (counted once), and every request that starts after it skips those tokens."""
    if not engine.prefix_cache or engine.shared_prefix <= 0:
        return False
    if not cached:
        if not any(group.computed(s) >= engine.shared_prefix for s in running):
            return False
        kv.used += -(-engine.shared_prefix // kv.block_tokens)
        kv.peak = max(kv.peak, kv.used)
        for seq in waiting:
            _skip_prefix(engine, seq)
        return True
    if waiting:  # the newest arrivals (and a request preempted to the front)
        _skip_prefix(engine, waiting[0])
        for seq in reversed(waiting):
            if seq.base or seq.computed:
                break
            _skip_prefix(engine, seq)
    return True


def _skip_prefix(engine: Engine, seq: Seq) -> None:
    if seq.computed == 0 and seq.target > engine.shared_prefix:
        seq.computed = seq.base = engine.shared_prefix


def _arrive(pending: deque[Seq], waiting: deque[Seq], arrivals: dict[int, float], now: float,
            trace: Trace) -> None:
    """Requests that have arrived by `now` join the queue (open loop)."""
    while pending and pending[0].req.arrival_s <= now:
        seq = pending.popleft()
        arrivals[seq.id] = seq.req.arrival_s
        waiting.append(seq)
        if not pending:
            trace.queue_at_last_arrival = len(waiting)


def _account(trace: Trace, parts: tuple[float, float, float], took: float, steps: int) -> None:
    trace.steps += steps
    trace.busy_s += took
    trace.compute_s += parts[0]
    trace.host_s += parts[2]


def _check_fits(engine: Engine, seqs: list[Seq], max_steps: int) -> None:
    """Refuse a workload whose longest request cannot fit in the KV cache on its own, or
    that takes more steps than are simulated."""
    least = sum(s.req.output for s in seqs) / max(1, engine.limits.max_seqs)
    if least > max_steps:
        raise GpuwiseError(f"{len(seqs):,} requests of these lengths take at least "
                           f"{least:,.0f} engine steps, more than the {max_steps:,} simulated",
                           "fewer --requests, or fewer --new-tokens")
    longest = max(seqs, key=lambda s: s.req.prompt + s.req.output)
    positions = longest.req.prompt + longest.req.output
    per_seq = engine.kv_blocks * engine.block_tokens
    if engine.policy == "slots":
        per_seq //= max(1, engine.limits.max_seqs)
    if engine.max_len and positions > engine.max_len:
        raise GpuwiseError(f"a request of {longest.req.prompt:,} + {longest.req.output:,} tokens "
                           f"is longer than the {engine.max_len:,} positions the model takes",
                           "shorter requests (the runtime refuses longer ones)")
    if positions > per_seq:
        raise GpuwiseError(f"the KV cache holds {per_seq:,} positions a sequence; a request of "
                           f"{longest.req.prompt:,} + {longest.req.output:,} tokens needs "
                           f"{positions:,}", "shorter requests, a larger --ctx, more memory "
                           "(--gpus, --tp) or lower-precision weights")


def _server_s(engine: Engine, step: Step, group: Decoding | None = None) -> float:
    """The server's own host time in a step: each token it streams, each request it starts."""
    if not (engine.token_host_s or engine.request_host_s):
        return 0.0
    started = sum(1 for seq, _ in step.work if seq.computed == 0)
    tokens = len(step.work) + (len(group) if group is not None and step.group else 0)
    return started * engine.request_host_s + tokens * engine.token_host_s


def _shared_step(engine: Engine, step: Step, cells: SharedCells) -> tuple[float, float, float]:
    """A step in llama.cpp's shared cache: new requests take their slots first, then the
    batch's tokens their cells, one ubatch (a graph evaluation) at a time."""
    seqs = {}
    for seq, _ in step.work:
        seqs[seq.id] = seq
        if seq.computed == 0:
            cells.start(seq.id)
    c = m = h = 0.0
    done = dict.fromkeys(seqs, 0)  # a sequence's tokens in the step's earlier ubatches
    for ub in cells.take([(seq.id, n) for seq, n in step.work]):
        ci, mi, hi = engine.step_parts(*_ubatch_work(engine, ub, seqs, done))
        c, m, h = c + ci, m + mi, h + hi
    return c, m, h


def _ubatch_work(engine: Engine, ub: Ubatch, seqs: dict[int, Seq],
                 done: dict[int, int]) -> tuple[int, int, float, float, float]:
    """A ubatch's tokens, prompt tokens, cached positions read, prompt attention FLOPs and
    (prompt token, masked cell) pairs. On the tiled path (cells.py) attention is its tiles:
    computed ones at the attention rate, skipped ones as masked pairs; otherwise each
    prompt token spans the cells not its own that are below the span's end. A sequence's
    positions are its own (`done`: its tokens in the step's earlier ubatches), whether or
    not a full cache placed its cells."""
    tokens = prompt = 0
    kv_read = pairs = masked = 0.0
    for sid, _, n in ub.parts:
        start = seqs[sid].computed + done[sid]
        done[sid] += n
        tokens += n
        if start < seqs[sid].target:
            prompt += n
            pairs += n * (start + n / 2)
            masked += n * max(0, ub.span - start - n)
        kv_read += start + n
    if ub.computed:
        kv_read, pairs, masked = 0.0, float(ub.computed), float(ub.skipped)
    return tokens, prompt, kv_read, pairs * engine.attention_flops_per_pair, masked


def _step_work(engine: Engine, step: Step, group: Decoding | None = None,
               ) -> tuple[int, int, float, float, float]:
    """The step's tokens, prompt tokens, cached positions read and prompt attention FLOPs."""
    tokens = prompt = 0
    kv_read = pairs = 0.0
    if group is not None and step.group:  # each member's token reads its positions and itself
        tokens, kv_read = len(group), float(group.positions() + len(group))
    for seq, n in step.work:
        tokens += n
        kv_read += seq.computed + n
        if seq.computed < seq.target:  # a prompt chunk (the property, inlined: a hot loop)
            prompt += n
            pairs += n * (seq.computed + n / 2)
    return tokens, prompt, kv_read, pairs * engine.attention_flops_per_pair, 0.0


def _apply(step: Step, start: float, now: float, policy: str, itl: Histogram,
           group: Decoding | None = None) -> list[Seq]:
    """Advance each sequence by the step's work (from `start` to `now`), counting each token's
    gap since the request's last one; the ones whose last token came out (a static batch:
    when its longest is done). A hot loop: most tokens follow one from the step before."""
    finished = group.step(1, start, now, itl, run=False) if group is not None and step.group else []
    since: dict[float, int] = {}  # previous token's time -> tokens out now (one log each)
    after_last_step = 0  # of them, those whose previous token came out at `start`
    for seq, n in step.work:
        target = seq.target
        was_prefilling = seq.computed < target
        seq.computed += n
        if was_prefilling and seq.computed < target:
            continue  # a prompt chunk: no token yet
        output = seq.req.output
        if seq.generated < output:
            seq.generated += 1
            last = seq.last_token_s
            if seq.first_token_s < 0:
                seq.first_token_s = now
            elif last == start:
                after_last_step += 1
            else:
                since[last] = since.get(last, 0) + 1
            seq.last_token_s = now
            if seq.generated == output:
                seq.done_s = now
        if seq.done_s >= 0 and policy != "static":
            finished.append(seq)
    if after_last_step:
        itl.add(now - start, after_last_step)
    for last, count in since.items():
        itl.add(now - last, count)
    if policy == "static" and all(s.done_s >= 0 for s, _ in step.work):
        finished = [s for s, _ in step.work]
    return finished
