"""The time of one llama.cpp step (one graph evaluation: a ubatch of prompt tokens, or one
token of each decoding sequence; docs/speed.md, "Runtimes"): the weights streamed once, or
their matmuls, whichever is longer; attention over the KV cache; and the graph's fixed costs
(estimate/speed/ggml_time.py holds the rates). `infer`'s decode is one step and its prefill
the prompt's ubatches, and `serve` steps its llama-server engine with the same function."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from gpuwise.catalog.runtime_speed import RuntimeSpeed, runtime_speed
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime
from gpuwise.estimate.memory.llama_cpp_experts import cpu_moe_layers
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_experts import host_expert_rows, less_weights
from gpuwise.estimate.speed.ggml_time import (
    GgmlRates,
    chunk_pairs,
    decode_attention_rate,
    ggml_rates,
    ggml_type,
    kv_bytes,
    layer_token_s,
    matmul_seconds,
    routed_read,
    stream_seconds,
    tiled_attention,
    weights_read,
)
from gpuwise.estimate.speed.roofline import OpTime, PhaseTime
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.ops import Op
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True, eq=False)  # hashed by identity: the caches below key on it
class GgmlStep:
    """Steps of `plan` under llama.cpp on `device`; with `plan.gpu_layers` below the model's
    layers, those past them on `host` (llama.cpp `-ngl`)."""

    arch: Architecture
    plan: InferencePlan
    device: DeviceRates
    tp: int = 1  # llama.cpp splits layers, not heads: a step runs on one device at a time
    host: DeviceRates | None = None
    rt: RuntimeSpeed = field(init=False, repr=False)
    g: GgmlRates = field(init=False, repr=False)
    host_g: GgmlRates | None = field(init=False, repr=False)
    moved: int = field(init=False, repr=False)  # sparse layers whose experts the host runs

    def __post_init__(self) -> None:
        rt = runtime_speed("llama.cpp")
        rt.check_device(self.device.kind, self.device.name)
        gtype = ggml_type(self.plan)
        threads = self.plan.threads if self.device.kind == "cpu" else None
        object.__setattr__(self, "rt", rt)
        object.__setattr__(self, "g", ggml_rates(self.device, gtype, threads))
        on_gpu = self.device.kind != "cpu" and self.host is not None
        moved = (cpu_moe_layers(self.arch, self.plan, round(self.offloaded_share * self.arch.num_layers))
                 if on_gpu else 0)
        object.__setattr__(self, "moved", moved)
        host_g = None
        if (self.offloaded_share < 1.0 or moved) and self.host is not None:
            host_g = ggml_rates(self.host, gtype, self.plan.threads)
        object.__setattr__(self, "host_g", host_g)

    @property
    def gtype(self) -> str:
        return ggml_type(self.plan)

    @property
    def offloaded_share(self) -> float:
        """The share of layers on the device (1.0: all, or a CPU)."""
        on, layers = self.plan.gpu_layers, self.arch.num_layers
        if on is None or on >= layers or self.device.kind == "cpu" or self.host is None:
            return 1.0
        return on / layers

    @property
    def pair_flops(self) -> float:
        """Attention FLOPs of one (query, key) pair through every layer: QK^T and PV."""
        return 4.0 * self.arch.num_layers * self.arch.q_dim

    def parts(self, tokens: int, prompt_tokens: int, kv_read: float,
              prompt_attention_flops: float = 0.0, masked: float = 0.0,
              prompts: int = 1) -> tuple[float, float, float]:
        """(compute-bound, memory-bound, host) seconds of a step of `tokens` tokens,
        `prompt_tokens` of them a prompt's, whose attention reads `kv_read` cached positions
        and costs `prompt_attention_flops` for the prompt's, and, in llama.cpp's shared cache,
        spans `masked` (prompt token, other sequence's cell) pairs."""
        if tokens <= 0:
            return 0.0, 0.0, 0.0
        if (self.offloaded_share < 1.0 or self.moved) and self.host_g is not None:
            rows, host = self._rows(tokens, prompt_tokens, kv_read, prompt_attention_flops,
                                    masked)
            c = sum(t.seconds for t in rows if t.bound == "compute")
            m = sum(t.seconds for t in rows if t.bound != "compute")
            return c, m, host
        # the rows' seconds without the rows (a simulation's hot path), summed as above
        t = _device_times(self, self.g, tokens, prompt_tokens, kv_read, prompt_attention_flops,
                          masked)
        c = m = 0
        for compute, memory in ((t.weights_c, t.weights_m), (t.attention_c, t.attention_m)):
            if compute >= memory:
                c += max(compute, memory)
            else:
                m += max(compute, memory)
        return c, m, t.host

    def phase(self, name: str, tokens: int, prompt_tokens: int, kv_read: float,
              prompt_attention_flops: float = 0.0) -> PhaseTime:
        """The same step as an op table (infer's decode)."""
        rows, host = self._rows(tokens, prompt_tokens, kv_read, prompt_attention_flops, 0.0)
        c = sum(t.seconds for t in rows if t.bound == "compute")
        m = sum(t.seconds for t in rows if t.bound != "compute")
        return _phase(name, tuple(rows), c, m, host)

    def prefill(self) -> PhaseTime:
        """The plan's prompts, `batch` of them, in ubatches of llama.cpp's n_ubatch: each a
        step over the prompt so far."""
        plan = self.plan
        total = plan.batch * plan.prompt_tokens
        n_ubatch = llama_cpp_runtime().n_ubatch
        tiled = tiled_attention(self.device.kind, plan)
        merged: dict[str, list[OpTime]] = {}
        c = m = host = 0.0
        for start in range(0, total, n_ubatch):
            n = min(n_ubatch, total - start)
            depth = start % plan.prompt_tokens if plan.batch == 1 else start * plan.prompt_tokens // total
            pairs = chunk_pairs(n, depth) if tiled else n * (depth + n / 2)
            rows, h = self._rows(n, n, depth + n, pairs * self.pair_flops, 0.0)
            for t in rows:
                merged.setdefault(t.op.name, []).append(t)
            c += sum(t.seconds for t in rows if t.bound == "compute")
            m += sum(t.seconds for t in rows if t.bound != "compute")
            host += h
        return _phase("prefill", tuple(_merge(ts) for ts in merged.values()), c, m, host)

    def _rows(self, tokens: int, prompt_tokens: int, kv_read: float, pf: float,
              masked: float) -> tuple[list[OpTime], float]:
        share = self.offloaded_share
        rows, host = _device_rows(self, self.g, tokens, prompt_tokens, kv_read, pf, masked)
        if self.moved and self.host is not None and self.host_g is not None:
            device_read = share * _read(self, tokens)
            added, read = host_expert_rows(self.arch, self.plan, self.moved, tokens, prompt_tokens,
                                           self.device, self.host, self.host_g, device_read)
            rows, host = self._layers_rows(rows, host, tokens, prompt_tokens, kv_read, pf, masked)
            return [*less_weights(rows, read, device_read), *added], host
        return self._layers_rows(rows, host, tokens, prompt_tokens, kv_read, pf, masked)

    def _layers_rows(self, rows: list[OpTime], host: float, tokens: int, prompt_tokens: int,
                     kv_read: float, pf: float, masked: float) -> tuple[list[OpTime], float]:
        """The device's rows with `--gpu-layers`' host layers: their share on the host."""
        share = self.offloaded_share
        if share >= 1.0 or self.host_g is None:
            return rows, host
        if prompt_tokens:
            # Prompts run every layer on the device (ggml offloads a big batch's matmuls),
            # the host layers' weights copied over the host link for each ubatch.
            copied = (1 - share) * _read(self, tokens)
            link = self.device.host_link_bytes_per_s or self.device.memory_bytes_per_s
            copy = OpTime(Op("host layers' weights to the GPU", "copy", 0.0, copied), 0.0, copied / link)
            return [*rows, copy], host
        on_host, host_h = _device_rows(self, self.host_g, tokens, prompt_tokens, kv_read, pf, masked)
        mixed = [_scaled(t, share, "GPU") for t in rows] + [_scaled(t, 1 - share, "host") for t in on_host]
        return mixed, share * host + (1 - share) * host_h


@lru_cache(maxsize=4096)
def _read(step: GgmlStep, tokens: int) -> float:
    """The weight bytes a step of `tokens` tokens reads (a mixture of experts: the experts
    its tokens reach; estimate/speed/ggml_time.py `weights_read`)."""
    if tokens <= 1 or step.arch.moe is None:
        return _weights(step)[0]
    return weights_read(step.arch, step.plan, tokens)


@lru_cache(maxsize=4096)
def _routed(step: GgmlStep, tokens: int) -> float:
    """Of `_read`, the routed experts' bytes (ggml_time.py `routed_read`)."""
    return routed_read(step.arch, step.plan, max(1, tokens)) if step.arch.moe else 0.0


@lru_cache(maxsize=64)
def _weights(step: GgmlStep) -> tuple[float, float, float, float]:
    """The weight bytes one token's step reads, the matmul FLOPs a token costs through the
    layers, those of one token's logits and the KV cache's bytes a position."""
    arch = step.arch
    counts = count_params(arch)
    head = arch.vocab_size * arch.hidden_size
    layers = counts.active - counts.embedding - (0 if arch.tie_embeddings else head)
    kv = kv_bytes(arch, replace(step.plan, batch=1), 1.0)
    return weights_read(arch, step.plan), 2.0 * layers, 2.0 * head, kv


def _device_rows(step: GgmlStep, g: GgmlRates, tokens: int, prompt_tokens: int, kv_read: float,
                 pf: float, masked: float) -> tuple[list[OpTime], float]:
    """The weights' row and attention's row of a step on one device, and its fixed costs."""
    t = _device_times(step, g, tokens, prompt_tokens, kv_read, pf, masked)
    weights = OpTime(Op(f"weights ({step.gtype})", "matmul", t.flops, t.read, m=tokens),
                     t.weights_c, t.weights_m)
    att = OpTime(Op("attention (KV cache)", "attention", t.attention_flops, t.kv),
                 t.attention_c, t.attention_m)
    return [weights, att], t.host


class DeviceTimes(NamedTuple):
    """A step's work and seconds on one device (`_device_rows` without its rows)."""

    flops: float
    read: float
    weights_c: float
    weights_m: float
    attention_flops: float
    kv: float
    attention_c: float
    attention_m: float
    host: float


def _device_times(step: GgmlStep, g: GgmlRates, tokens: int, prompt_tokens: int,
                  kv_read: float, pf: float, masked: float) -> DeviceTimes:
    arch, plan = step.arch, step.plan
    _, per_token, per_logit, kv_position = _weights(step)
    read = _read(step, tokens)
    # logits of every token, or (llama.cpp's default) of decodes and each prompt's last
    logits = tokens if plan.logits == "all" else tokens - prompt_tokens + (prompt_tokens > 0)
    kv = kv_position * kv_read
    flops = tokens * per_token + logits * per_logit
    streamed = stream_seconds(g, read, read + kv, g.weight_bytes_per_s)
    experts = _routed(step, tokens) if g.expert_bytes_per_s else 0.0
    if experts:  # the routed experts' MUL_MAT_ID at its own share of the bandwidth
        experts = min(experts, read)
        streamed += (stream_seconds(g, experts, read + kv, g.expert_bytes_per_s)
                     - stream_seconds(g, experts, read + kv, g.weight_bytes_per_s))
    weights_c = matmul_seconds(g, tokens, flops, streamed)
    decoding = tokens - prompt_tokens
    attention = pf / g.attention_flops if pf else 0.0
    attention += masked * arch.num_layers * arch.num_heads * g.masked_head_s
    decode_flops = step.pair_flops * (kv_read if not prompt_tokens else max(0.0, kv_read - prompt_tokens))
    memory = stream_seconds(g, kv, read + kv, g.kv_bytes_per_s)
    if decoding:
        measured = decode_attention_rate(g, decoding)
        attention += decode_flops / (measured or g.attention_flops)
        if measured:  # measured: decode attention runs at its own rate, its reads in it
            memory = 0.0 if not prompt_tokens else memory
    if plan.attention == "eager" and pf:  # -fa off: each layer's f32 scores written and read
        kv += 2.0 * arch.num_heads * pf / arch.q_dim
        memory = kv / g.kv_bytes_per_s
    per = prompt_tokens * layer_token_s(g, prompt_tokens) if prompt_tokens else 0.0
    return DeviceTimes(flops, read, weights_c, streamed, pf + decode_flops * (decoding > 0), kv,
                       attention, memory, arch.num_layers * (g.layer_s + per) + g.token_s)


def _scaled(t: OpTime, share: float, where: str) -> OpTime:
    return OpTime(replace(t.op, name=f"{t.op.name} [{where}]"), t.compute_s * share,
                  t.memory_s * share)


def _merge(times: list[OpTime]) -> OpTime:
    """One row for an op run in several steps: its work summed, and its time."""
    if len(times) == 1:
        return times[0]
    op = replace(times[0].op, flops=sum(t.op.flops for t in times),
                 bytes=sum(t.op.bytes for t in times))
    c = sum(t.compute_s for t in times)
    m = sum(t.memory_s for t in times)
    return OpTime(op, c, m, extra_s=max(0.0, sum(t.seconds for t in times) - max(c, m)))


def _phase(name: str, rows: tuple[OpTime, ...], c: float, m: float, host: float) -> PhaseTime:
    return PhaseTime(name, c + m + host, c + m, host, 0.0,
                     sum(t.op.flops for t in rows), sum(t.op.bytes for t in rows), rows)
