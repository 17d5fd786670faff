"""llama.cpp's step with the routed experts of some layers in host memory (`--cpu-moe`,
`--n-cpu-moe N`; estimate/memory/llama_cpp_experts.py): a decode step streams those layers'
touched experts from host memory at the CPU's rate and runs them there, the rest of every layer
on the GPU, each such layer's activations crossing the host link there and back; a prompt's
ubatch runs them on the GPU, copying their weights over the link (ggml's op offload, as for
`--gpu-layers`' host layers). docs/speed.md, "Mixture of experts"."""

from __future__ import annotations

from dataclasses import replace

from gpuwise.catalog.runtime_speed import ggml_backend
from gpuwise.estimate.memory.llama_cpp_experts import expert_layer_bytes
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_time import GgmlRates, matmul_seconds, stream_seconds
from gpuwise.estimate.speed.roofline import OpTime
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.ops import Op, experts_touched
from gpuwise.workload.plans import InferencePlan

# Nodes of a sparse layer's expert part the CPU runs, each ending in a thread barrier
# (llama-graph.cpp build_moe_ffn: the up, gate and down MUL_MAT_IDs, the GLU, the routing
# weights' MUL and the experts' sum).
EXPERT_NODES = 6
ACTIVATION_BYTES = 4.0  # ggml's activations between backends are f32


def host_expert_rows(arch: Architecture, plan: InferencePlan, moved: int, tokens: int,
                     prompt_tokens: int, device: DeviceRates, host: DeviceRates,
                     host_g: GgmlRates, device_read: float) -> tuple[list[OpTime], float]:
    """The rows the experts of `moved` sparse layers add on the host and the host link, and
    the bytes of them the device no longer reads (of its `device_read`)."""
    moe = arch.moe
    if moe is None or not moved:
        return [], 0.0
    layer = expert_layer_bytes(arch, plan)
    link = device.host_link_bytes_per_s or device.memory_bytes_per_s
    if prompt_tokens:
        copied = moved * layer
        return [OpTime(Op("host experts' weights to the GPU", "copy", 0.0, copied), 0.0,
                       copied / link)], 0.0
    touched = experts_touched(moe, tokens)
    read = min(device_read, moved * layer * touched / moe.num_experts)
    per_expert = count_params(arch).expert / (moe.layers * moe.num_experts)
    flops = 2.0 * tokens * moe.experts_per_token * per_expert * moved
    memory = stream_seconds(host_g, read, read, host_g.weight_bytes_per_s)
    compute = matmul_seconds(host_g, tokens, flops, memory)
    nodes = host_g.layer_s * EXPERT_NODES / ggml_backend(host.kind).nodes_per_layer
    crossed = 2.0 * moved * tokens * arch.hidden_size * ACTIVATION_BYTES
    return [OpTime(Op(f"experts of {moved} layers [host]", "matmul", flops, read, m=tokens),
                   compute, memory),
            OpTime(Op("experts' graph on the host", "runtime", 0.0, 0.0), 0.0, moved * nodes),
            OpTime(Op("activations over the host link", "copy", 0.0, crossed), 0.0,
                   crossed / link)], read


def less_weights(rows: list[OpTime], read: float, device_read: float) -> list[OpTime]:
    """The device's weights row without the `read` bytes the host now streams."""
    if not read or not device_read:
        return rows
    keep = max(0.0, 1.0 - read / device_read)
    out = []
    for t in rows:
        if t.op.name.startswith("weights (") and "[host]" not in t.op.name:
            t = OpTime(replace(t.op, flops=t.op.flops * keep, bytes=t.op.bytes * keep),
                       t.compute_s * keep, t.memory_s * keep)
        out.append(t)
    return out
