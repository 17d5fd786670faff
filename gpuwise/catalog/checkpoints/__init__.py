"""Checkpoint files read from their headers only: safetensors (file or sharded folder) and GGUF.

`read_checkpoint(path)` gives the exact stored bytes of every tensor, the quantised matrices
recognised among them (GPTQ, AWQ, bitsandbytes, every ggml type) and the model's config
(config.json beside safetensors, or the GGUF metadata). Tensor data is never read.
"""

from __future__ import annotations

from pathlib import Path

from gpuwise.catalog.checkpoints.gguf_reader import read_gguf
from gpuwise.catalog.checkpoints.records import Checkpoint, QuantisedWeight, StoredTensor
from gpuwise.catalog.checkpoints.safetensors_reader import (
    INDEX_NAME,
    read_safetensors,
    safetensors_files,
)
from gpuwise.errors import GpuwiseError
from gpuwise.files import file_type, shown

__all__ = ["Checkpoint", "QuantisedWeight", "StoredTensor", "checkpoint_kind", "read_checkpoint"]
HINT = "pass a .gguf file, a .safetensors file or a folder with safetensors"


def checkpoint_kind(path: Path) -> str | None:
    """'gguf' or 'safetensors' if the path is a checkpoint gpuwise reads, else None (a FIFO or
    a device, even behind a link with the right suffix, is none)."""
    kind = file_type(path, "checkpoint", HINT)
    if kind == "file":
        suffix = path.suffix.lower()
        return {".gguf": "gguf", ".safetensors": "safetensors"}.get(suffix)
    if kind == "directory" and (
        file_type(path / INDEX_NAME, "safetensors index", HINT) is not None
        or safetensors_files(path)
    ):
        return "safetensors"
    return None


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a .gguf file, a .safetensors file, or a folder of safetensors shards."""
    path = Path(path).expanduser()
    kind = checkpoint_kind(path)
    if kind == "gguf":
        return read_gguf(path)
    if kind == "safetensors":
        return read_safetensors(path)
    what = file_type(path, "checkpoint", HINT)
    if what is None:
        raise GpuwiseError(f"no such file: {shown(path)}", "check the path")
    if what not in ("file", "directory"):
        raise GpuwiseError(f"{shown(path)} is a {what}, not a checkpoint file", HINT)
    raise GpuwiseError(f"{shown(path)} is not a checkpoint gpuwise reads", HINT)
