"""The weights a checkpoint gives a plan: its exact stored bytes, or an estimate where the
runtime converts them (docs/checkpoints.md)."""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.formats import shipped_weights
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.workload.plans import StoredWeights

FORMAT_NAMES = {"gguf": "GGUF"}  # checkpoint formats as their users write them

# Stored dtype or quantisation scheme -> the gpuwise format whose compute dtype it runs in.
FORMAT_OF = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F8_E4M3": "fp8", "F8_E5M2": "fp8",
             "gptq": "int4", "awq": "int4", "bnb-int8": "int8", "bnb-nf4": "nf4",
             "bnb-fp4": "nf4"}
EMBEDDING_SUFFIXES = ("token_embd.weight", "embed_tokens.weight", "wte.weight", "embed_in.weight",
                      "word_embeddings.weight")


def gguf_tensors(ckpt: Any) -> tuple[tuple[str, str, int, int, int, int], ...]:
    """A GGUF's tensors in file order as (name, ggml type, rows, columns, bytes, experts),
    for the estimate of llama.cpp's CPU repacking and mapping; () for safetensors."""
    if ckpt.format != "gguf":
        return ()
    return tuple((t.name, t.dtype, t.shape[-2] if len(t.shape) > 1 else 1, t.shape[-1],
                  t.stored_bytes, t.shape[0] if len(t.shape) == 3 else 1)
                 for t in ckpt.tensors)


SHIPPED_WORD = "quantization_config"


def plan_weights(model: ResolvedModel, runtime: str, weights: str | None) -> dict[str, Any]:
    """`weights` and `stored_weights` for an InferencePlan, and a line saying where they are from.

    A checkpoint's exact bytes apply when the runtime keeps them as stored: llama.cpp (GGUF),
    vLLM, and transformers for safetensors. transformers dequantises GGUF weights on load, and
    an explicit --weights asks "what if re-quantised": both are estimated.
    """
    ckpt = getattr(model, "checkpoint", None)
    if ckpt is None or weights is not None:
        shipped = None if weights is not None else shipped_weights(model.config)
        fmt = weights or shipped or "bf16"
        why = " (--weights given)" if ckpt is not None and weights is not None else ""
        if shipped:
            why = f", the format its config.json ships ({SHIPPED_WORD})"
        return {"weights": fmt, "stored_weights": None, "source": f"estimated ({fmt}){why}",
                "shipped": bool(shipped)}
    unit = runtime_unit(runtime)
    if ckpt.format in unit.dequantises:
        return {
            "weights": "bf16",
            "stored_weights": None,
            "source": f"estimated (bf16): {runtime} dequantises {FORMAT_NAMES.get(ckpt.format, ckpt.format)} weights on load",
        }
    if ckpt.format not in unit.loads:
        runs = " and ".join(FORMAT_NAMES.get(f, f) for f in sorted(unit.loads))
        raise GpuwiseError(f"{runtime} runs {runs} files, not {ckpt.format}",
                           unit.convert_hint or "pick another --runtime")
    main = ckpt.main_dtype
    embedding = sum(t.stored_bytes for t in ckpt.tensors if t.name.endswith(EMBEDDING_SUFFIXES))
    file_type = str(ckpt.metadata.get("general.file_type_name") or "").removeprefix("MOSTLY_")
    label = f"{file_type or main} ({ckpt.format})"  # llama.cpp's name (Q4_K_M) where it has one
    stored = StoredWeights(ckpt.total_bytes, embedding, label,
                           main if ckpt.format == "gguf" else "", gguf_tensors(ckpt))
    return {"weights": FORMAT_OF.get(main, "fp16" if ckpt.format == "gguf" else "bf16"),
            "stored_weights": stored, "source": f"checkpoint (exact bytes): {label}"}
