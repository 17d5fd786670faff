"""Hugging Face training configs: `TrainingArguments` as a JSON or YAML file (what
`HfArgumentParser` and TRL's recipes read, model arguments beside them), `accelerate`'s config
YAML (`accelerate launch --config_file`) with its DeepSpeed and FSDP sections, and the
DeepSpeed JSON either names (`deepspeed_config_file`, `deepspeed`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuwise.workload.configs.reading import (
    DTYPES,
    TRAIN,
    ConfigRead,
    Document,
    Reader,
    ReadOther,
    accumulation,
    choice,
    count,
    dropout,
    flatten,
    lora_modules,
    model_named,
    sequence,
    truthy,
    whole,
)

# transformers' OptimizerNames -> gpuwise's
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_hf": "adamw", "adamw_torch_fused": "adamw_fused",
              "adamw_bnb_8bit": "adamw8bit", "adamw_8bit": "adamw8bit",
              "paged_adamw_8bit": "paged_adamw8bit", "adafactor": "adafactor", "sgd": "sgd"}
ATTENTION = {"flash_attention_2": "flash", "sdpa": "sdpa", "eager": "eager"}
TRAINER_NO_EFFECT = (
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "evaluation_strategy", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_ratio", "warmup_steps", "weight_decay", "logging_steps", "logging_strategy",
    "logging_dir", "logging_first_step", "log_level", "save_strategy", "save_steps",
    "save_total_limit", "save_only_model", "seed", "data_seed", "report_to", "push_to_hub",
    "hub_model_id", "hub_strategy", "hub_private_repo", "num_train_epochs", "max_steps",
    "per_device_eval_batch_size", "eval_steps", "model_revision", "dataset_mixture",
    "dataset_name", "dataset_config", "dataset_num_proc", "dataset_text_field", "chat_template",
    "remove_unused_columns", "gradient_checkpointing_kwargs", "run_name", "tf32",
    "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "trust_remote_code",
    "lora_alpha", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_drop_last",
    "ddp_timeout", "ddp_find_unused_parameters", "packing", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "label_names", "use_peft",
    "torch_compile_backend", "optim_args", "bnb_4bit_quant_type", "include_tokens_per_second")
ACCELERATE_NO_EFFECT = (
    "compute_environment", "debug", "downcast_bf16", "machine_rank", "main_process_ip",
    "main_process_port", "main_training_function", "rdzv_backend", "same_network", "tpu_env",
    "tpu_use_cluster", "tpu_use_sudo", "enable_cpu_affinity", "gpu_ids", "num_machines",
    "distributed_type", "deepspeed_config.zero3_init_flag",
    "deepspeed_config.zero3_save_16bit_model", "deepspeed_config.deepspeed_multinode_launcher",
    "deepspeed_config.gradient_clipping", "fsdp_config.fsdp_auto_wrap_policy",
    "fsdp_config.fsdp_cpu_ram_efficient_loading", "fsdp_config.fsdp_state_dict_type",
    "fsdp_config.fsdp_sync_module_states", "fsdp_config.fsdp_use_orig_params",
    "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "fsdp_config.fsdp_version")
DEEPSPEED_NO_EFFECT = ("scheduler.", "optimizer.params.", "gradient_clipping", "steps_per_print",
                       "wall_clock_breakdown", "train_batch_size", "fp16.loss_scale",
                       "fp16.loss_scale_window", "fp16.initial_scale_power", "fp16.hysteresis",
                       "fp16.min_loss_scale", "zero_optimization.offload_optimizer.pin_memory",
                       "zero_optimization.offload_param.pin_memory",
                       "zero_optimization.stage3_gather_16bit_weights_on_model_save")


def is_training_arguments(data: Mapping[str, Any]) -> bool:
    return "per_device_train_batch_size" in data


def is_accelerate(data: Mapping[str, Any]) -> bool:
    return "compute_environment" in data or "distributed_type" in data


def is_deepspeed(data: Mapping[str, Any]) -> bool:
    return "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data


# ---- TrainingArguments -----------------------------------------------------------------------

def read_training_arguments(doc: Document, read_other: ReadOther) -> ConfigRead:
    assert doc.data is not None
    r = Reader("hf-trainer", TRAIN, flatten(_unnested(doc.data)))
    if r.has("model_name_or_path"):
        name = str(r.peek("model_name_or_path"))
        r.apply("model_name_or_path", r.take("model_name_or_path"), model=model_named(name))
    count(r, "per_device_train_batch_size", "batch")
    for key in ("max_seq_length", "max_length", "block_size", "model_max_length"):
        sequence(r, key)
    _precision(r)
    finetune = _peft(r)
    checkpointing = r.take("gradient_checkpointing")
    if checkpointing is not None:
        r.apply("gradient_checkpointing", checkpointing, checkpointing=truthy(checkpointing))
    choice(r, "optim", OPTIMIZERS, "optimizer", "an optimizer gpuwise does not model: AdamW's "
           "fp32 states assumed")
    choice(r, "attn_implementation", ATTENTION, "attention", "an attention gpuwise does not "
           "model")
    if r.has("torch_compile"):
        value = r.take("torch_compile")
        r.apply("torch_compile", value, **({"runtime": "compiled"} if truthy(value) else {}))
    if r.has("use_liger_kernel"):
        value = r.take("use_liger_kernel")
        r.apply("use_liger_kernel", value, **({"loss": "fused"} if truthy(value) else {}))
    accumulation(r, "gradient_accumulation_steps")
    stage = _trainer_sharding(r, read_other)
    r.take_no_effect(TRAINER_NO_EFFECT, tuple(k + "." for k in TRAINER_NO_EFFECT))
    parts = [p for p in ({"lora": "peft LoRA", "qlora": "peft QLoRA"}.get(finetune),
                         f"DeepSpeed ZeRO-{stage}" if stage is not None else None) if p]
    return r.finish("Hugging Face Trainer (TrainingArguments"
                    + "".join(f", {p}" for p in parts) + ")")


def _unnested(data: Mapping[str, Any]) -> dict[str, Any]:
    """`deepspeed` and `fsdp_config` inline mappings stay whole (read as their own sections)."""
    return {k: (json.dumps(v) if k in ("deepspeed",) and isinstance(v, Mapping) else v)
            for k, v in data.items()}


def _precision(r: Reader) -> None:
    """bf16/fp16 are autocast (mixed precision) over weights in the dtype the model is loaded
    in (`torch_dtype`): in the same dtype it is that dtype throughout."""
    loaded = None
    for key in ("torch_dtype", "dtype"):
        if r.has(key):
            value = str(r.peek(key))
            loaded = DTYPES.get(value)
            if loaded is None and value != "auto":
                r.not_modelled(key, r.take(key), "a dtype gpuwise does not know")
    amp = "bf16" if truthy(r.peek("bf16", False)) else "fp16" if truthy(r.peek("fp16", False)) \
        else None
    dtype = (amp if loaded == amp else f"mixed-{amp}") if amp else (loaded or "fp32")
    for key in ("bf16", "fp16", "torch_dtype", "dtype"):
        if r.has(key):
            r.apply(key, r.take(key), dtype=dtype)


def _peft(r: Reader) -> str:
    """TRL's ModelConfig beside the TrainingArguments: use_peft, load_in_4bit, lora_r, ..."""
    peft = truthy(r.peek("use_peft", False))
    four_bit = truthy(r.peek("load_in_4bit", False))
    finetune = "qlora" if peft and four_bit else "lora" if peft else "full"
    if r.has("use_peft"):
        r.apply("use_peft", r.peek("use_peft"), finetune=finetune)
    if r.has("load_in_4bit"):
        if four_bit and not peft:
            r.not_modelled("load_in_4bit", r.take("load_in_4bit"), "a 4-bit base without "
                           "adapters does not train")
        else:
            r.apply("load_in_4bit", r.take("load_in_4bit"), finetune=finetune)
    if truthy(r.peek("load_in_8bit", False)):
        r.not_modelled("load_in_8bit", r.take("load_in_8bit"), "an 8-bit (bitsandbytes "
                       "LLM.int8) base: gpuwise counts the base in the training dtype")
    if finetune == "full":
        return finetune
    rank = whole(r.peek("lora_r"))
    if rank is not None:
        r.apply("lora_r", r.take("lora_r"), lora_rank=rank)
    lora_modules(r, "lora_target_modules")
    if finetune == "qlora":
        # TRL's ModelConfig: use_bnb_nested_quant (default False) is bnb_4bit_use_double_quant
        nested = r.take("use_bnb_nested_quant", False)
        r.apply("use_bnb_nested_quant", nested, double_quant=truthy(nested))
        if str(r.peek("bnb_4bit_quant_type", "nf4")) != "nf4":
            r.not_modelled("bnb_4bit_quant_type", r.take("bnb_4bit_quant_type"),
                           "bitsandbytes fp4: gpuwise counts nf4")
    dropout(r, "lora_dropout")
    return finetune


def _trainer_sharding(r: Reader, read_other: ReadOther) -> int | None:
    """TrainingArguments' `deepspeed` (a JSON file's path, or the config inline) and `fsdp`."""
    stage = None
    if r.has("deepspeed"):
        value = r.take("deepspeed")
        text = str(value) if str(value).lstrip().startswith("{") else read_other(str(value))
        if text is None:
            r.not_modelled("deepspeed", value, "a DeepSpeed config gpuwise could not read")
        else:
            stage = deepspeed_section(r, "deepspeed", json.loads(text))
    fsdp = r.take("fsdp")
    if fsdp:
        words = str(" ".join(fsdp) if isinstance(fsdp, list) else fsdp).split()
        options: dict[str, Any] = {}
        if "full_shard" in words:
            options["sharding"] = "fsdp2"
        elif "shard_grad_op" in words:
            options["zero"] = 2
        if "offload" in words:
            options["offload"] = "params"
        r.apply("fsdp", fsdp, **options)
        if "hybrid_shard" in words:
            r.not_modelled("fsdp", fsdp, "hybrid sharding (within a node)")
    for key in [k for k in r.left if k.startswith("fsdp_config")]:
        r.not_modelled(key, r.take(key), "an FSDP setting gpuwise does not model")
    return stage


# ---- DeepSpeed -------------------------------------------------------------------------------

def read_deepspeed(doc: Document, read_other: ReadOther) -> ConfigRead:
    assert doc.data is not None
    r = Reader("deepspeed", TRAIN, {})
    stage = deepspeed_section(r, "", doc.data)
    return r.finish(f"DeepSpeed ZeRO-{stage or 0} config")


def deepspeed_section(r: Reader, prefix: str, config: Mapping[str, Any]) -> int | None:
    """A DeepSpeed config's settings into `r`, each key under `prefix`: the ZeRO stage, what
    it offloads, its precision and micro-batch. Returns the stage."""
    head = f"{prefix}." if prefix else ""
    for key, value in flatten(config).items():
        r.left[head + key] = value
    stage = whole(r.peek(head + "zero_optimization.stage"))
    if stage is not None:
        r.apply(head + "zero_optimization.stage", r.take(head + "zero_optimization.stage"),
                zero=stage)
    offload = []
    for part, what in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        key = f"{head}zero_optimization.{part}.device"
        device = str(r.peek(key, "none"))
        if device == "cpu":
            offload.append(what)
        elif device not in ("none", "None"):
            r.not_modelled(key, r.take(key), "offload to NVMe")
    for part in ("offload_optimizer", "offload_param"):
        key = f"{head}zero_optimization.{part}.device"
        if r.has(key):
            r.apply(key, r.take(key), offload=",".join(offload))
    for section, dtype in (("bf16", "mixed-bf16"), ("fp16", "mixed-fp16")):
        key = f"{head}{section}.enabled"
        if r.has(key):
            enabled = r.take(key)
            if truthy(enabled) and str(enabled) != "auto":
                r.apply(key, enabled, dtype=dtype)
            else:
                r.no_effect(key, enabled)  # "auto": the Trainer's bf16/fp16 say
    batch = whole(r.peek(head + "train_micro_batch_size_per_gpu"))
    if batch is not None:
        r.apply(head + "train_micro_batch_size_per_gpu",
                r.take(head + "train_micro_batch_size_per_gpu"), batch=batch)
    kind = r.take(head + "optimizer.type")
    if kind is not None and str(kind).lower() in ("adam", "adamw"):
        r.apply(head + "optimizer.type", kind, optimizer="adamw")
    elif kind is not None:
        r.not_modelled(head + "optimizer.type", kind, "an optimizer gpuwise does not model")
    accumulation(r, head + "gradient_accumulation_steps")
    r.take_no_effect((), tuple(head + k for k in DEEPSPEED_NO_EFFECT)
                     + (head + "train_micro_batch_size_per_gpu",))
    for key in [k for k in r.left if k.startswith(head + "zero_optimization.")
                or k.startswith(head + "activation_checkpointing.")]:
        r.not_modelled(key, r.take(key), "DeepSpeed's buffers and activation partitioning: "
                       "gpuwise takes its default buckets")
    return stage


# ---- accelerate ------------------------------------------------------------------------------

def read_accelerate(doc: Document, read_other: ReadOther) -> ConfigRead:
    assert doc.data is not None
    r = Reader("accelerate", TRAIN, flatten(doc.data))
    kind = str(r.peek("distributed_type", "NO")).upper()
    processes = whole(r.peek("num_processes"))
    if r.has("num_processes"):
        if kind != "NO" and processes:
            r.apply("num_processes", r.take("num_processes"), gpus=processes)
        else:
            r.no_effect("num_processes", r.take("num_processes"))
    how = {"MULTI_GPU": "DDP", "NO": "one process"}.get(kind, kind)
    if kind == "DEEPSPEED":
        stage = _accelerate_deepspeed(r, read_other)
        how = f"DeepSpeed ZeRO-{stage if stage is not None else '?'}"
    elif kind == "FSDP":
        how = f"FSDP {_accelerate_fsdp(r)}"
    elif kind not in ("NO", "MULTI_GPU"):
        r.not_modelled("distributed_type", kind, "a distribution gpuwise does not model")
    precision = r.take("mixed_precision")
    if precision is not None:
        dtype = {"bf16": "mixed-bf16", "fp16": "mixed-fp16", "no": "fp32"}.get(str(precision))
        if dtype is not None:
            r.apply("mixed_precision", precision, dtype=dtype)
        else:
            r.not_modelled("mixed_precision", precision, "a precision gpuwise does not model")
    backend = r.take("dynamo_config.dynamo_backend")
    if backend is not None:
        compiled = str(backend).upper() != "NO"
        r.apply("dynamo_config.dynamo_backend", backend,
                **({"runtime": "compiled"} if compiled else {}))
    if truthy(r.peek("use_cpu", False)):
        r.not_modelled("use_cpu", r.take("use_cpu"), "training on the CPU: give --on a CPU")
    elif r.has("use_cpu"):
        r.no_effect("use_cpu", r.take("use_cpu"))
    r.take_no_effect(ACCELERATE_NO_EFFECT, ("dynamo_config.",))
    over = f" over {processes} processes" if processes and kind != "NO" else ""
    return r.finish(f"accelerate launch ({how}{over})")


def _accelerate_deepspeed(r: Reader, read_other: ReadOther) -> int | None:
    path = r.take("deepspeed_config.deepspeed_config_file")
    stage = None
    if path is not None:
        text = read_other(str(path))
        if text is None:
            r.not_modelled("deepspeed_config.deepspeed_config_file", path,
                           "a DeepSpeed config gpuwise could not read")
        else:
            r.apply("deepspeed_config.deepspeed_config_file", path)
            stage = deepspeed_section(r, "deepspeed_config_file", json.loads(text))
    if r.has("deepspeed_config.zero_stage"):
        stage = whole(r.peek("deepspeed_config.zero_stage"))
        r.apply("deepspeed_config.zero_stage", r.take("deepspeed_config.zero_stage"), zero=stage)
    offload = []
    for key, what in (("deepspeed_config.offload_optimizer_device", "optimizer"),
                      ("deepspeed_config.offload_param_device", "params")):
        device = str(r.peek(key, "none"))
        if device == "cpu":
            offload.append(what)
        elif device != "none":
            r.not_modelled(key, r.take(key), "offload to NVMe")
    for key in ("deepspeed_config.offload_optimizer_device",
                "deepspeed_config.offload_param_device"):
        if r.has(key):
            r.apply(key, r.take(key), offload=",".join(offload))
    accumulation(r, "deepspeed_config.gradient_accumulation_steps")
    return stage


def _accelerate_fsdp(r: Reader) -> str:
    strategy = str(r.peek("fsdp_config.fsdp_sharding_strategy", "FULL_SHARD")).upper()
    named = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD",
             "4": "HYBRID_SHARD"}.get(strategy, strategy)
    layouts: dict[str, dict[str, Any]] = {"FULL_SHARD": {"sharding": "fsdp2"},
                                          "SHARD_GRAD_OP": {"zero": 2}, "NO_SHARD": {"zero": 0}}
    options = layouts.get(named, {})
    if r.has("fsdp_config.fsdp_sharding_strategy"):
        value = r.take("fsdp_config.fsdp_sharding_strategy")
        if options:
            r.apply("fsdp_config.fsdp_sharding_strategy", value, **options)
        else:
            r.not_modelled("fsdp_config.fsdp_sharding_strategy", value,
                           "hybrid sharding (within a node)")
    elif options:
        r.apply("distributed_type", "FSDP", **options)
    for key, option in (("fsdp_config.fsdp_offload_params", "offload"),
                        ("fsdp_config.fsdp_activation_checkpointing", "checkpointing"),
                        ("fsdp_config.fsdp_reshard_after_forward", "reshard_after_forward")):
        if r.has(key):
            value = r.take(key)
            if option == "offload":
                r.apply(key, value, offload="params" if truthy(value) else "")
            elif option == "reshard_after_forward" and str(value).upper() in named:
                r.no_effect(key, value)  # FSDP1 spells its strategy here
            else:
                r.apply(key, value, **{option: truthy(value)})
    for key in ("fsdp_config.fsdp_forward_prefetch", "fsdp_config.fsdp_backward_prefetch"):
        if r.has(key):  # gpuwise counts FSDP2's next unit, prefetched, in flight
            r.apply(key, r.take(key))
    return named
