"""Measure what a runtime keeps for backward, per family, as coefficients of shape terms.

The training memory estimate needs the bytes autograd saves per layer. Rather than transcribe
each family's forward pass by hand, this builds a tiny model of the family whose dimensions are
chosen so that every shape product is distinct, runs one training forward pass under
`torch.autograd.graph.saved_tensors_hooks`, and classifies each saved storage by its element
count: b*s*d (hidden), b*s*q (query width), b*s*kv, b*s*i (MLP inner), b*h*s*s (attention
scores), b*s*v (logits), and so on. Running with one and with two layers separates what each
layer saves from what the model saves once. The result is written as data
(catalog/data/activation_profiles.json) that the pure estimator reads; a test re-runs this
against the installed transformers and checks the data still matches.

Written by `tools/write_activation_profiles.py` (needs torch and transformers).
"""

from __future__ import annotations

from typing import Any

from gpuwise.workload import count_params, from_config

# Tiny dimensions whose products are pairwise distinct for every term below.
B, S, D, H, HD, KV, I, V, E, K = 2, 13, 40, 4, 12, 2, 88, 101, 5, 2

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama"),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "gemma2": dict(model_type="gemma2", sliding_window=1024, query_pre_attn_scalar=HD,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "phi3": dict(model_type="phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "phi": dict(model_type="phi", head_dim=None, num_key_value_heads=H,
                partial_rotary_factor=0.4),
    "gpt_neox": dict(model_type="gpt_neox", head_dim=None, num_key_value_heads=H,
                     rotary_pct=0.5, use_parallel_residual=True),
    "gpt2": dict(model_type="gpt2", n_positions=64, head_dim=None),
    "gpt_bigcode": dict(model_type="gpt_bigcode", n_positions=64, multi_query=True,
                        head_dim=None),
    "falcon": dict(model_type="falcon", head_dim=None, bias=False, multi_query=True,
                   parallel_attn=True, new_decoder_architecture=False),
}

DTYPE_MODES = ("fp32", "bf16", "mixed-bf16")
ATTENTIONS = ("sdpa", "eager")


def _config(family: str, dropout: float) -> dict[str, Any]:
    spec = dict(FAMILIES[family])
    model_type = spec.pop("model_type")
    base: dict[str, Any] = dict(
        hidden_size=D, intermediate_size=I, num_attention_heads=H, num_key_value_heads=KV,
        head_dim=HD, num_hidden_layers=1, vocab_size=V, max_position_embeddings=64,
        attention_dropout=dropout, hidden_dropout=dropout, resid_pdrop=dropout,
        embd_pdrop=dropout, attn_pdrop=dropout, tie_word_embeddings=False,
    )
    if model_type in ("gpt2", "gpt_bigcode"):
        base.update(n_embd=D, n_head=H, n_layer=1, n_inner=I)
    base.update(spec)
    base = {k: v for k, v in base.items() if v is not None}
    base["model_type"] = model_type
    return base


def term_sizes(
    heads_kv: int, head_dim: int, rot: int, inner: int = I, d: int = D
) -> dict[str, int]:
    """Element counts of each shape term for the profiling dimensions."""
    return {
        "bsqkv": B * S * (H + 2 * heads_kv) * head_dim,
        "bsd": B * S * d, "bsq": B * S * H * head_dim, "bskv": B * S * heads_kv * head_dim,
        "bsi": B * S * inner, "bhss": B * H * S * S, "bkss": B * heads_kv * S * S,
        "bhs": B * H * S, "bs": B * S, "bsv": B * S * V, "bsh": B * S * head_dim,
        "bshr": B * S * H * rot, "bskr": B * S * heads_kv * rot,
        "bsr": B * S * rot,
    }


def _saved_storages(model: Any, input_ids: Any, autocast: Any) -> dict[int, tuple[int, int]]:
    """data_ptr -> (bytes, itemsize) of every storage autograd saves, parameters excluded.

    Low-precision copies of matrix weights (autocast's cast cache) get itemsize 0 as a marker.
    """
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    matrix_sizes = {p.numel() for p in model.parameters() if p.dim() == 2}
    saved: dict[int, tuple[int, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in params:
            is_cast = t.dim() == 2 and t.numel() in matrix_sizes and t.dtype != torch.float32
            saved[ptr] = (storage.nbytes(), 0 if is_cast else t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        out = model(input_ids=input_ids, labels=input_ids)
    # A training loop keeps the loss (as the Trainer does); the logits tensor itself is freed
    # once forward returns unless the loop holds the model output.
    loss = out.loss
    del out
    saved.setdefault(loss.untyped_storage().data_ptr(), (loss.untyped_storage().nbytes(),
                                                         loss.element_size()))
    return saved


def classify(saved: dict[int, tuple[int, int]], sizes: dict[str, int]) -> dict[str, float]:
    """Bytes per unit of each term; anything unmatched goes to 'other' (in bytes)."""
    by_count: dict[int, str] = {}
    for name, count in sizes.items():
        by_count.setdefault(count, name)  # first name wins when two coincide
    out: dict[str, float] = {}
    for nbytes, itemsize in saved.values():
        if itemsize == 0:
            out["weight_cast"] = out.get("weight_cast", 0.0) + nbytes
            continue
        numel = nbytes // itemsize
        term = by_count.get(numel)
        if term is None:
            out["other"] = out.get("other", 0.0) + nbytes
        else:
            out[term] = out.get(term, 0.0) + nbytes / sizes[term]
    return out


def tiny_model(family: str, mode: str, attention: str, layers: int,
               dropout: float = 0.0) -> tuple[dict[str, Any], Any]:
    """(config dict, model) of a family at the profiling dimensions with `layers` layers."""
    import torch
    import transformers

    cfg_dict = _config(family, dropout)
    cfg_dict["num_hidden_layers"] = layers
    if "n_layer" in cfg_dict:
        cfg_dict["n_layer"] = layers
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=dtype, attn_implementation=attention
    )
    return cfg_dict, model


def profile_one(family: str, mode: str, attention: str, checkpointing: bool,
                dropout: float) -> dict[str, dict[str, float]]:
    import contextlib

    import torch

    torch.manual_seed(0)
    results = []
    counts = []
    for layers in (1, 2):
        cfg_dict, model = tiny_model(family, mode, attention, layers, dropout)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "mixed-bf16"
                    else contextlib.nullcontext())
        ids = torch.randint(0, V, (B, S))
        arch = from_config(cfg_dict)
        sizes = term_sizes(
            arch.num_kv_heads, arch.head_dim, arch.rotary_dim, arch.intermediate_size
        )
        results.append(classify(_saved_storages(model, ids, autocast), sizes))
        counts.append(count_params(arch))
    one, two = results
    per_layer = {k: two.get(k, 0.0) - one.get(k, 0.0) for k in set(one) | set(two)}
    model_level = {k: one.get(k, 0.0) - per_layer.get(k, 0.0) for k in set(one) | set(per_layer)}
    # Weight copies are per parameter: per layer over the layer's matrices, once for the head.
    if "weight_cast" in per_layer:
        per_layer["weight_cast"] /= counts[1].linear - counts[0].linear
    if "weight_cast" in model_level:
        model_level["weight_cast"] /= max(1, counts[0].lm_head or counts[0].embedding)
    clean = lambda d: {k: round(v, 4) for k, v in sorted(d.items()) if abs(v) > 1e-9}  # noqa: E731
    return {"per_layer": clean(per_layer), "model": clean(model_level)}


def profile_all() -> dict[str, Any]:
    import torch
    import transformers

    profiles: dict[str, Any] = {}
    for family in FAMILIES:
        for mode in DTYPE_MODES:
            for attention in ATTENTIONS:
                for ckpt in (False, True):
                    for dropout in (0.0, 0.1):
                        key = f"{family}/{mode}/{attention}/{'ckpt' if ckpt else 'full'}/" \
                              f"{'dropout' if dropout else 'nodropout'}"
                        try:
                            profiles[key] = profile_one(family, mode, attention, ckpt, dropout)
                        except ValueError as exc:  # e.g. a family without an sdpa path
                            profiles[key] = {"unsupported": str(exc).split(".")[0]}
    return {
        "about": __doc__.split("\n\n")[1].replace("\n", " "),
        "runtime": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "dims": dict(B=B, S=S, D=D, H=H, HD=HD, KV=KV, I=I, V=V),
        "profiles": profiles,
    }
