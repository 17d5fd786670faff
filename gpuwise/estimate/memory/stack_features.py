"""Memory rules of training stacks beyond transformers' defaults, each named after the stack
whose source it follows (constants and sources: catalog/data/stacks.toml):

- the loss: transformers upcasts all b x s x vocab logits to fp32 and log_softmax's backward
  holds two fp32 copies; torchtune's LinearCrossEntropyLoss projects and upcasts N chunks one
  at a time; Liger's (and Unsloth's) fused linear cross-entropy never keeps the logits and
  computes the input's and the head's gradients chunk by chunk in the forward;
- FSDP2 (torch fully_shard): sharded parameters, gradients and states, plus the unsharded
  layers in flight (one computing, the next prefetched; every layer with
  reshard_after_forward=False) and one unit's unsharded gradient before its reduce-scatter;
- offload: optimizer states (DeepSpeed ZeRO-Offload), parameters with their gradients and
  states (FSDP2 CPUOffloadPolicy, ZeRO-3 offload_param), saved activations (torchtune's
  activation offloading) held in host memory;
- QLoRA (bitsandbytes + peft): the nf4 base with or without double quantisation, peft's fp32
  cast of every parameter that is not quantised, and the weight dequantised in the compute
  dtype for each matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.stacks import stack_value
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.plans import TrainingPlan

LOSS_STACKS = {"full": "transformers cross-entropy", "chunked": "torchtune chunked cross-entropy",
               "fused": "Liger/Unsloth fused linear cross-entropy"}


@dataclass(frozen=True)
class LossMemory:
    """Bytes of the loss on one device: kept from the forward to the backward, and alive at
    the turn from forward to backward; and the rows of vocabulary-sized tensors alive at
    once (for the allocator replay)."""

    saved: float
    turn: float
    vocab_rows: float
    head_grad_in_forward: bool  # the head's weight gradient is taken (and counted) in `saved`


def fused_chunk_rows(tokens: int, arch: Architecture) -> int:
    """Liger's chunk: next_power_of_2(cdiv(BT, cdiv(V, H))), at most all tokens."""
    inc = -(-arch.vocab_size // arch.hidden_size)
    rows = -(-tokens // inc)
    return min(tokens, 1 << max(0, (rows - 1).bit_length()))


def loss_memory(arch: Architecture, plan: TrainingPlan, profile_logits: float,
                compute: float, head_weight_bytes: float) -> LossMemory:
    """The loss's memory under the plan's --loss (see the module docstring)."""
    tokens = plan.batch * plan.seq
    vocab = arch.vocab_size / plan.tp
    if plan.loss == "chunked":
        n = min(plan.loss_chunks, tokens)
        # Eager: each chunk's log_softmax saves its fp32 output, and its backward holds two
        # fp32 copies of a chunk. Compiled (the recipe compiles compute_cross_entropy), the
        # bf16 logits and a logsumexp are kept, and the backward is one fused kernel that
        # writes the chunk's gradient in the logits' dtype.
        compiled = runtime_unit(plan.runtime).torch_compile
        kept, turn = (compute, compute) if compiled else (4.0, 8.0)
        return LossMemory(tokens * vocab * kept, tokens / n * vocab * turn, tokens / n, False)
    if plan.loss == "fused":
        chunk = fused_chunk_rows(tokens, arch)
        head = arch.vocab_size * arch.hidden_size / plan.tp * head_weight_bytes
        grads = tokens * arch.hidden_size * compute + (head if plan.finetune == "full" else 0)
        return LossMemory(grads + tokens * 4, chunk * vocab * compute, chunk,
                          plan.finetune == "full")
    return LossMemory(profile_logits, tokens * vocab * 8, tokens, False)


def fsdp2_working_set(arch: Architecture, plan: TrainingPlan, param_bytes: float,
                      grad_bytes: float) -> float:
    """FSDP2's unsharded parameters in flight plus one unit's unsharded gradient."""
    counts = count_params(arch)
    head = max(counts.embedding, counts.lm_head)
    layer = (counts.total - counts.embedding - counts.lm_head) / arch.num_layers
    unit = max(layer, head) / plan.tp
    if plan.reshard_after_forward:
        params = stack_value("fsdp2", "unsharded_layers_in_flight") * unit * param_bytes
    else:
        params = (counts.total / plan.tp) * param_bytes
    return params + unit * grad_bytes


def deepspeed_bucket(plan: TrainingPlan, grad_bytes: float) -> float:
    """ZeRO-Offload's reduce bucket: the gradients on the device before they go to the host."""
    return float(stack_value("deepspeed", "reduce_bucket_elements")) * grad_bytes


def qlora_weights(arch: Architecture, plan: TrainingPlan) -> float:
    """The nf4 base (bitsandbytes) with or without double quantisation, and every other
    parameter in fp32 under peft's prepare_model_for_kbit_training."""
    counts = count_params(arch)
    fmt = weight_format("nf4")
    base = weight_bytes(arch, fmt)
    block = stack_value("bitsandbytes", "nf4_block")
    if not plan.double_quant:  # one fp32 absmax per block instead of the nested 8-bit ones
        base += counts.linear / block * (4 - fmt.scale_bytes_per_group * block / fmt.group_size)
    other_bytes = weight_format(fmt.compute_dtype).bytes_per_element
    if plan.kbit_prepare:
        base += (counts.total - counts.linear) * (4 - other_bytes)
    return base


def qlora_dequant_bytes(arch: Architecture, plan: TrainingPlan) -> float:
    """The largest nf4 matrix dequantised in the compute dtype for its matmul (forward and
    backward), bnb_4bit_compute_dtype or the plan's compute dtype."""
    dtype = plan.quant_compute_dtype or plan.compute_dtype
    d, i = arch.hidden_size, arch.moe.expert_intermediate if arch.moe else arch.intermediate_size
    largest = max(d * i, d * arch.q_dim)
    return largest / plan.tp * weight_format(dtype).bytes_per_element


def offloaded_activations(layers: float, arch: Architecture) -> float:
    """torchtune's activation offloading: saved activations go to host memory as each layer
    finishes and come back before its backward; about two layers' worth stay on the device
    (the one in use and the one in transfer)."""
    return min(layers, 2 * layers / arch.num_layers)
