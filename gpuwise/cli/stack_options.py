"""Options for the memory features of real training and serving stacks, each naming the
stack whose rule it applies (docs/memory.md, "Training stacks' memory features")."""

from __future__ import annotations

from typing import Annotated, Any

import typer

ExpandableSegments = Annotated[bool, typer.Option(
    "--expandable-segments", help="PyTorch's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: "
    "the CUDA caching allocator grows one segment instead of rounding to 2/20 MiB segments "
    "(GPUs only)")]
Loss = Annotated[str, typer.Option(
    "--loss", help="the loss's memory: full (transformers: all logits upcast to fp32), chunked "
    "(torchtune LinearCrossEntropyLoss: the fp32 upcast a chunk at a time) or fused (Liger / "
    "Unsloth fused linear cross-entropy: no logits kept)")]
LossChunks = Annotated[int, typer.Option(
    "--loss-chunks", help="chunks of --loss chunked (torchtune's num_output_chunks)")]
OptimizerInBackward = Annotated[bool, typer.Option(
    "--optimizer-in-backward", help="torchtune's optimizer_in_bwd: each parameter is stepped "
    "and its gradient freed as soon as it is computed")]
Offload = Annotated[str, typer.Option(
    "--offload", help="comma list of what lives in host memory: optimizer (DeepSpeed "
    "ZeRO-Offload), params (FSDP2 CPUOffloadPolicy / ZeRO-3 offload_param: parameters, "
    "gradients and states), activations (torchtune activation offloading) (default: none)",
    show_default=False)]
Sharding = Annotated[str, typer.Option(
    "--sharding", help="how shards are laid out over the data-parallel devices: zero (DeepSpeed "
    "ZeRO stages, --zero) or fsdp2 (torch FSDP2 fully_shard: parameters, gradients and states "
    "all sharded)")]
Reshard = Annotated[bool, typer.Option(
    "--reshard-after-forward/--no-reshard-after-forward", help="FSDP2's reshard_after_forward: "
    "free each layer's gathered parameters after its forward (default) or keep them all "
    "until backward")]
CheckpointingPolicy = Annotated[str, typer.Option(
    "--checkpointing-policy", help="with --checkpointing: full (every layer keeps its input "
    "only), op (torchtitan's selective op policy: also attention outputs and every second "
    "matmul's) or N (every Nth layer checkpointed, torchtune/torchtitan selective)")]
DoubleQuant = Annotated[bool, typer.Option(
    "--double-quant/--no-double-quant", help="QLoRA: bitsandbytes bnb_4bit_use_double_quant "
    "(8-bit absmax per 64 weights instead of fp32)")]
QuantComputeDtype = Annotated[str | None, typer.Option(
    "--quant-compute-dtype", help="QLoRA: bitsandbytes bnb_4bit_compute_dtype, the dtype each "
    "nf4 weight is dequantised to: fp32, bf16 or fp16 (default: the training dtype's)",
    show_default=False)]
KbitPrepare = Annotated[bool, typer.Option(
    "--kbit-prepare/--no-kbit-prepare", help="QLoRA: peft's prepare_model_for_kbit_training, "
    "which casts every parameter that is not nf4 to fp32 (torchtune does not)")]

AdapterDtype = Annotated[str, typer.Option(
    "--adapter-dtype", help="LoRA/QLoRA adapters' dtype: fp32 (peft's default; each targeted "
    "matrix's input is cast to fp32 for them) or bf16/fp16 (torchtune: the base's)")]


def stack_fields(expandable_segments: bool, loss: str, loss_chunks: int,
                 optimizer_in_backward: bool, offload: str, sharding: str,
                 reshard_after_forward: bool, checkpointing_policy: str, double_quant: bool,
                 quant_compute_dtype: str | None, kbit_prepare: bool,
                 adapter_dtype: str) -> dict[str, Any]:
    """The TrainingPlan fields these options set."""
    parts = tuple(p.strip() for p in offload.split(",") if p.strip() and p.strip() != "none")
    return {"expandable_segments": expandable_segments, "loss": loss, "loss_chunks": loss_chunks,
            "optimizer_in_backward": optimizer_in_backward, "offload": parts,
            "sharding": sharding, "reshard_after_forward": reshard_after_forward,
            "checkpointing_policy": checkpointing_policy, "double_quant": double_quant,
            "quant_compute_dtype": quant_compute_dtype, "kbit_prepare": kbit_prepare,
            "adapter_dtype": adapter_dtype}
