"""Device memory a weight-only quantisation kernel takes beside the weights, by kernel
(constants and sources: catalog/data/stacks.toml):

- AutoAWQ's GEMM kernel (`awq-gemm`, transformers' AWQ path): when a matmul has at least
  1024 input rows (batch x tokens), it dequantises the whole weight to fp16 and runs
  torch.matmul, so a prefill holds the largest matrix in fp16 for a moment;
- ExLlamaV2 (`exllama`): one scratch buffer per device, allocated at load and kept: the
  largest layer's dequantised weight plus its output for max_input_len x max_batch rows in
  fp32;
- bitsandbytes nf4 (`bnb-nf4`): each matmul dequantises its weight in the compute dtype;
- Marlin and the others: a workspace of a few KiB (nothing counted).

AutoAWQ's own loader with fused layers (`from_quantized(fuse_layers=True)`, its default) also
changes what the process holds: the fused layers' KV cache is allocated whole at load, and
while the layers are fused every layer's q, k and v stay beside the new concatenated qkv
matrix (the fuser builds all the fused blocks first and replaces `model.model` only at the
end: awq/models/llama.py LlamaFuser.fuse_transformer, awq/utils/fused_utils.py fuse_qkv's
torch.cat), so the load holds a second copy of every layer's q, k and v.
"""

from __future__ import annotations

from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.catalog.stacks import stack_value
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


def quant_kernel_name(plan: InferencePlan) -> str:
    """The kernel asked for, else transformers' own for the format ("" if unquantised)."""
    fmt = plan.weight_format
    if not fmt.quantised or fmt.other_bits:
        return ""
    return plan.quant_kernel or runtime_speed("transformers").kernels.get(fmt.id, "")


def fused_cache_positions(arch: Architecture, plan: InferencePlan) -> int:
    """The positions AutoAWQ's fused KV cache holds: from_quantized's max_seq_len (v0.1.6:
    max_new_tokens; the plan's context_alloc), else the model's max_position_embeddings,
    else 2048 (stacks.toml [autoawq] fused_default_max_seq_len)."""
    default = int(stack_value("autoawq", "fused_default_max_seq_len"))
    return plan.context_alloc or arch.max_position or default


def fused_qkv_copy_bytes(arch: Architecture, plan: InferencePlan) -> float:
    """Bytes of every layer's q, k and v in the stored format: the second copy AutoAWQ's fuser
    holds until the last layer is fused (see the module docstring)."""
    fmt = plan.weight_format
    d = arch.hidden_size
    per_layer = fmt.linear_bytes(arch.q_dim, d) + 2 * fmt.linear_bytes(arch.kv_dim, d)
    return per_layer * arch.num_layers


def _matrices(arch: Architecture) -> list[tuple[int, int]]:
    """(in, out) of a layer's quantised matrices."""
    d = arch.hidden_size
    i = arch.moe.expert_intermediate if arch.moe else arch.intermediate_size
    return [(d, arch.q_dim), (d, arch.kv_dim), (arch.q_dim, d), (d, i), (i, d)]


def quant_workspace(arch: Architecture, plan: InferencePlan) -> tuple[float, str]:
    """(bytes, the kernel) of the workspace the plan's weight-only kernel holds at the peak."""
    kernel = quant_kernel_name(plan)
    mats = _matrices(arch)
    largest = max(a * b for a, b in mats)
    if kernel == "awq-gemm":
        rows = plan.batch * plan.prompt_tokens
        threshold = stack_value("autoawq", "gemm_dequant_min_tokens")
        return (largest * 2.0 if rows >= threshold else 0.0), "AutoAWQ GEMM"
    if kernel == "exllama":
        tokens = stack_value("autoawq", "exllamav2_max_input_len")
        batch = stack_value("autoawq", "exllamav2_max_batch")
        scratch = max(a * b * 2 + 128 + b * tokens * batch * 4 + 128 for a, b in mats)
        return float(scratch), "ExLlamaV2 scratch"
    if kernel == "bnb-nf4":
        compute = plan.compute_format.bytes_per_element
        return largest * compute, "bitsandbytes nf4 dequantised weight"
    return 0.0, kernel
