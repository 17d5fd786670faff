"""GGUF metadata (llama.cpp's `{arch}.*` keys) turned into a Hugging Face style config dict,
so a GGUF file alone gives gpuwise an Architecture (gpuwise.workload.from_config)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints.records import StoredTensor
from gpuwise.errors import GpuwiseError

# GGUF general.architecture -> Hugging Face model_type (llama.cpp writes Mistral as "llama").
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma": "gemma",
                 "gemma2": "gemma2", "phi3": "phi3", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
                 "gemma3": "gemma3_text", "gpt-oss": "gpt_oss"}
MAX_SCALAR_ARRAY = 4096  # per-layer arrays (head counts) are kept; vocabularies are only counted


def metadata_values(gguf: Any, reader: Any) -> dict[str, Any]:
    """Scalar metadata by key; arrays become their length ("key.length") or, if short, a list."""
    value_type = gguf.GGUFValueType
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == value_type.ARRAY:
            length = int(field.parts[4][0])  # key length, key, type, item type, length, ...
            out[key + ".length"] = length
            if field.types[-1] != value_type.STRING and length <= MAX_SCALAR_ARRAY:
                out[key] = field.contents()
            continue
        out[key] = field.contents()
    file_type = out.get("general.file_type")
    if isinstance(file_type, int):
        with contextlib.suppress(ValueError):  # a type newer than the gguf package
            out["general.file_type_name"] = gguf.LlamaFileType(file_type).name
    return out


def _int(meta: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, list) and value:  # per-layer values: the largest decides memory
        value = max(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        if value is None:
            raise GpuwiseError(f"{path} has no {key!r} in its metadata",
                               "the GGUF file lacks the model's hyperparameters")
        raise GpuwiseError(f"{path}: metadata {key!r} must be a positive integer, got {value!r}",
                           "the GGUF file is corrupt")
    return value


def config_from_gguf(meta: dict[str, Any], tensors: dict[str, StoredTensor],
                     path: Path) -> dict[str, Any]:
    """The config.json facts of the model in a GGUF file."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GpuwiseError(f"{path}: GGUF architecture {arch!r} is not a family gpuwise knows",
                           f"supported GGUF architectures: {', '.join(ARCHITECTURES)}")
    heads = _int(meta, f"{arch}.attention.head_count", path)
    embd = tensors.get("token_embd.weight")
    vocab = meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens.length")
    if embd is not None and len(embd.shape) == 2:
        vocab = embd.shape[0]
    if not isinstance(vocab, int) or vocab <= 0:
        raise GpuwiseError(f"{path} gives no vocabulary size (no token_embd.weight, "
                           f"{arch}.vocab_size or tokenizer.ggml.tokens)",
                           "the GGUF file lacks the model's vocabulary")
    cfg: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "_name_or_path": str(meta.get("general.name") or path.stem),
        "hidden_size": _int(meta, f"{arch}.embedding_length", path),
        "num_hidden_layers": _int(meta, f"{arch}.block_count", path),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(meta, f"{arch}.attention.head_count_kv", path, heads),
        "intermediate_size": _int(meta, f"{arch}.feed_forward_length", path),
        "vocab_size": vocab,
        "max_position_embeddings": _int(meta, f"{arch}.context_length", path),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    head_dim = meta.get(f"{arch}.attention.key_length")
    if isinstance(head_dim, int) and head_dim > 0:
        cfg["head_dim"] = head_dim
    window = meta.get(f"{arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0:
        cfg["sliding_window"] = window
    experts = meta.get(f"{arch}.expert_count")
    if arch == "llama" and isinstance(experts, int) and experts > 1:
        cfg.update(model_type="mixtral", num_local_experts=experts,
                   num_experts_per_tok=_int(meta, f"{arch}.expert_used_count", path))
    if arch in ("qwen3moe", "gpt-oss"):  # llama.cpp's keys for the routed experts
        cfg.update(num_experts=_int(meta, f"{arch}.expert_count", path),
                   num_local_experts=_int(meta, f"{arch}.expert_count", path),
                   num_experts_per_tok=_int(meta, f"{arch}.expert_used_count", path),
                   moe_intermediate_size=_int(meta, f"{arch}.expert_feed_forward_length", path))
    if arch == "gpt-oss":  # the experts are intermediate_size wide; every layer routes
        cfg["intermediate_size"] = cfg["moe_intermediate_size"]
        cfg["attention_bias"] = "blk.0.attn_q.bias" in tensors
    return cfg
