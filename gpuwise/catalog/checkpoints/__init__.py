"""Checkpoint files read from their headers only: safetensors (file or sharded folder) and GGUF.

`read_checkpoint(path)` gives the exact stored bytes of every tensor, the quantised matrices
recognised among them (GPTQ, AWQ, bitsandbytes, every ggml type) and the model's config
(config.json beside safetensors, or the GGUF metadata). Tensor data is never read.
"""

from __future__ import annotations

from pathlib import Path

from gpuwise.catalog.checkpoints.gguf_reader import read_gguf
from gpuwise.catalog.checkpoints.records import Checkpoint, QuantisedWeight, StoredTensor
from gpuwise.catalog.checkpoints.safetensors_reader import read_safetensors
from gpuwise.errors import GpuwiseError

__all__ = ["Checkpoint", "QuantisedWeight", "StoredTensor", "checkpoint_kind", "read_checkpoint"]


def checkpoint_kind(path: Path) -> str | None:
    """'gguf' or 'safetensors' if the path is a checkpoint gpuwise reads, else None."""
    if path.is_file():
        suffix = path.suffix.lower()
        return {".gguf": "gguf", ".safetensors": "safetensors"}.get(suffix)
    if path.is_dir() and (
        (path / "model.safetensors.index.json").exists() or any(path.glob("*.safetensors"))
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
    if not path.exists():
        raise GpuwiseError(f"no such file: {path}", "check the path")
    raise GpuwiseError(f"{path} is not a checkpoint gpuwise reads",
                       "pass a .gguf file, a .safetensors file or a folder with safetensors")  # fmt: skip
