"""Safetensors headers through the safetensors library: a file, or a (sharded) model folder.

`safe_open` memory-maps the file and parses only the JSON header (the library refuses headers
over 100 MB and checks every tensor's offsets against its shape and dtype); shapes and dtypes
come from `get_slice`, which reads no tensor data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints.quant_layouts import recognise_quantised
from gpuwise.catalog.checkpoints.records import Checkpoint, StoredTensor
from gpuwise.errors import GpuwiseError

INDEX_NAME = "model.safetensors.index.json"
INSTALL_HINT = "pip install 'gpuwise[checkpoints]' (or: pip install safetensors)"
MAX_SHARDS = 10_000

# Bits per element of every safetensors dtype code (the format spec, safetensors >= 0.5).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}  # fmt: skip


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise GpuwiseError("reading a .safetensors file needs the safetensors package",
                           INSTALL_HINT) from None  # fmt: skip
    return safe_open


def tensor_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Exact bytes of a tensor: elements x bits / 8 (sub-byte dtypes pack whole bytes)."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise GpuwiseError(f"unknown safetensors dtype {dtype!r}",
                           f"known: {', '.join(DTYPE_BITS)}")  # fmt: skip
    n = 1
    for d in shape:
        n *= d
    return (n * bits + 7) // 8


def read_safetensors_file(path: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """Every tensor of one file with its exact stored bytes, and the header's metadata."""
    safe_open = _safe_open()
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
            tensors = []
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                piece = f.get_slice(name)
                shape = tuple(int(d) for d in piece.get_shape())
                dtype = str(piece.get_dtype())
                tensors.append(StoredTensor(name, dtype, shape, tensor_bytes(dtype, shape),
                                            path.name))  # fmt: skip
    except GpuwiseError:
        raise
    except OSError as exc:
        raise GpuwiseError(f"cannot read {path}: {exc.strerror or exc}", "check the path") from None
    except Exception as exc:  # SafetensorError and friends: a malformed or hostile header
        raise GpuwiseError(f"{path} is not a valid safetensors file ({_first_line(exc)})",
                           "the file is truncated or corrupt; download it again") from None  # fmt: skip
    return tensors, metadata


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _shards(folder: Path) -> list[Path]:
    """The shard files of a model folder: from its index, or every *.safetensors in it."""
    index = folder / INDEX_NAME
    if not index.exists():
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise GpuwiseError(f"no .safetensors files in {folder}",
                               "pass a model folder, a .safetensors or a .gguf file")  # fmt: skip
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise GpuwiseError(f"{index} is not a valid safetensors index (no weight_map)",
                           "the index file is corrupt; download it again") from None  # fmt: skip
    if not names or len(names) > MAX_SHARDS or not all(isinstance(n, str) for n in names):
        raise GpuwiseError(f"{index} lists no usable shard files", "check the index file")
    root = folder.resolve()
    shards = []
    for name in names:
        shard = (folder / name).resolve()
        if root not in shard.parents:  # an index must not point outside its own folder
            raise GpuwiseError(f"{index} names a file outside the model folder: {name!r}",
                               "check the index file")  # fmt: skip
        if not shard.exists():
            raise GpuwiseError(f"shard {name} listed in {index.name} is missing",
                               "download every shard of the model")  # fmt: skip
        shards.append(shard)
    return shards


def _sibling_config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise GpuwiseError(f"{path} is not valid JSON", "pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise GpuwiseError(f"{path} is not a JSON object", "pass a Hugging Face config.json")
    return data


def read_safetensors(path: Path) -> Checkpoint:
    """A .safetensors file or a folder of shards, with config.json from the same folder."""
    files = _shards(path) if path.is_dir() else [path]
    folder = path if path.is_dir() else path.parent
    tensors: list[StoredTensor] = []
    metadata: dict[str, Any] = {}
    seen: set[str] = set()
    for file in files:
        found, meta = read_safetensors_file(file)
        for t in found:
            if t.name in seen:
                raise GpuwiseError(f"tensor {t.name!r} is stored twice (again in {file.name})",
                                   "the shards do not belong together")  # fmt: skip
            seen.add(t.name)
        tensors += found
        metadata.update(meta)
    config = _sibling_config(folder)
    quant_cfg = (config or {}).get("quantization_config")
    quantised = recognise_quantised({t.name: t for t in tensors},
                                    quant_cfg if isinstance(quant_cfg, dict) else {})  # fmt: skip
    return Checkpoint(str(path), "safetensors", tuple(tensors), tuple(quantised), config,
                      "config.json" if config else "", metadata,
                      tuple(f.name for f in files))  # fmt: skip
