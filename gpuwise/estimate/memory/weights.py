"""Bytes of the model's weights in a storage format (quantised matrices plus scales)."""

from __future__ import annotations

from functools import lru_cache

from gpuwise.catalog.formats import WeightFormat, weight_format
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.expert_parallel import experts_a_device
from gpuwise.workload.plans import InferencePlan


def weight_bytes(arch: Architecture, fmt: WeightFormat | str) -> float:
    """Stored weight bytes. Quantised formats apply to attention/MLP matrices only."""
    return _weight_bytes(arch, weight_format(fmt) if isinstance(fmt, str) else fmt)


def mean_weight_bytes(arch: Architecture, fmt: WeightFormat | str) -> float:
    """Average stored bytes per parameter in a format, scales included."""
    return weight_bytes(arch, fmt) / count_params(arch).total


@lru_cache(maxsize=4096)  # a sweep asks for each model and format on every device
def _weight_bytes(arch: Architecture, fmt: WeightFormat) -> float:
    counts = count_params(arch)
    if not fmt.quantised:
        return counts.total * fmt.bytes_per_element
    other = counts.total - counts.linear
    compute = weight_format(fmt.compute_dtype).bytes_per_element
    if fmt.scope == "experts" and arch.moe:  # the routed experts' matrices alone
        experts = _expert_matrices(arch)
        return (experts * fmt.matrix_bits / 8 + (counts.total - experts) * compute)
    rows = _linear_rows(arch)
    scales = rows * fmt.scale_bytes_per_row
    if fmt.group_size:
        scales += counts.linear / fmt.group_size * fmt.scale_bytes_per_group
    if fmt.gguf:
        return counts.linear * fmt.bytes_per_element + scales + _gguf_other_bytes(arch, fmt)
    return counts.linear * fmt.bytes_per_element + scales + other * compute


def routed_expert_bytes(arch: Architecture, fmt: WeightFormat) -> float:
    """Stored bytes of the routed experts' matrices (every sparse layer's), as `weight_bytes`
    counts them: in an experts-only format (MXFP4) its bits, else the matrices' bytes with
    their share of the scales."""
    if arch.moe is None:
        return 0.0
    experts = _expert_matrices(arch)
    if not fmt.quantised:
        return experts * fmt.bytes_per_element
    if fmt.scope == "experts":
        return experts * fmt.matrix_bits / 8
    counts = count_params(arch)
    scales = _linear_rows(arch) * fmt.scale_bytes_per_row
    if fmt.group_size:
        scales += counts.linear / fmt.group_size * fmt.scale_bytes_per_group
    return experts * (fmt.bytes_per_element + scales / counts.linear)


def _expert_matrices(arch: Architecture) -> float:
    """Weights of the routed experts' matrices (their biases apart): gate and up (gated) and
    down, each hidden x the expert's width, every expert of every MoE layer."""
    moe = arch.moe
    assert moe is not None
    per = (3 if arch.gated_mlp else 2) * arch.hidden_size * moe.expert_intermediate
    return float(moe.layers * moe.num_experts * per)


def _gguf_other_bytes(arch: Architecture, fmt: WeightFormat) -> float:
    """A GGUF file's tensors beyond the matrices: token_embd in its type (a tied one in the
    output head's: llama-quant.cpp quantises a shared tensor as the output), the head in its,
    and the vectors (norms, biases) in F32, as llama-quant.cpp quantises 2-D and 3-D tensors
    only (the MoE router, not quantised, is counted with them)."""
    counts = count_params(arch)
    embd = fmt.head_bits if arch.tie_embeddings else fmt.embd_bits
    rest = counts.total - counts.linear - counts.embedding - counts.lm_head
    return (counts.embedding * embd + counts.lm_head * fmt.head_bits) / 8 + rest * 4.0


def _linear_rows(arch: Architecture) -> int:
    """Output rows of all quantised matrices (per-row scales are stored per output feature)."""
    d = arch.hidden_size
    attn = arch.q_dim + 2 * arch.kv_dim + d
    if arch.mla:
        m = arch.mla
        attn = arch.q_dim + m.kv_lora_rank + m.qk_rope_head_dim + arch.num_heads * (
            m.qk_nope_head_dim + m.v_head_dim) + d
    mlp = (2 if arch.gated_mlp else 1) * arch.intermediate_size + d
    moe = arch.moe
    if not moe:
        return arch.num_layers * (attn + mlp)
    expert = 2 * moe.expert_intermediate + d
    shared = 2 * moe.shared_intermediate + d if moe.shared_experts else 0
    dense_layers = arch.num_layers - moe.layers
    return arch.num_layers * attn + dense_layers * mlp + moe.layers * (
        moe.num_experts * expert + shared)


def device_weight_bytes(arch: Architecture, plan: InferencePlan, total: float, tp: int) -> float:
    """One of `tp` devices' share of `total` weight bytes: 1/tp of every matrix, or under
    expert parallelism 1/tp of the rest and the fullest device's routed experts whole
    (E/tp, rounded up: vLLM gives the first devices the remainder). The experts' bytes are
    their share of the parameters."""
    moe = arch.moe
    if tp <= 1 or not (plan.expert_parallel and moe):
        return total / max(1, tp)
    counts = count_params(arch)
    experts = total * counts.expert / counts.total
    return (total - experts) / tp + experts * experts_a_device(moe, tp) / moe.num_experts


def expert_parallel_notes(arch: Architecture, plan: InferencePlan, tp: int) -> list[str]:
    """What --expert-parallel does to a device's memory, said once."""
    if not (plan.expert_parallel and arch.moe) or tp <= 1:
        return []
    held = experts_a_device(arch.moe, tp)
    return [f"--expert-parallel: {held} of {arch.moe.num_experts} routed experts a device, "
            "whole; attention and shared experts split over the --tp devices"]
