"""The time of one step of a model under a runtime timed by the roofline (transformers,
torch.compile, vLLM, SGLang; docs/speed.md, "One step"): a batch of new tokens (prompt
chunks and one token per decoding sequence) through the weights, and attention over the
cached positions they read. `infer`'s prefill and decode are this step for one request, and
`serve` and `advise` step their simulated engines with it, so a decode step takes the same
time in every command. llama.cpp's step is estimate/speed/ggml_step.py.

The context-free ops (every op but attention and the cache's copies) depend only on the
step's tokens and logits: they are timed once per size (sizes past 64 at 32 a doubling,
linear between) and summed; attention's rows are timed for each step at its shape."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import RuntimeSpeed, WeightKernel, runtime_speed
from gpuwise.estimate.memory.weights import mean_weight_bytes
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.roofline import (
    OpTime,
    PhaseTime,
    dispatch_overhead,
    fresh_bytes_per_s,
    op_count_mode,
    time_op,
)
from gpuwise.estimate.speed.runtime_time import kernel_for, runtime_rates
from gpuwise.estimate.speed.step_grid import Sums, bucket_above, bucket_below
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.expert_parallel import expert_parallel_share
from gpuwise.workload.ops import (
    Op,
    Shape,
    context_ops,
    forward_ops,
    kv_append_ops,
    tensor_parallel_share,
)
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.prefill_heap import prefill_heap_events

# The replay runs a prefill of 4 and of 8 layers and extends the difference to the model's
# depth (layers repeat: within 4% of the whole model's replay on every time-suite case, at
# 3 ms against 10-15 ms for 24-32 layers).
SAMPLED_LAYERS = (4, 8)
CONTEXT_OPS = frozenset({"attention", "repeat_kv", "kv_append", "lm_head"})


def decode_context(prompt_tokens: int, new_tokens: int) -> float:
    """The positions a decode step reads on average over a request's generation: its tokens
    after the first run at prompt + 1 ... prompt + new - 1, the mean of which is this (and
    with one new token, the step that would come next)."""
    return prompt_tokens + max(2, new_tokens) / 2


def plan_shape(plan: InferencePlan, arch: Architecture, batch: int, tokens: int,
               context: float, logits: int) -> Shape:
    return Shape(batch, tokens, context, *shape_bytes(plan, arch), plan.attention,  # type: ignore[arg-type]
                 logits)


def shape_bytes(plan: InferencePlan, arch: Architecture) -> tuple[float, float, float]:
    """(activation, weight, KV) bytes per element of `plan`'s passes."""
    fmt = plan.weight_format
    compute = weight_format(fmt.compute_dtype).bytes_per_element
    kv = weight_format(plan.kv_dtype or fmt.compute_dtype).bytes_per_element
    per_weight = (plan.stored_weights.total_bytes / count_params(arch).total
                  if plan.stored_weights else mean_weight_bytes(arch, fmt.id))
    return compute, per_weight, kv


@lru_cache(maxsize=4096)
def inference_ops(arch: Architecture, shape: Shape, fused: bool, tp: int,
                  expert_parallel: bool = False) -> tuple[Op, ...]:
    """The ops of one inference pass on one of `tp` devices (routed experts split whole under
    `expert_parallel`); cached, as a sweep asks for the same model and shape on every device."""
    ops = forward_ops(arch, shape)
    if fused:
        # Compiled and serving runtimes fuse norms, rotary, activations and residuals into
        # neighbouring kernels, and write the cache in place: what remains is the matmul
        # and attention traffic.
        ops = [op for op in ops if op.kind in ("matmul", "attention", "embedding")]
    else:
        ops += kv_append_ops(arch, shape)
    if expert_parallel:
        return tuple(expert_parallel_share(op, tp, arch.moe, shape.rows) for op in ops)
    return tuple(tensor_parallel_share(op, tp) for op in ops)


def tp_allreduce_s(arch: Architecture, rows: int, compute_bytes: float, rates: DeviceRates,
                   tp: int, expert_parallel: bool = False) -> float:
    """Two all-reduces of the hidden state per layer under tensor parallelism. Under expert
    parallelism a sparse layer's second is two all-to-alls, dispatching each token to the
    devices of its experts and combining their outputs, each (tp - 1)/tp of the tokens'
    hidden states: the all-reduce's bytes over the same link, one more latency."""
    if tp <= 1:
        return 0.0
    size = rows * arch.hidden_size * compute_bytes * 2 * (tp - 1) / tp
    bw = rates.interconnect_bytes_per_s or rates.memory_bytes_per_s
    sparse = arch.moe.layers if expert_parallel and arch.moe else 0
    all_reduces = 2 * arch.num_layers - sparse
    all_to_alls = 2 * sparse
    return (all_reduces * (rates.collective_latency_s + size / bw)
            + all_to_alls * (rates.collective_latency_s + size / 2 / bw))


@dataclass(frozen=True, eq=False)  # hashed by identity: the caches below key on it
class RooflineStep:
    """Steps of `plan` on one replica of `tp` devices with `rates` under `runtime` (the
    plan's if empty)."""

    arch: Architecture
    plan: InferencePlan
    device: DeviceRates
    tp: int = 1
    runtime: str = ""
    rt: RuntimeSpeed = field(init=False, repr=False)
    kernel: WeightKernel | None = field(init=False, repr=False)
    rates: DeviceRates = field(init=False, repr=False)  # the device's, as the runtime reaches them
    bytes_: tuple[float, float, float] = field(init=False, repr=False)  # shape_bytes

    def __post_init__(self) -> None:
        rt = runtime_speed(self.runtime or self.plan.runtime)
        rt.check_device(self.device.kind, self.device.name)
        kernel = kernel_for(rt, self.plan.weights, self.device.kind, self.plan.quant_kernel)
        object.__setattr__(self, "rt", rt)
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "rates", runtime_rates(self.device, rt, kernel))
        object.__setattr__(self, "bytes_", shape_bytes(self.plan, self.arch))

    @property
    def eager(self) -> bool:
        return self.rt.dispatch == "eager"

    def parts(self, tokens: int, prompt_tokens: int, kv_read: float,
              prompt_attention_flops: float = 0.0, masked: float = 0.0,
              prompts: int = 1) -> tuple[float, float, float]:
        """(compute-bound, memory-bound, host) seconds of a step of `tokens` new tokens,
        `prompt_tokens` of them from `prompts` prompts whose attention costs
        `prompt_attention_flops`, the step's attention reading `kv_read` cached positions
        (summed over its sequences). `masked` is llama.cpp's alone."""
        if tokens <= 0:
            return 0.0, 0.0, 0.0
        c, m, extra, overhead, comm = self._seconds(tokens, prompt_tokens, kv_read,
                                                    prompt_attention_flops, prompts)
        return c, m, extra + comm + overhead

    def phase(self, name: str, tokens: int, prompt_tokens: int, kv_read: float,
              prompt_attention_flops: float = 0.0, prompts: int = 1) -> PhaseTime:
        """The same step as an op table (infer's prefill and decode)."""
        rows: list[OpTime] = []
        c, m, extra, overhead, comm = self._seconds(tokens, prompt_tokens, kv_read,
                                                    prompt_attention_flops, prompts, rows)
        ops = tuple(rows)
        flops = sum(t.op.flops * t.op.count for t in ops)
        moved = sum(t.op.bytes * t.op.count for t in ops)
        # seconds summed as parts() sums them, so that a step's time is the same to the bit
        return PhaseTime(name, c + m + (extra + comm + overhead), c + m + extra, overhead, comm,
                         flops, moved, ops)

    def _seconds(self, tokens: int, prompt_tokens: int, kv_read: float, pf: float,
                 prompts: int, rows: list[OpTime] | None = None,
                 ) -> tuple[float, float, float, float, float]:
        """(compute-bound, memory-bound, the host's rows, dispatch the device cannot hide,
        collectives) seconds; the rows timed go to `rows` when given (a hot path: a
        simulation asks for a step's seconds alone)."""
        decoding = tokens - prompt_tokens
        # only an eager runtime's host rows depend on more than whether prompts are in it
        extra, host = (_extra_rows(self, decoding, prompt_tokens, prompts) if self.eager
                       else _extra_rows(self, 0, min(1, prompt_tokens), 1))
        if prompt_tokens:
            c, m = self._device_s(tokens, prompt_tokens, kv_read, pf, prompts, rows)
        else:  # decode alone: the sums at the grid's contexts, linear between
            context = kv_read / tokens
            low = bucket_below(int(context))
            c, m = _decoding_s(self, tokens, low)
            if context > low:
                high = bucket_above(low + 1)
                c2, m2 = _decoding_s(self, tokens, high)
                f = (context - low) / (high - low)
                c, m = c + f * (c2 - c), m + f * (m2 - m)
            if rows is not None:
                self._device_s(tokens, 0, kv_read, 0.0, prompts, rows)
        if rows is not None:
            rows += extra
        overhead = _overhead(self, prompt_tokens > 0)
        if self.rates.kind != "cpu":
            overhead = max(0.0, overhead - (c + m))  # only the part the device cannot hide
        return c, m, host, overhead, _comm(self, tokens)

    def _device_s(self, tokens: int, prompt_tokens: int, kv_read: float, pf: float,
                  prompts: int, rows: list[OpTime] | None = None) -> tuple[float, float]:
        """(compute-bound, memory-bound) seconds of the step's ops on the device, kernel
        launches included; its rows to `rows` when given."""
        decoding = tokens - prompt_tokens
        logits = tokens if self.plan.logits == "all" else decoding + (prompts if prompt_tokens else 0)
        dense, head = _dense_at(self, tokens), _head(self, max(1, logits))
        prompt, decode = self._context(tokens, prompt_tokens, kv_read, pf, prompts,
                                       rows is not None)
        c = dense.compute_s + head.compute_s + prompt.compute_s + decode.compute_s
        m = dense.memory_s + head.memory_s + prompt.memory_s + decode.memory_s
        kernels = dense.kernels + head.kernels + prompt.kernels + decode.kernels
        if rows is not None:
            rows += [*dense.rows, *head.rows, *prompt.rows, *decode.rows]
        return c, m + kernels * self.rates.kernel_latency_s

    def shape(self, batch: int, tokens: int, context: float, logits: int) -> Shape:
        """`plan_shape` of this step's plan, its bytes per element computed once."""
        return Shape(batch, tokens, context, *self.bytes_, self.plan.attention,  # type: ignore[arg-type]
                     logits)

    def _context(self, tokens: int, prompt_tokens: int, kv_read: float, pf: float,
                 prompts: int, rows: bool = False) -> tuple[Sums, Sums]:
        """Attention over the cache (and, in eager runtimes, the cache's copy) of the step's
        prompts and of its decoding sequences. Its prompts are timed as `prompts` equal
        prompts from the start, scaled to the FLOPs and positions given; its decoding
        sequences at their mean context, on the grid the context-free ops are timed on
        (`bucket_below`, linear between; with `rows`, the rows too)."""
        prompt = decode = Sums()
        decoding = tokens - prompt_tokens
        if prompt_tokens:
            per = max(1, prompt_tokens // max(1, prompts))
            prompt_read = prompts * per
            flop_scale = pf / _causal_flops(self.arch, prompts, per) if pf else 1.0
            read_scale = max(1.0, (kv_read - decoding) / prompt_read) if not decoding else 1.0
            prompt = _prompting(self, prompts, per, flop_scale, read_scale)
            if decoding:  # the decoding sequences read the rest of the positions
                kv_read = max(float(decoding), kv_read - prompt_read)
        if decoding:
            context = kv_read / decoding
            low = bucket_below(int(context))
            decode = _decoding(self, decoding, low)
            if context > low:
                high = bucket_above(low + 1)
                decode = decode.between(_decoding(self, decoding, high),
                                        (context - low) / (high - low), rows)
        return prompt, decode

    def _context_ops(self, shape: Shape) -> tuple[Op, ...]:
        """The ops that read the cache, one device's share (the rest are `_dense`'s)."""
        return shared_context_ops(self.arch, shape, self.rt.fused, self.tp)

    def _timed(self, op: Op, flop_scale: float = 1.0, read_scale: float = 1.0) -> OpTime:
        if flop_scale != 1.0 or read_scale != 1.0:
            op = replace(op, flops=op.flops * flop_scale, bytes=op.bytes * read_scale)
        return time_op(op, self.rates, self.plan.weight_format.compute_dtype)


@lru_cache(maxsize=65536)
def shared_context_ops(arch: Architecture, shape: Shape, fused: bool, tp: int) -> tuple[Op, ...]:
    """`context_ops` on one of `tp` devices; cached across devices, as advise steps the same
    model and shapes on each."""
    ops = context_ops(arch, shape, fused)
    return tuple(tensor_parallel_share(op, tp) for op in ops) if tp > 1 else tuple(ops)


def _causal_flops(arch: Architecture, prompts: int, per: int) -> float:
    """Attention FLOPs of `prompts` prompts of `per` tokens each from the start, all layers,
    counted as the engines count them (estimate/serve/replica.py: 4 x q_dim a pair)."""
    return prompts * per * (per / 2 if per > 1 else 1) * 4.0 * arch.num_layers * arch.q_dim


@lru_cache(maxsize=8192)
def _dense(step: RooflineStep, tokens: int) -> Sums:
    """The context-free ops of a step of `tokens` tokens (the output head apart)."""
    shape = step.shape(1, tokens, 1, 1)
    dtype = step.plan.weight_format.compute_dtype
    ops = [op for op in inference_ops(step.arch, shape, step.rt.fused, step.tp,
                                      step.plan.expert_parallel)
           if op.name not in CONTEXT_OPS]
    experts = _expert_rates(step)
    times = [time_op(op, experts if op.experts else step.rates, dtype) for op in ops]
    moe = step.arch.moe
    if moe and step.rt.moe_layer_s:  # the routing kernels of each sparse layer, each step
        routing = Op("moe routing", "runtime", 0.0, 0.0, moe.layers)
        times.append(OpTime(routing, 0.0, step.rt.moe_layer_s))
    return Sums.of(tuple(times))


@lru_cache(maxsize=256)
def _expert_rates(step: RooflineStep) -> DeviceRates:
    """The rates a routed expert's matmul runs at: the runtime's grouped MoE kernel streams
    the experts' weights at `expert_memory` times its dense kernel's share (docs/speed.md,
    "Mixture of experts")."""
    share = step.rt.expert_memory
    if share == 1.0:
        return step.rates
    return replace(step.rates, weight_stream_share=step.rates.weight_stream_share * share)


def _dense_at(step: RooflineStep, tokens: int) -> Sums:
    low, high = bucket_below(tokens), bucket_above(tokens)
    if low == high:
        return _dense(step, low)
    return _dense(step, low).between(_dense(step, high), (tokens - low) / (high - low))


@lru_cache(maxsize=65536)
def _decoding_s(step: RooflineStep, sequences: int, context: int) -> tuple[float, float]:
    """A decode step's device seconds (compute-bound, memory-bound) for `sequences`
    sequences at `context` positions each: a simulation asks for thousands of them."""
    return step._device_s(sequences, 0, float(sequences * context), 0.0, 1)


@lru_cache(maxsize=65536)
def _decoding(step: RooflineStep, sequences: int, context: int) -> Sums:
    """The cache-reading ops of `sequences` decoding sequences at `context` positions each."""
    return Sums.of(tuple(step._timed(op)
                         for op in step._context_ops(step.shape(sequences, 1, context, 1))))


@lru_cache(maxsize=8192)
def _prompting(step: RooflineStep, prompts: int, per: int, flop_scale: float,
               read_scale: float) -> Sums:
    """The cache-reading ops of `prompts` prompts of `per` tokens from the start, their
    attention's FLOPs and positions scaled to the step's (a simulation of requests of
    fixed lengths asks for the same ones again and again)."""
    ops = step._context_ops(step.shape(prompts, per, per, 1))
    return Sums.of(tuple(step._timed(op, flop_scale if op.kind == "attention" else 1.0,
                                     read_scale) for op in ops))


@lru_cache(maxsize=8192)
def _head(step: RooflineStep, logits: int) -> Sums:
    """The output head's matmul over `logits` positions."""
    shape = step.shape(1, 1, 1, logits)
    dtype = step.plan.weight_format.compute_dtype
    ops = [op for op in inference_ops(step.arch, shape, step.rt.fused, step.tp)
           if op.name == "lm_head"]
    return Sums.of(tuple(time_op(op, step.rates, dtype) for op in ops))


@lru_cache(maxsize=8192)
def _comm(step: RooflineStep, tokens: int) -> float:
    compute = weight_format(step.plan.weight_format.compute_dtype).bytes_per_element
    return tp_allreduce_s(step.arch, tokens, compute, step.rates, step.tp,
                          step.plan.expert_parallel)


@lru_cache(maxsize=256)
def _overhead(step: RooflineStep, prompt: bool) -> float:
    """The eager runtime's dispatch of a step's ops, which the device cannot hide."""
    if not step.eager:
        return 0.0
    mode = op_count_mode(step.plan.weight_format.compute_dtype)
    return dispatch_overhead(step.arch, mode, step.plan.attention,
                             "inference" if prompt else "decode", step.rates)


@lru_cache(maxsize=4096)
def _extra_rows(step: RooflineStep, decoding: int, prompt_tokens: int,
                prompts: int) -> tuple[tuple[OpTime, ...], float]:
    """The host's rows of a step and their seconds: the runtime's own cost a step,
    generate()'s work on each decoding sequence's logits, and a CPU prefill's page faults."""
    rows = []
    runtime_s = step.rt.step_s.get("inference" if prompt_tokens else "decode", 0.0)
    if runtime_s:
        rows.append(OpTime(Op("runtime step", "runtime", 0.0, 0.0), 0.0, runtime_s))
    vocab = step.arch.vocab_size
    if step.eager and decoding and step.rates.runtime_vocab_s:
        logits = float(vocab * decoding * 4)  # what it works on: the fp32 logits
        rows.append(OpTime(Op("logits step", "runtime", 0.0, logits), 0.0,
                           step.rates.runtime_vocab_s * vocab * decoding))
    fresh = fresh_bytes_per_s(step.rates) if step.eager and prompt_tokens else 0.0
    if fresh:
        nbytes = _fault_bytes(step, prompts, max(1, prompt_tokens // max(1, prompts)))
        if nbytes:
            rows.append(OpTime(Op("page faults", "faults", 0.0, float(nbytes)), 0.0,
                               nbytes / fresh))
    return tuple(rows), sum(t.seconds for t in rows)


@lru_cache(maxsize=1024)
def _fault_bytes(step: RooflineStep, prompts: int, per: int) -> int:
    logits = per if step.plan.logits == "all" else 1
    return prefill_fault_bytes(step.arch, step.shape(prompts, per, per, logits))


@lru_cache(maxsize=256)
def prefill_fault_bytes(arch: Architecture, shape: Shape) -> int:
    """Bytes a CPU prefill under transformers faults in afresh: its tensors replayed
    through glibc's allocator (`page_faults.replay`), in steady state. A decode step's
    tensors are a few rows each and fault nothing (measured: 0 within +-20 MB)."""
    lo, hi = SAMPLED_LAYERS
    if arch.num_layers <= hi:
        return _replayed_faults(arch, shape)
    few, more = (_replayed_faults(replace(arch, num_layers=n), shape) for n in (lo, hi))
    return max(0, round(more + (arch.num_layers - hi) * (more - few) / (hi - lo)))


def _replayed_faults(arch: Architecture, shape: Shape) -> int:
    # Two passes: the thresholds settle in the first (3 and 4 passes gave the same bytes on
    # every time-suite case).
    return replay(prefill_heap_events(arch, shape), passes=2).get("forward", 0)
