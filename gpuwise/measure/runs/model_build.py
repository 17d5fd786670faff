"""Build the model a real run measures, in the child process: random weights from the
config.json facts (nothing downloaded, no remote code run), in the plan's dtype and attention,
with activation checkpointing, LoRA adapters (peft) or QLoRA's 4-bit NF4 base (bitsandbytes)
as the plan says. torch, transformers and peft are imported inside."""

from __future__ import annotations

import contextlib
import gc
from typing import Any


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _model_config(config: dict) -> Any:
    import transformers

    facts = dict(config)
    model_type = facts.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"unknown model_type {model_type!r}: transformers {transformers.__version__} has no "
            "such architecture (a newer transformers may; remote code is never run)"
        )
    # Never remote code; and the plan, not the file, says the dtype and quantization.
    for key in ("auto_map", "torch_dtype", "dtype", "quantization_config", "_name_or_path"):
        facts.pop(key, None)
    return transformers.AutoConfig.for_model(model_type, **facts)


# A model of the family this small keeps every tensor under 64 KiB, below glibc's initial mmap
# threshold (128 KiB, catalog/data/allocators.toml): running it loads the runtime's code, kernel
# caches and thread pools without moving the allocator's dynamic threshold.
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 256,
        "intermediate_size": 64, "head_dim": 16, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "num_experts": 2, "n_routed_experts": 2,
        "num_local_experts": 2, "max_position_embeddings": 64, "ffn_hidden_size": 64,
        "n_inner": 64}
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _shrink(cfg: Any) -> None:
    """`cfg` made tiny in place (`TINY`), its layout kept: grouped KV heads stay grouped."""
    grouped = getattr(cfg, "num_key_value_heads", None) not in (None, cfg.num_attention_heads)
    for name, value in TINY.items():
        if getattr(cfg, name, None) is not None:
            with contextlib.suppress(AttributeError):  # a derived property (Falcon's head_dim)
                setattr(cfg, name, value)
    if getattr(cfg, "num_key_value_heads", None) is not None:
        cfg.num_key_value_heads = 2 if grouped else TINY["num_attention_heads"]
    if getattr(cfg, "num_experts_per_tok", None):
        cfg.num_experts_per_tok = 2
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:1]
    for name in TOKEN_IDS:  # ids past the tiny vocabulary would index out of it
        if getattr(cfg, name, None) is not None:
            setattr(cfg, name, 1)


def build_model(job: dict) -> Any:
    import torch
    import transformers

    cfg = _model_config(job["config"])
    if job.get("tiny"):
        _shrink(cfg)
    weight_dtype = "fp32" if job["dtype"].startswith("mixed-") else job["dtype"]
    if job.get("finetune") == "qlora":
        return _build_qlora_model(cfg, job)
    with torch.device(job["device"]):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch_dtype(weight_dtype), attn_implementation=job["attention"]
        )
    if job["kind"] == "inference":
        return model.eval()
    model.train()
    if job["checkpointing"]:
        _enable_checkpointing(model)
    if job["finetune"] == "lora":
        model = _with_lora(model, job)
    return model


def _enable_checkpointing(model: Any) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _with_lora(model: Any, job: dict) -> Any:
    try:
        import peft
    except ImportError as exc:
        raise RuntimeError("LoRA validation needs peft") from exc
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in job["lora_targets"] if t in names]
    if not targets:
        raise RuntimeError(
            f"none of the LoRA targets {job['lora_targets']} is a module of this model "
            f"(its modules include {sorted(n for n in names if not n.isdigit())[:20]})"
        )
    lora = peft.LoraConfig(r=job["lora_rank"], target_modules=targets, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora)


def _build_qlora_model(cfg: Any, job: dict) -> Any:
    """4-bit NF4 weights through the path users take: save random weights, load quantized."""
    import shutil
    import tempfile

    import peft
    import torch
    import transformers

    folder = tempfile.mkdtemp(prefix="gpuwise-qlora-")
    try:
        random = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        random.save_pretrained(folder)
        del random
        gc.collect()
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder,
            quantization_config=quant,
            dtype=torch.bfloat16,
            attn_implementation=job["attention"],
            device_map={"": job["device"]},
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    model = peft.prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=job["checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    model.train()
    return _with_lora(model, job)
