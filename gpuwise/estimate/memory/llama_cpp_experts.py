"""llama.cpp's expert offload (`--cpu-moe`, `--n-cpu-moe N`, `-ot exps=CPU`; llama.cpp PR 15077):
the routed experts' tensors (`blk.N.ffn_{up,gate,down}_exps`) of the first N layers stay in host
memory and the CPU runs them, while the rest of each layer is on the GPU (docs/speed.md,
"Mixture of experts"). A prompt's big batches copy them to the GPU instead (ggml's op offload)."""

from __future__ import annotations

from functools import lru_cache

from gpuwise.estimate.memory.llama_cpp_repack import gguf_tensors
from gpuwise.estimate.memory.weights import routed_expert_bytes, weight_bytes
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

EXPERT_TENSORS = ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps")  # llama.cpp's "exps" match


@lru_cache(maxsize=1024)
def expert_layer_bytes(arch: Architecture, plan: InferencePlan) -> float:
    """Bytes of one sparse layer's routed-expert tensors: the GGUF's own (a checkpoint's, or
    those llama-quantize writes for the format), else their share of the weights' bytes."""
    moe = arch.moe
    if moe is None or not moe.layers:
        return 0.0
    tensors = [t for t in gguf_tensors(arch, plan) if t.name.split(".")[-2] in EXPERT_TENSORS]
    if tensors:
        return sum(t.nbytes for t in tensors) / moe.layers
    fmt = plan.weight_format
    experts = routed_expert_bytes(arch, fmt)
    sw = plan.stored_weights  # a checkpoint's bytes: the format's experts in its proportion
    if sw:
        experts *= sw.total_bytes / weight_bytes(arch, fmt)
    return experts / moe.layers


def cpu_moe_layers(arch: Architecture, plan: InferencePlan, device_layers: int | None = None) -> int:
    """Sparse layers whose experts `--n-cpu-moe` moves off the device: those among the first
    `plan.cpu_moe_layers` that are on it (`-ngl` keeps the last `device_layers` there; the
    others are all on the host already). A model's dense layers come first (DeepSeek's
    first_k_dense_replace), so the sparse ones are its last `moe.layers`."""
    moe, first = arch.moe, plan.cpu_moe_layers
    if moe is None or not first:
        return 0
    layers = arch.num_layers
    on = layers if device_layers is None else min(device_layers, layers)
    start = max(layers - on, layers - moe.layers)
    return max(0, min(first, layers) - start)
