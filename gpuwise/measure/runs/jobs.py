"""The jobs a real run's child process runs: a plan checked before any process starts, as a
JSON-able dict (the model's config.json facts, the plan's sizes and choices, the device)."""

from __future__ import annotations

import importlib.util

DTYPES = ("fp32", "bf16", "fp16")
TRAIN_DTYPES = DTYPES + ("mixed-bf16", "mixed-fp16")
ATTENTIONS = ("eager", "sdpa")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw8bit")
FINETUNES = ("full", "lora", "qlora")
# KV cache dtypes other than the compute dtype go through transformers' QuantizedCache.
KV_QUANTIZED = {"fp8": ("fp8", None), "int4": ("quanto", 4), "int2": ("quanto", 2)}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def inference_job(
    config: dict,
    *,
    batch: int,
    prompt_tokens: int,
    new_tokens: int,
    dtype: str = "bf16",
    attention: str = "sdpa",
    kv_dtype: str | None = None,
    device: str = "cpu",
) -> dict:
    """The child's job for a generate() plan, checked before any process starts."""
    _check_choice("dtype", dtype, DTYPES)
    _check_choice("attention", attention, ATTENTIONS)
    if kv_dtype is not None and kv_dtype != dtype:
        _check_choice("kv_dtype", kv_dtype, (dtype, *KV_QUANTIZED))
        if KV_QUANTIZED[kv_dtype][0] == "quanto":
            _need_module("optimum.quanto", f"a {kv_dtype} KV cache needs optimum-quanto")
        kv_dtype_job: str | None = kv_dtype
    else:
        kv_dtype_job = None
    _check_positive(batch=batch, prompt_tokens=prompt_tokens, new_tokens=new_tokens)
    job = {
        "kind": "inference",
        "config": _checked_config(config),
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "dtype": dtype,
        "attention": attention,
        "kv_dtype": kv_dtype_job,
        "device": device,
    }
    return job


def training_job(
    config: dict,
    *,
    batch: int,
    seq: int,
    dtype: str = "fp32",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    attention: str = "sdpa",
    finetune: str = "full",
    lora_rank: int = 16,
    lora_targets: tuple[str, ...] = LORA_TARGETS,
    device: str = "cpu",
    steps: int = 2,
) -> dict:
    """The child's job for a training plan, checked before any process starts."""
    _check_choice("dtype", dtype, TRAIN_DTYPES)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("attention", attention, ATTENTIONS)
    _check_choice("finetune", finetune, FINETUNES)
    _check_positive(batch=batch, seq=seq, steps=steps)
    on_cuda = device.startswith("cuda")
    if optimizer == "adamw8bit":
        _need_module("bitsandbytes", "the adamw8bit optimizer needs bitsandbytes and a CUDA GPU")
    if finetune == "qlora":
        if not on_cuda:
            raise RuntimeError("QLoRA validation needs bitsandbytes and a CUDA GPU (device='cuda')")
        _need_module("bitsandbytes", "QLoRA validation needs bitsandbytes and a CUDA GPU")
    if finetune in ("lora", "qlora"):
        _need_module("peft", "LoRA validation needs peft")
        _check_positive(lora_rank=lora_rank)
    job = {
        "kind": "training",
        "config": _checked_config(config),
        "batch": batch,
        "seq": seq,
        "dtype": dtype,
        "optimizer": optimizer,
        "checkpointing": checkpointing,
        "attention": attention,
        "finetune": finetune,
        "lora_rank": lora_rank,
        "lora_targets": list(lora_targets),
        "device": device,
        "steps": steps,
    }
    return job


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _need_module(module: str, message: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        found = False
    if not found:
        raise RuntimeError(f"{message} ({module} is not installed)")


def _checked_config(config: dict) -> dict:
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise RuntimeError(
            "real run: the model config must be a config.json dict with a 'model_type'"
        )
    return config
