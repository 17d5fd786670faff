"""What a checkpoint file holds, read from its headers: tensors, their stored bytes, and the
quantised weights recognised among them. No tensor data is ever read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuwise.units import GIB

# A file larger than this is no checkpoint (a 405B model in fp32 is 1.6 TB); a sparse file or
# a link to a huge device is refused before any library opens it.
MAX_FILE_BYTES = 4096 * GIB


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as stored: its dtype code and shape from the header, and its exact bytes."""

    name: str
    dtype: str  # the file's own code: "BF16", "I32" (safetensors) or "Q4_K", "F16" (GGUF)
    shape: tuple[int, ...]
    stored_bytes: int
    file: str = ""  # the shard it lives in (sharded safetensors folders)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class QuantisedWeight:
    """A quantised matrix recognised from its stored parts (GPTQ, AWQ, bitsandbytes, GGUF)."""

    name: str  # the layer: "model.layers.0.self_attn.q_proj" or "blk.0.attn_q.weight"
    scheme: str  # "gptq", "awq", "bnb-int8", "bnb-nf4", "bnb-fp4" or the GGUF type "Q4_K"
    bits: int  # nominal bits per weight of the packed values (scales not included)
    logical_shape: tuple[int, ...]  # (out_features, in_features) where the layout says it
    elements: int
    group_size: int  # 0: per row / per block as the scheme fixes it
    stored_bytes: int  # every part: packed values, scales, zeros, g_idx
    parts: tuple[str, ...] = ()

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per logical weight, scales and zeros included."""
        return 8 * self.stored_bytes / self.elements if self.elements else 0.0


@dataclass(frozen=True)
class Checkpoint:
    """The headers of a safetensors file or folder, or of a GGUF file."""

    path: str
    format: str  # "safetensors" or "gguf"
    tensors: tuple[StoredTensor, ...]
    quantised: tuple[QuantisedWeight, ...] = ()
    config: dict[str, Any] | None = field(default=None, repr=False)  # Hugging Face style
    config_source: str = ""  # "config.json", "GGUF metadata" or "" (none found)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    files: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Exact stored bytes of every tensor in the checkpoint."""
        return sum(t.stored_bytes for t in self.tensors)


    def bytes_by_dtype(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for t in self.tensors:
            out[t.dtype] += t.stored_bytes
        return dict(out.most_common())

    @property
    def quantised_bytes(self) -> int:
        return sum(q.stored_bytes for q in self.quantised)

    @property
    def logical_params(self) -> int:
        """Weights the model has: quantised matrices by their logical size, the rest as stored."""
        quant_parts = {p for q in self.quantised for p in q.parts}
        plain = sum(t.elements for t in self.tensors if t.name not in quant_parts)
        return plain + sum(q.elements for q in self.quantised)

    @property
    def main_dtype(self) -> str:
        """The dtype holding the most bytes (the quantisation scheme if that is the majority)."""
        if self.quantised and 2 * self.quantised_bytes >= self.total_bytes:
            schemes: Counter[str] = Counter()
            for q in self.quantised:
                schemes[q.scheme] += q.stored_bytes
            return schemes.most_common(1)[0][0]
        by = self.bytes_by_dtype()
        return next(iter(by)) if by else ""
