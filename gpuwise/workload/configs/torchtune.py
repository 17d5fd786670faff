"""torchtune recipe configs (`tune run <recipe> --config FILE`): the keys of torchtune's
recipes/configs/*.yaml as its recipes read them (recipes/full_finetune_single_device.py,
lora_finetune_single_device.py, full_finetune_distributed.py, lora_finetune_distributed.py)."""

from __future__ import annotations

import re
from typing import Any

from gpuwise.workload.configs.reading import (
    DTYPES,
    TRAIN,
    ConfigRead,
    Document,
    Reader,
    accumulation,
    catalogue_id,
    count,
    dropout,
    flatten,
    model_named,
    sequence,
    truthy,
    whole,
)

# torchtune's module names -> gpuwise's (peft's) LoRA target names
LORA_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj",
                "output_proj": "o_proj"}
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")  # apply_lora_to_mlp: w1, w3, w2
OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adamw",
              "torch.optim.SGD": "sgd", "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw8bit",
              "bitsandbytes.optim.AdamW8bit": "adamw8bit",
              "torchao.optim.AdamW8bit": "adamw8bit"}
CHUNKED_LOSSES = ("torchtune.modules.loss.LinearCrossEntropyLoss",
                  "torchtune.modules.loss.CEWithChunkedOutputLoss")
FULL_LOSSES = ("torch.nn.CrossEntropyLoss",)
# Keys the distributed recipes read and the single-device ones do not.
DISTRIBUTED_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers",
                    "tensor_parallel_dim", "data_parallel_shard_dim", "data_parallel_replicate_dim")
NO_EFFECT = ("output_dir", "seed", "shuffle", "epochs", "max_steps_per_epoch",
             "resume_from_checkpoint", "save_adapter_weights_only", "log_every_n_steps",
             "log_peak_memory_stats", "log_level", "device", "low_cpu_ram",
             "run_val_every_n_steps", "batch_size_val", "max_norm")
NO_EFFECT_UNDER = ("checkpointer.", "tokenizer.path", "tokenizer._component_",
                   "tokenizer.prompt_template", "dataset.", "dataset_val.", "metric_logger.",
                   "profiler.", "lr_scheduler.", "optimizer.lr", "optimizer.weight_decay",
                   "optimizer.betas", "optimizer.eps", "model.lora_alpha")


def is_torchtune(data: dict[str, Any]) -> bool:
    """A torchtune config names its components by `_component_` paths."""
    return any(k.endswith("_component_") for k in flatten(data))


def read(doc: Document) -> ConfigRead:
    assert doc.data is not None
    r = Reader("torchtune", TRAIN, flatten(doc.data))
    component = str(r.peek("model._component_") or "")
    builder = component.rsplit(".", 1)[-1]
    finetune = ("qlora" if builder.startswith("qlora_") or truthy(r.peek("model.quantize_base"))
                else "lora" if builder.startswith("lora_") else "full")
    _model(r, builder, finetune)
    recipe = _recipe(doc.text, finetune, any(r.has(k) for k in DISTRIBUTED_KEYS))
    if "distributed" in recipe:
        nproc = re.search(r"--nproc_per_node[ =](\d+)", doc.text)
        shown = f"{recipe} shards with FSDP2" + (
            f", on the {nproc.group(1)} devices of the file's `tune run` line" if nproc else "")
        extra = {"gpus": int(nproc.group(1))} if nproc else {}
        r.apply("(recipe)", shown, sharding="fsdp2", **extra)
    if finetune != "full":
        _lora(r)
    _training(r)
    r.take_no_effect(NO_EFFECT, NO_EFFECT_UNDER)
    return r.finish(f"torchtune {recipe} recipe")


def _model(r: Reader, builder: str, finetune: str) -> None:
    component = r.take("model._component_")
    named = catalogue_id(builder_name(builder)) if builder else None
    folder = r.peek("checkpointer.checkpoint_dir")
    if named is None and folder:
        named = catalogue_id(str(folder))
    options: dict[str, Any] = {"finetune": finetune}
    if named is not None:
        options["model"] = named
    elif folder:
        options["model"] = model_named(str(folder))
    r.apply("model._component_", component, **options)
    if r.has("model.quantize_base"):
        r.apply("model.quantize_base", r.take("model.quantize_base"))


def builder_name(builder: str) -> str:
    """torchtune's builder name as a model name: llama3_1_8b -> llama3.1-8b,
    qwen2_5_0_5b -> qwen2.5-0.5b, lora_llama3_2_1b -> llama3.2-1b."""
    words = re.sub(r"^q?lora_", "", builder).split("_")
    out: list[str] = []
    versioned = False
    for i, word in enumerate(words):
        following = words[i + 1] if i + 1 < len(words) else ""
        if word.isdigit() and out and out[-1][-1:].isdigit() and not versioned:
            out[-1] += "." + word
            versioned = True
        elif word.isdigit() and re.fullmatch(r"\d+[bm]", following):
            words[i + 1] = f"{word}.{following}"
        else:
            out.append(word)
    return "-".join(out)


def _recipe(text: str, finetune: str, distributed: bool) -> str:
    """The recipe the file is for: as its `tune run` comment names it, else from its keys."""
    named = re.search(r"tune run (?:--\S+ \S+ )*(\w+) --config", text)
    if named:
        return named.group(1)
    kind = "full_finetune" if finetune == "full" else "lora_finetune"
    return f"{kind}_{'distributed' if distributed else 'single_device'}"


def _lora(r: Reader) -> None:
    targets = [LORA_MODULES[m] for m in (r.peek("model.lora_attn_modules") or [])
               if m in LORA_MODULES]
    unknown = [m for m in (r.peek("model.lora_attn_modules") or []) if m not in LORA_MODULES]
    mlp = truthy(r.peek("model.apply_lora_to_mlp", False))
    if r.has("model.lora_attn_modules"):
        r.apply("model.lora_attn_modules", r.take("model.lora_attn_modules"),
                lora_targets=",".join(targets + (list(MLP_MODULES) if mlp else [])))
        if unknown:
            r.not_modelled("model.lora_attn_modules", unknown, "LoRA on modules gpuwise does "
                           "not adapt")
    if r.has("model.apply_lora_to_mlp"):
        r.apply("model.apply_lora_to_mlp", r.take("model.apply_lora_to_mlp"))
    if truthy(r.peek("model.apply_lora_to_output", False)):
        r.not_modelled("model.apply_lora_to_output", r.take("model.apply_lora_to_output"),
                       "a LoRA adapter on the output head")
    elif r.has("model.apply_lora_to_output"):
        r.apply("model.apply_lora_to_output", r.take("model.apply_lora_to_output"))
    rank = whole(r.peek("model.lora_rank"))
    if rank is not None:
        r.apply("model.lora_rank", r.take("model.lora_rank"), lora_rank=rank)
    dropout(r, "model.lora_dropout")
    # what torchtune's LoRA does that peft does not (docs/memory.md, "Training stacks'
    # memory features"): adapters in the base's dtype, no fp32 casts of the rest
    r.apply("(torchtune LoRA)", "adapters in the base's dtype, nothing cast to fp32",
            adapter_dtype=DTYPES.get(str(r.peek("dtype", "bf16")), "bf16"), kbit_prepare=False)


def _training(r: Reader) -> None:
    count(r, "batch_size", "batch")
    sequence(r, "tokenizer.max_seq_len")
    dtype = r.take("dtype")
    if dtype is not None:
        if str(dtype) in DTYPES:
            r.apply("dtype", dtype, dtype=DTYPES[str(dtype)])
        else:
            r.not_modelled("dtype", dtype, "a training dtype gpuwise does not know")
    _optimizer(r)
    loss = r.take("loss._component_")
    if loss in CHUNKED_LOSSES:
        chunks = whole(r.take("loss.num_output_chunks", 8)) or 8
        r.apply("loss._component_", loss, loss="chunked", loss_chunks=chunks)
    elif loss in FULL_LOSSES:
        r.apply("loss._component_", loss, loss="full")
    elif loss is not None:
        r.not_modelled("loss._component_", loss, "a loss gpuwise does not know: the full "
                       "cross-entropy assumed")
    _switch(r, "optimizer_in_bwd", "optimizer_in_backward")
    _switch(r, "enable_activation_checkpointing", "checkpointing")
    if r.has("ac_option") and whole(r.peek("ac_option")):
        r.apply("ac_option", r.peek("ac_option"),
                checkpointing_policy=str(whole(r.take("ac_option"))))
    offload = [part for key, part in (("enable_activation_offloading", "activations"),
                                      ("fsdp_cpu_offload", "params")) if truthy(r.peek(key))]
    for key in ("enable_activation_offloading", "fsdp_cpu_offload"):
        if r.has(key):
            r.apply(key, r.take(key), offload=",".join(offload))
    _switch(r, "fsdp_reshard_after_forward", "reshard_after_forward")
    compiled = r.take("compile")
    if compiled is not None:  # the model and loss compiled: gpuwise's compiled runtime
        r.apply("compile", compiled, **({"runtime": "compiled"} if truthy(compiled) else {}))
    accumulation(r, "gradient_accumulation_steps")
    clip = r.take("clip_grad_norm")
    if clip is None:
        r.no_effect("clip_grad_norm", clip)
    else:
        r.not_modelled("clip_grad_norm", clip, "the gradient norm's scratch")
    packed = r.take("dataset.packed")
    if packed is not None:
        r.no_effect("dataset.packed", packed)


def _optimizer(r: Reader) -> None:
    component = r.take("optimizer._component_")
    if component is None:
        return
    name = OPTIMIZERS.get(str(component))
    fused = r.take("optimizer.fused")
    if name == "adamw" and truthy(fused):
        r.apply("optimizer._component_", component, optimizer="adamw_fused")
        r.apply("optimizer.fused", fused)
    elif name is not None:
        r.apply("optimizer._component_", component, optimizer=name)
        if fused is not None:
            r.no_effect("optimizer.fused", fused)
    else:
        r.not_modelled("optimizer._component_", component, "an optimizer gpuwise does not know: "
                       "AdamW's states assumed")


def _switch(r: Reader, key: str, option: str) -> None:
    if r.has(key):
        value = r.take(key)
        r.apply(key, value, **{option: truthy(value)})
