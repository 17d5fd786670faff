"""LitGPT configs (`litgpt finetune lora --config FILE`, `litgpt pretrain --config FILE`): the
keys of LitGPT's config_hub/ files as litgpt/finetune/*.py and litgpt/args.py read them.
LitGPT's LoRA layers are the model's own parameters, in the dtype `precision` names, and its
`quantize: bnb.nf4` base is bitsandbytes' Linear4bit without peft."""

from __future__ import annotations

from typing import Any

from gpuwise.workload.configs.reading import (
    TRAIN,
    ConfigRead,
    Document,
    Reader,
    count,
    dropout,
    flatten,
    model_named,
    sequence,
    truthy,
    whole,
)

PRECISIONS = {"bf16-true": "bf16", "bf16-mixed": "mixed-bf16", "32-true": "fp32",
              "16-true": "fp16", "16-mixed": "mixed-fp16", "bf16": "mixed-bf16",
              "16": "mixed-fp16", "32": "fp32"}
LORA_SWITCHES = {"lora_query": ("q_proj",), "lora_key": ("k_proj",), "lora_value": ("v_proj",),
                 "lora_projection": ("o_proj",), "lora_mlp": ("gate_proj", "up_proj",
                                                              "down_proj")}
OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adamw", "AdamW": "adamw",
              "torch.optim.SGD": "sgd", "SGD": "sgd",
              "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw8bit",
              "bitsandbytes.optim.AdamW8bit": "adamw8bit"}
NO_EFFECT = ("out_dir", "data.", "train.save_interval", "train.log_interval", "train.lr_warmup_steps",
             "train.lr_warmup_fraction", "train.epochs", "train.max_tokens", "train.max_steps",
             "train.max_norm", "train.min_lr", "eval.", "logger_name", "seed", "lora_alpha",
             "optimizer.init_args.", "tokenizer_dir", "initial_checkpoint_dir", "resume",
             "access_token")


def is_litgpt(data: dict[str, Any]) -> bool:
    return ("checkpoint_dir" in data or "model_name" in data) and (
        "train" in data or "precision" in data or "devices" in data)


def read(doc: Document) -> ConfigRead:
    assert doc.data is not None
    r = Reader("litgpt", TRAIN, flatten(doc.data))
    lora = any(r.has(k) for k in ("lora_r", *LORA_SWITCHES))
    adapter = any(k.startswith("adapter") for k in r.left)
    quantize = str(r.peek("quantize") or "")
    finetune = "qlora" if lora and quantize.startswith("bnb.nf4") else (
        "lora" if lora else "full")
    for key in ("checkpoint_dir", "model_name"):
        if r.has(key):
            name = str(r.peek(key)).removeprefix("checkpoints/")
            r.apply(key, r.take(key), model=model_named(name), finetune=finetune)
    precision = r.take("precision")
    dtype = PRECISIONS.get(str(precision)) if precision is not None else None
    if dtype is not None:
        r.apply("precision", precision, dtype=dtype)
    elif precision is not None:
        r.not_modelled("precision", precision, "a precision gpuwise does not model")
    if quantize:
        _quantize(r, quantize, finetune, dtype)
    elif r.has("quantize"):
        r.apply("quantize", r.take("quantize"))
    if lora:
        _lora(r, dtype)
    _train(r)
    devices = whole(r.peek("devices"))
    if devices is not None:
        options: dict[str, Any] = {"gpus": devices}
        if devices > 1:  # LitGPT's FSDPStrategy: parameters, gradients and states sharded
            options["sharding"] = "fsdp2"
        r.apply("devices", r.take("devices"), **options)
    elif r.has("devices"):
        r.not_modelled("devices", r.take("devices"), "devices gpuwise cannot count: give --gpus")
    nodes = whole(r.peek("num_nodes"))
    if nodes == 1:
        r.no_effect("num_nodes", r.take("num_nodes"))
    elif r.has("num_nodes"):
        r.not_modelled("num_nodes", r.take("num_nodes"), "several nodes: give --gpus in all")
    r.take_no_effect((), NO_EFFECT)
    if adapter:
        stack = "LitGPT finetune adapter"
    else:
        stack = {"full": "LitGPT finetune full" if r.options.get("model") else "LitGPT",
                 "lora": "LitGPT finetune lora",
                 "qlora": f"LitGPT finetune lora --quantize {quantize}"}[finetune]
    return r.finish(stack)


def _quantize(r: Reader, quantize: str, finetune: str, dtype: str | None) -> None:
    value = r.take("quantize")
    if finetune == "qlora":
        compute = (dtype or "bf16").removeprefix("mixed-")
        r.apply("quantize", value, double_quant=quantize.endswith("-dq"),
                quant_compute_dtype=compute, kbit_prepare=False)
    else:
        r.not_modelled("quantize", value, "a quantized base gpuwise does not model (it models "
                       "bnb.nf4 and bnb.nf4-dq under LoRA)")


def _lora(r: Reader, dtype: str | None) -> None:
    rank = whole(r.peek("lora_r"))
    if rank is not None:
        r.apply("lora_r", r.take("lora_r"), lora_rank=rank)
    targets: list[str] = []
    for key, modules in LORA_SWITCHES.items():
        if truthy(r.peek(key, key in ("lora_query", "lora_value"))):  # LitGPT's defaults
            targets += modules
    present = [key for key in LORA_SWITCHES if r.has(key)]
    for key in present:
        r.apply(key, r.take(key), lora_targets=",".join(targets))
    if not present:
        r.apply("(LitGPT defaults)", "lora_query: true, lora_value: true",
                lora_targets=",".join(targets))
    if truthy(r.peek("lora_head", False)):
        r.not_modelled("lora_head", r.take("lora_head"), "a LoRA adapter on the output head")
    elif r.has("lora_head"):
        r.apply("lora_head", r.take("lora_head"))
    dropout(r, "lora_dropout")
    # LitGPT's adapters are parameters of the model: in its dtype, no fp32 casts
    adapters = (dtype or "bf16").removeprefix("mixed-")
    adapters = "fp32" if dtype and dtype.startswith("mixed-") else adapters
    r.apply("(LitGPT LoRA)", "adapters in the model's parameter dtype", adapter_dtype=adapters)


def _train(r: Reader) -> None:
    count(r, "train.micro_batch_size", "batch")
    sequence(r, "train.max_seq_length")
    global_batch = r.take("train.global_batch_size")
    if global_batch is not None:
        r.not_modelled("train.global_batch_size", global_batch, "gradient accumulation: "
                       "gpuwise's step is one micro-batch and one optimizer step")
    tie = r.take("train.tie_embeddings")
    if tie is None:
        r.no_effect("train.tie_embeddings", tie)
    else:
        r.not_modelled("train.tie_embeddings", tie, "gpuwise takes the model's own tying")
    optimizer = r.take("optimizer.class_path", r.take("optimizer"))
    if optimizer is not None and str(optimizer) in OPTIMIZERS:
        r.apply("optimizer.class_path", optimizer, optimizer=OPTIMIZERS[str(optimizer)])
    elif optimizer is not None:
        r.not_modelled("optimizer.class_path", optimizer, "an optimizer gpuwise does not model")
