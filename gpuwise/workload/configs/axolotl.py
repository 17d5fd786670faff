"""axolotl configs (`axolotl train FILE`): the keys of axolotl's examples/*.yml as its schema
reads them (src/axolotl/utils/schemas/, utils/config/__init__.py: `bf16` loads the model in
bfloat16, `load_in_4bit` with `adapter: qlora` loads it in bitsandbytes nf4)."""

from __future__ import annotations

from typing import Any

from gpuwise.workload.configs.hf_training_args import ATTENTION, OPTIMIZERS
from gpuwise.workload.configs.reading import (
    TRAIN,
    ConfigRead,
    Document,
    Reader,
    accumulation,
    choice,
    count,
    dropout,
    lora_modules,
    model_named,
    sequence,
    truthy,
    whole,
)
from gpuwise.workload.plans import LORA_TARGETS

NO_EFFECT = ("model_type", "tokenizer_type", "base_model_config", "datasets",
             "dataset_prepared_path", "val_set_size", "output_dir", "lora_model_dir",
             "lora_alpha", "wandb_project", "wandb_entity", "wandb_watch", "wandb_name",
             "wandb_log_model", "num_epochs", "lr_scheduler", "learning_rate", "tf32",
             "resume_from_checkpoint", "logging_steps", "warmup_ratio", "warmup_steps",
             "evals_per_epoch", "saves_per_epoch", "weight_decay", "special_tokens",
             "hub_model_id", "eval_sample_packing", "sample_packing", "pad_to_sequence_len",
             "strict", "seed", "chat_template", "trust_remote_code", "max_grad_norm",
             "gradient_checkpointing_kwargs", "train_on_inputs", "group_by_length", "debug",
             "early_stopping_patience", "local_rank", "xformers_attention", "save_strategy",
             "eval_steps", "save_steps", "save_total_limit", "eval_table_size",
             "eval_max_new_tokens", "max_steps", "loss_watchdog_threshold",
             "loss_watchdog_patience", "flash_attn_cross_entropy", "flash_attn_rms_norm")


def is_axolotl(data: dict[str, Any]) -> bool:
    return "base_model" in data or "adapter" in data or "micro_batch_size" in data


def read(doc: Document) -> ConfigRead:
    assert doc.data is not None
    r = Reader("axolotl", TRAIN, doc.data)
    adapter = str(r.peek("adapter") or "")
    four_bit = truthy(r.peek("load_in_4bit", False))
    eight_bit = truthy(r.peek("load_in_8bit", False))
    finetune = "qlora" if adapter == "qlora" or (adapter == "lora" and four_bit) else (
        "lora" if adapter == "lora" else "full")
    if r.has("base_model"):
        r.apply("base_model", r.peek("base_model"), model=model_named(str(r.take("base_model"))))
    if r.has("adapter"):
        r.apply("adapter", r.take("adapter"), finetune=finetune)
        if adapter not in ("lora", "qlora"):
            r.not_modelled("adapter", adapter, "an adapter gpuwise does not model: LoRA assumed")
    for key, value in (("load_in_4bit", four_bit), ("load_in_8bit", eight_bit)):
        if r.has(key):
            if key == "load_in_8bit" and value:
                r.not_modelled(key, r.take(key), "an 8-bit (bitsandbytes LLM.int8) base: gpuwise "
                               "counts the base in the training dtype")
            else:
                r.apply(key, r.take(key))
    if finetune != "full":
        _lora(r)
    _training(r, finetune)
    r.take_no_effect(NO_EFFECT)
    names = {"full": "full fine-tune", "lora": "LoRA", "qlora": "QLoRA"}
    return r.finish(f"axolotl {names[finetune]}")


def _lora(r: Reader) -> None:
    rank = whole(r.peek("lora_r"))
    if rank is not None:
        r.apply("lora_r", r.take("lora_r"), lora_rank=rank)
    if truthy(r.peek("lora_target_linear", False)):
        r.apply("lora_target_linear", r.take("lora_target_linear"),
                lora_targets=",".join(LORA_TARGETS))
    elif r.has("lora_target_linear"):
        r.apply("lora_target_linear", r.take("lora_target_linear"))
    lora_modules(r, "lora_target_modules")
    saved = r.take("lora_modules_to_save")
    if saved:
        r.not_modelled("lora_modules_to_save", saved, "these modules trained in full beside the "
                       "adapters (their gradients and optimizer states)")
    dropout(r, "lora_dropout")


def _training(r: Reader, finetune: str) -> None:
    count(r, "micro_batch_size", "batch")
    sequence(r, "sequence_len")
    # axolotl loads the model in the dtype bf16/fp16 name (torch_dtype), and trains in it
    bf16, fp16 = r.take("bf16"), r.take("fp16")
    dtype = "bf16" if truthy(bf16) else "fp16" if truthy(fp16) else "fp32"
    for key, value in (("bf16", bf16), ("fp16", fp16)):
        if value is not None:
            r.apply(key, value, dtype=dtype)
    checkpointing = r.take("gradient_checkpointing")
    if checkpointing is not None:
        r.apply("gradient_checkpointing", checkpointing, checkpointing=truthy(checkpointing))
        if str(checkpointing) == "offload":
            r.not_modelled("gradient_checkpointing", checkpointing, "the checkpoints offloaded "
                           "to host memory")
    choice(r, "optimizer", OPTIMIZERS, "optimizer", "an optimizer gpuwise does not model: "
           "AdamW's fp32 states assumed")
    attention = r.take("attn_implementation")
    if attention is None and truthy(r.peek("flash_attention", False)):
        attention = "flash_attention_2"
    if attention in ATTENTION:
        r.apply("attn_implementation", attention, attention=ATTENTION[str(attention)])
    elif attention is not None:
        r.not_modelled("attn_implementation", attention, "an attention gpuwise does not model")
    if r.has("flash_attention"):
        r.apply("flash_attention", r.take("flash_attention"))
    accumulation(r, "gradient_accumulation_steps")
    for key, why in (("deepspeed", "a DeepSpeed config: give its JSON with --config to see "
                      "what it sets"), ("fsdp", "FSDP settings: give --sharding fsdp2 --gpus N"),
                     ("fsdp_config", "FSDP settings: give --sharding fsdp2 --gpus N")):
        if r.has(key):
            r.not_modelled(key, r.take(key), why)
    for key in ("liger_kernel", "plugins"):
        if r.has(key):
            r.not_modelled(key, r.take(key), "kernels gpuwise does not model (Liger's fused "
                           "loss is --loss fused)")
