"""Recognise quantised matrices among a checkpoint's stored tensors, from names and shapes.

Layouts (per linear layer `X`, nn.Linear weight shape (out, in)):
- GPTQ (AutoGPTQ / GPTQModel):  X.qweight int32 (in*bits/32, out), X.qzeros int32
  (groups, out*bits/32), X.scales fp16 (groups, out), X.g_idx int32 (in,)
- AWQ (AutoAWQ GEMM):           X.qweight int32 (in, out*bits/32), X.qzeros int32
  (groups, out*bits/32), X.scales fp16 (groups, out)
- bitsandbytes LLM.int8:        X.weight int8 (out, in), X.SCB fp32 (out,)
- bitsandbytes 4-bit:           X.weight uint8 (n/2, 1), X.weight.absmax, X.weight.quant_map,
  [X.weight.nested_absmax, X.weight.nested_quant_map], X.weight.quant_state.bitsandbytes__nf4
"""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.checkpoints.records import QuantisedWeight, StoredTensor

PACKED_BITS = (2, 3, 4, 8)


def recognise_quantised(tensors: dict[str, StoredTensor],
                        quant_cfg: dict[str, Any]) -> list[QuantisedWeight]:
    """Every GPTQ/AWQ/bitsandbytes matrix found; tensors that match no layout stay plain."""
    found = []
    for name in tensors:
        if name.endswith(".qweight"):
            q = _packed_int32(tensors, name.removesuffix(".qweight"), quant_cfg)
        elif name.endswith(".SCB"):
            q = _bnb_int8(tensors, name.removesuffix(".SCB"))
        elif ".weight.quant_state.bitsandbytes__" in name:
            q = _bnb_4bit(tensors, name)
        else:
            continue
        if q is not None:
            found.append(q)
    return found


def _cfg_bits(quant_cfg: dict[str, Any]) -> int | None:
    bits = quant_cfg.get("bits", quant_cfg.get("w_bit"))
    return bits if isinstance(bits, int) and bits in PACKED_BITS else None


def _packed_int32(tensors: dict[str, StoredTensor], base: str,
                  quant_cfg: dict[str, Any]) -> QuantisedWeight | None:
    qweight = tensors[base + ".qweight"]
    scales = tensors.get(base + ".scales")
    qzeros = tensors.get(base + ".qzeros")
    g_idx = tensors.get(base + ".g_idx")
    if scales is None or qweight.dtype not in ("I32", "U32") or len(qweight.shape) != 2:
        return None
    if len(scales.shape) != 2 or 0 in qweight.shape or 0 in scales.shape:
        return None
    rows, cols = qweight.shape
    groups, out = scales.shape
    if cols == out:  # GPTQ packs along the input dimension
        bits = _cfg_bits(quant_cfg)
        if bits is None and qzeros is not None and len(qzeros.shape) == 2:
            bits = 32 * qzeros.shape[1] // out
        if bits is None and g_idx is not None and g_idx.shape:
            bits = 32 * rows // g_idx.shape[0]
        scheme = "gptq"
        in_features = rows * 32 // bits if bits in PACKED_BITS else 0
    else:  # AWQ packs along the output dimension
        bits = 32 * cols // out if (32 * cols) % out == 0 else None
        scheme = "awq"
        in_features = rows
    if bits not in PACKED_BITS or not in_features or in_features % groups:
        return None
    parts = tuple(n for n in (qweight, scales, qzeros, g_idx) if n is not None)
    return QuantisedWeight(
        base, scheme, bits, (out, in_features), out * in_features, in_features // groups,
        sum(p.stored_bytes for p in parts), tuple(p.name for p in parts),
    )


def _bnb_int8(tensors: dict[str, StoredTensor], base: str) -> QuantisedWeight | None:
    weight = tensors.get(base + ".weight")
    if weight is None or weight.dtype != "I8" or len(weight.shape) != 2:
        return None
    parts = [weight, tensors[base + ".SCB"]]
    if base + ".weight_format" in tensors:
        parts.append(tensors[base + ".weight_format"])
    return QuantisedWeight(base, "bnb-int8", 8, weight.shape, weight.elements, 0,
                           sum(p.stored_bytes for p in parts),
                           tuple(p.name for p in parts))


def _bnb_4bit(tensors: dict[str, StoredTensor], state_name: str) -> QuantisedWeight | None:
    weight_name, _, kind = state_name.partition(".quant_state.bitsandbytes__")
    weight = tensors.get(weight_name)
    if weight is None or weight.dtype != "U8":
        return None
    prefix = weight_name + "."
    parts = [weight] + [t for n, t in tensors.items() if n.startswith(prefix)]
    elements = 2 * weight.elements  # two 4-bit values per byte
    absmax = tensors.get(prefix + "absmax")
    block = elements // absmax.elements if absmax and absmax.elements else 0
    return QuantisedWeight(weight_name.removesuffix(".weight"), f"bnb-{kind}", 4, (elements,),
                           elements, block, sum(p.stored_bytes for p in parts),
                           tuple(p.name for p in parts))
