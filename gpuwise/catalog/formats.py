"""Storage formats (data/formats.toml): bytes per parameter including quantisation scales, the
GGUF block types, and llama.cpp's GGUF file types (each a mix of block types)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gpuwise.catalog.toml_cache import parsed_toml
from gpuwise.errors import GpuwiseError, normalise_name, unknown_name_error


@dataclass(frozen=True)
class GgmlType:
    """A GGUF block type: `block` elements stored in `bytes` bytes (ggml-common.h)."""

    id: str
    block: int
    bytes: int
    layout: str = ""

    @property
    def bits(self) -> float:
        """Bits a weight, the block's scales included."""
        return self.bytes * 8 / self.block


@dataclass(frozen=True)
class WeightFormat:
    id: str
    bits: int
    quantised: bool = False
    group_size: int = 0
    scale_bytes_per_group: float = 0.0
    scale_bytes_per_row: float = 0.0
    compute: str = ""  # dtype the non-quantised parts and the activations use
    other_bits: float = 0.0  # bits of the embeddings and head where quantised too (GGUF)
    aliases: tuple[str, ...] = ()
    source: str = ""
    ggml_type: str = ""  # the ggml type llama.cpp stores the matrices in ("": none)
    # GGUF file types: the token embedding's and the output head's bits, and the share of the
    # matrix weights stored in each type other than `ggml_type` (llama-quant.cpp's mix)
    embd_bits: float = 0.0
    head_bits: float = 0.0
    mix: tuple[tuple[str, float], ...] = ()
    # which matrices it quantises: "all" attention and MLP matrices, or, in a mixture of
    # experts, the routed "experts" alone (gpt-oss's MXFP4: attention and router stay bf16)
    scope: str = "all"

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    @property
    def matrix_bits(self) -> float:
        """Mean bits a matrix weight, scales included."""
        scales = self.scale_bytes_per_group / self.group_size if self.group_size else 0.0
        return self.bits + 8 * scales

    @property
    def gguf(self) -> bool:
        """A llama.cpp GGUF file type (the embeddings and head quantised too)."""
        return bool(self.other_bits)

    def linear_bytes(self, rows: int, cols: int) -> float:
        """Stored bytes of one rows x cols matrix weight, scales included."""
        n = rows * cols
        scales = rows * self.scale_bytes_per_row
        if self.group_size:
            scales += n / self.group_size * self.scale_bytes_per_group
        return n * self.bytes_per_element + scales

    @property
    def compute_dtype(self) -> str:
        return self.compute or self.id


@cache
def _data() -> dict[str, Any]:
    """formats.toml, parsed once (callers must not change it)."""
    return parsed_toml(resources.files("gpuwise.catalog").joinpath("data/formats.toml").read_text(),
                       "formats")


@cache
def ggml_types() -> dict[str, GgmlType]:
    """The GGUF block types by their lower-case ggml name ("q4_k")."""
    return {rec["id"]: GgmlType(**rec) for rec in _data()["ggml_type"]}


def _gguf_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """A GGUF file type's bits, group and scales from its block types: the main type's integer
    bits, and the rest of the matrices' mean bits (the main type's scales and the mix) as scale
    bytes per main block; other_bits the mean of the embeddings' and the head's."""
    types = ggml_types()
    main = types[rec["ggml_type"]]
    mix = rec.pop("mix")
    matrix = main.bits + sum(share * (types[t].bits - main.bits) for t, share in mix.items())
    bits = math.floor(main.bits)
    embd, head = types[rec.pop("token_embd")].bits, types[rec.pop("output")].bits
    return {**rec, "bits": bits, "group_size": main.block,
            "scale_bytes_per_group": (matrix - bits) * main.block / 8,
            "other_bits": (embd + head) / 2, "embd_bits": embd, "head_bits": head,
            "mix": tuple(sorted(mix.items()))}


@cache
def _formats() -> dict[str, WeightFormat]:
    out = {}
    for rec in _data()["format"]:
        if "output" in rec:
            rec = _gguf_fields(dict(rec))
        rec = {k: v for k, v in rec.items() if k in WeightFormat.__dataclass_fields__}
        rec["aliases"] = tuple(rec.get("aliases", ()))
        fmt = WeightFormat(**rec)
        out[fmt.id] = fmt
    return out


@cache
def _ambiguous() -> dict[str, tuple[tuple[str, str], ...]]:
    """Names several formats answer to ("fp4"): each format and what it is."""
    return {normalise_name(rec["name"]): tuple(zip(rec["means"], rec["what"], strict=True))
            for rec in _data().get("ambiguous", ())}


def weight_formats() -> list[str]:
    """Every format's id, in the catalogue's order."""
    return list(_formats())


def weight_format(name: str) -> WeightFormat:
    fmt = _format_named(name)
    if fmt is None:
        means = _ambiguous().get(normalise_name(name))
        if means:
            listed = ", ".join(f"{f} ({what})" for f, what in means)
            names = [repr(f) for f, _ in means]
            raise GpuwiseError(f"{name.strip()} is ambiguous: one of {listed}",
                               f"did you mean {', '.join(names[:-1])} or {names[-1]}? "
                               "Name the one the checkpoint holds")
        raise unknown_name_error("precision", name, list(_formats()), "gpuwise check MODEL")
    return fmt


@cache
def _format_named(name: str) -> WeightFormat | None:
    """The format a name or alias stands for (None: none); cached, as estimates ask often."""
    key = normalise_name(name)
    return next((f for f in _formats().values()
                 if key in (f.id, normalise_name(f.id)) or key in f.aliases), None)


def dtype_bytes(name: str) -> float:
    """Bytes per element of a plain (or quantised, without scales) dtype."""
    return weight_format(name).bytes_per_element


def shipped_weights(config: dict[str, Any]) -> str | None:
    """The format a model's config.json says its weights ship in (`quantization_config`, as
    transformers and vLLM read it): gpt-oss's MXFP4, DeepSeek-V3's block-scaled fp8, an
    AWQ/GPTQ checkpoint's int4 or int8; None where it names none gpuwise has (bf16 then)."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        return "mxfp4"
    if method == "fp8":
        return "fp8-block" if q.get("weight_block_size") else "fp8"
    if method in ("awq", "gptq"):
        return {4: "int4", 8: "int8"}.get(int(q.get("bits", 4) or 4))
    return None
