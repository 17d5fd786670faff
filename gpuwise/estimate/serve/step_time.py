"""How long one engine step takes under a runtime's time model (docs/serve.md, "A step"): the
step's new tokens (prompt chunks and one per decoding sequence) go through the weights as one
batch, and attention reads each sequence's cached keys and values. A simulation asks
thousands of times, so the weights' part is computed once per size of step (to 1/32 of a
doubling) and the attention part is linear in what it reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import RuntimeSpeed, runtime_speed
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_time import (
    GgmlRates,
    decode_attention_rate,
    ggml_rates,
    ggml_type,
    layer_token_s,
    matmul_seconds,
    stream_seconds,
    weights_read,
)
from gpuwise.estimate.speed.inference_time import inference_ops, plan_shape, tp_allreduce_s
from gpuwise.estimate.speed.roofline import dispatch_overhead, op_count_mode, phase_time
from gpuwise.estimate.speed.runtime_time import kernel_for, runtime_rates
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.plans import InferencePlan

BUCKETS_PER_DOUBLING = 32


def bucket(tokens: int) -> int:
    """`tokens` rounded up to one of 32 sizes per doubling (exact up to 64)."""
    if tokens <= 64:
        return max(1, tokens)
    step = 2 ** (math.floor(math.log2(tokens)) - 5)
    return int(math.ceil(tokens / step) * step)


@dataclass(frozen=True, eq=False)  # hashed by identity: the caches below key on it
class StepTime:
    """Seconds of one step of a served model on one replica (`tp` devices)."""

    arch: Architecture
    plan: InferencePlan  # weights, KV dtype, runtime, threads
    rates: DeviceRates
    tp: int = 1
    rt: RuntimeSpeed = field(init=False, repr=False)
    kv_bytes_per_token: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rt = runtime_speed(self.plan.runtime)
        rt.check_device(self.rates.kind, self.rates.name)
        object.__setattr__(self, "rt", rt)
        kv = weight_format(self.plan.kv_dtype or self.plan.weight_format.compute_dtype)
        object.__setattr__(self, "kv_bytes_per_token",
                           self.arch.num_layers * self.arch.kv_cache_elements_per_token()
                           * kv.bytes_per_element)  # fmt: skip

    def parts(self, tokens: int, prompt_tokens: int, kv_read: float,
              prompt_attention_flops: float = 0.0,
              masked: float = 0.0) -> tuple[float, float, float]:  # fmt: skip
        """A step of `tokens` new tokens, `prompt_tokens` of them from prompts, whose attention
        reads `kv_read` cached positions (summed over its sequences) and, in llama.cpp's
        shared cache, spans `masked` (prompt token, other sequence's cell) pairs, as
        (compute-bound, memory-bound, host) seconds: what the power model charges each at
        (metrics.Power)."""
        if tokens <= 0:
            return 0.0, 0.0, 0.0
        if self.rt.model == "ggml":
            return _ggml_step(self, tokens, prompt_tokens, kv_read, prompt_attention_flops,
                              masked)  # fmt: skip
        compute, memory, host = _dense_parts(self, bucket(tokens), prompt_tokens > 0)
        attention = kv_read * self.kv_bytes_per_token / self.tp / _kv_rate(self)
        attention *= 1.0 if self.rt.fused else 3.0  # eager: read, then torch.cat's copy
        compute += prompt_attention_flops / self.tp / _attention_flops(self)
        return compute, memory + attention, host


@lru_cache(maxsize=256)
def _runtime_rates(step: StepTime) -> DeviceRates:
    return runtime_rates(step.rates, step.rt, kernel_for(step.rt, step.plan.weights,
                                                         step.rates.kind, step.plan.quant_kernel))


@lru_cache(maxsize=4096)
def _dense_parts(step: StepTime, tokens: int, prompt: bool) -> tuple[float, float, float]:
    """The weights' part of a step of `tokens` tokens, every op but attention, as (compute-
    bound, memory-bound, host) seconds: the host's the runtime's dispatch the device cannot
    hide, its step cost and the collectives' waits."""
    arch, plan, rates = step.arch, step.plan, _runtime_rates(step)
    shape = plan_shape(plan, arch, tokens, 1, 1)
    ops = [op for op in inference_ops(arch, shape, step.rt.fused, step.tp)
           if op.kind != "attention"]  # fmt: skip
    dtype = plan.weight_format.compute_dtype
    overhead = 0.0
    if step.rt.dispatch == "eager":
        phase = "inference" if prompt else "decode"
        overhead = dispatch_overhead(arch, op_count_mode(dtype), plan.attention, phase, rates)
    timed = phase_time("step", ops, rates, dtype, overhead,
                       tp_allreduce_s(arch, shape, rates, step.tp))  # fmt: skip
    compute = sum(t.seconds for t in timed.ops if t.bound == "compute")
    memory = timed.ops_s - compute
    host = timed.overhead_s + timed.comm_s + step.rt.step_s.get("inference" if prompt else "decode", 0.0)
    return compute, memory, host


@lru_cache(maxsize=256)
def _kv_rate(step: StepTime) -> float:
    rates = _runtime_rates(step)
    return rates.memory_bytes_per_s * rates.attention_memory_share


@lru_cache(maxsize=256)
def _attention_flops(step: StepTime) -> float:
    rates = _runtime_rates(step)
    dtype = step.plan.weight_format.compute_dtype
    return rates.matmul_rate(4096, 4096, 2.0 * 4096**3, dtype)


@lru_cache(maxsize=64)
def _ggml(step: StepTime) -> tuple[GgmlRates, float, float, float]:
    """llama.cpp's rates, the weight bytes a step reads, the matmul FLOPs a token costs
    through the layers and those of one token's logits."""
    g = ggml_rates(step.rates, ggml_type(step.plan), step.plan.threads)
    counts = count_params(step.arch)
    head = step.arch.vocab_size * step.arch.hidden_size
    layers = counts.active - counts.embedding - (0 if step.arch.tie_embeddings else head)
    return g, weights_read(step.arch, step.plan), 2.0 * layers, 2.0 * head


def _ggml_step(step: StepTime, tokens: int, prompt_tokens: int, kv_read: float,
               prompt_attention_flops: float, masked: float) -> tuple[float, float, float]:  # fmt: skip
    """llama.cpp's batch: the weights streamed once, or their matmuls, whichever is longer,
    plus the KV cache, the other sequences' cells its prompt tokens' attention passes over
    (masked: `masked_head_s` a pair, layer and head, where the probe measured it) and the graph's
    fixed costs (estimate/speed/ggml_time.py)."""
    g, read, per_token, per_logit = _ggml(step)
    # logits of every token, or (llama.cpp's default) of decodes and each prompt's last
    logits = tokens if step.plan.logits == "all" else tokens - prompt_tokens + (prompt_tokens > 0)
    kv = kv_read * step.kv_bytes_per_token
    streamed = stream_seconds(g, read, read + kv, g.weight_bytes_per_s)
    computed = matmul_seconds(g, tokens, tokens * per_token + logits * per_logit, streamed)
    memory = stream_seconds(g, kv, read + kv, g.kv_bytes_per_s)
    compute = prompt_attention_flops / g.attention_flops
    compute += masked * step.arch.num_layers * step.arch.num_heads * g.masked_head_s
    decoding = tokens - prompt_tokens
    att_rate = decode_attention_rate(g, decoding) if decoding else 0.0
    if att_rate:  # measured: decode attention runs at its own rate (kv_read: its positions)
        compute += 4.0 * step.arch.num_layers * step.arch.q_dim * kv_read / att_rate
        memory = 0.0
    if computed > streamed:
        compute += computed
    else:
        memory += streamed
    layers = step.arch.num_layers
    per_token = prompt_tokens * layer_token_s(g, prompt_tokens) if prompt_tokens else 0.0
    return compute, memory, layers * (g.layer_s + per_token) + g.token_s
