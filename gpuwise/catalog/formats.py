"""Storage formats (data/formats.toml): bytes per parameter including quantisation scales."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpuwise.errors import normalise_name, unknown_name_error


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

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

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
def _formats() -> dict[str, WeightFormat]:
    text = resources.files("gpuwise.catalog").joinpath("data/formats.toml").read_text()
    out = {}
    for rec in tomllib.loads(text)["format"]:
        rec = {k: v for k, v in rec.items() if k in WeightFormat.__dataclass_fields__}
        rec["aliases"] = tuple(rec.get("aliases", ()))
        fmt = WeightFormat(**rec)
        out[fmt.id] = fmt
    return out


def weight_format(name: str) -> WeightFormat:
    fmt = _format_named(name)
    if fmt is None:
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
