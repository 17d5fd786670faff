"""Safetensors headers through the safetensors library: a file, or a (sharded) model folder.

`safe_open` memory-maps the file and parses only the JSON header (the library refuses headers
over 100 MB and checks every tensor's offsets against its shape and dtype); shapes and dtypes
come from `get_slice`, which reads no tensor data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints.quant_layouts import recognise_quantised
from gpuwise.catalog.checkpoints.records import MAX_FILE_BYTES, Checkpoint, StoredTensor
from gpuwise.errors import GpuwiseError
from gpuwise.files import file_type, read_json, regular_file, shown
from gpuwise.units import MIB

INDEX_NAME = "model.safetensors.index.json"
INSTALL_HINT = "pip install 'gpuwise[checkpoints]' (or: pip install safetensors)"
MAX_SHARDS = 10_000
MAX_INDEX_BYTES = 64 * MIB  # an index names each tensor once: ~1 MB for the largest models
MAX_CONFIG_BYTES = 16 * MIB  # real config.json files are a few KB (id2label maps: ~1 MB)
CORRUPT_HINT = "the file is truncated or corrupt; download it again"

# Bits per element of every safetensors dtype code (the format spec, safetensors >= 0.5).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise GpuwiseError("reading a .safetensors file needs the safetensors package",
                           INSTALL_HINT) from None
    return safe_open


def tensor_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Exact bytes of a tensor: elements x bits / 8 (sub-byte dtypes pack whole bytes)."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise GpuwiseError(f"unknown safetensors dtype {dtype!r}",
                           f"known: {', '.join(DTYPE_BITS)}")
    n = 1
    for d in shape:
        n *= d
    return (n * bits + 7) // 8


def read_config_json(path: Path) -> dict[str, Any]:
    """A model's config.json: a regular file holding one JSON object, bounded in size."""
    return read_json(path, "model config", MAX_CONFIG_BYTES, "pass a Hugging Face config.json")


def safetensors_files(folder: Path) -> list[Path]:
    """The *.safetensors entries of a folder, sorted (an unreadable folder is one error)."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(".safetensors"))
    except OSError as exc:
        raise GpuwiseError(f"cannot read model folder {shown(folder)}: {exc.strerror}",
                           "check the folder's permissions") from None
    return [folder / name for name in names]


def read_safetensors_file(path: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """Every tensor of one file with its exact stored bytes, and the header's metadata."""
    regular_file(path, "safetensors file", MAX_FILE_BYTES, CORRUPT_HINT)
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
                                            path.name))
    except GpuwiseError:
        raise
    except OSError as exc:
        raise GpuwiseError(f"cannot read {shown(path)}: {exc.strerror or exc}",
                           "check the path") from None
    except Exception as exc:  # SafetensorError and friends: a malformed or hostile header
        raise GpuwiseError(f"{shown(path)} is not a valid safetensors file ({_first_line(exc)})",
                           CORRUPT_HINT) from None
    return tensors, metadata


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _shards(folder: Path) -> list[Path]:
    """The shard files of a model folder: from its index, or every *.safetensors in it."""
    index = folder / INDEX_NAME
    if file_type(index, "safetensors index") is None:
        files = safetensors_files(folder)
        if not files:
            raise GpuwiseError(f"no .safetensors files in {shown(folder)}",
                               "pass a model folder, a .safetensors or a .gguf file")
        return files
    weight_map = read_json(index, "safetensors index", MAX_INDEX_BYTES,
                           "the index file is corrupt; download it again").get("weight_map")
    names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    if not names or len(names) > MAX_SHARDS or not all(isinstance(n, str) for n in names):
        raise GpuwiseError(f"{shown(index)} lists no usable shard files (no weight_map)",
                           "check the index file")
    try:
        root = folder.resolve()
        shards = [(folder / name).resolve() for name in names]
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte in a name
        raise GpuwiseError(f"{shown(index)} names a shard that cannot be a file",
                           "check the index file") from None
    for name, shard in zip(names, shards, strict=True):
        if root not in shard.parents:  # an index must not point outside its own folder
            raise GpuwiseError(f"{shown(index)} names a file outside the model folder: "
                               f"{shown(name)!r}", "check the index file")
        if file_type(shard, "safetensors file") is None:
            raise GpuwiseError(f"shard {shown(name)} listed in {index.name} is missing",
                               "download every shard of the model")
    return shards


def _sibling_config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.json"
    if file_type(path, "model config") is None:
        return None
    return read_config_json(path)


def read_safetensors(path: Path) -> Checkpoint:
    """A .safetensors file or a folder of shards, with config.json from the same folder."""
    is_folder = file_type(path, "checkpoint") == "directory"
    files = _shards(path) if is_folder else [path]
    folder = path if is_folder else path.parent
    tensors: list[StoredTensor] = []
    metadata: dict[str, Any] = {}
    seen: set[str] = set()
    for file in files:
        found, meta = read_safetensors_file(file)
        for t in found:
            if t.name in seen:
                raise GpuwiseError(f"tensor {t.name!r} is stored twice (again in {file.name})",
                                   "the shards do not belong together")
            seen.add(t.name)
        tensors += found
        metadata.update(meta)
    config = _sibling_config(folder)
    quant_cfg = (config or {}).get("quantization_config")
    quantised = recognise_quantised({t.name: t for t in tensors},
                                    quant_cfg if isinstance(quant_cfg, dict) else {})
    return Checkpoint(str(path), "safetensors", tuple(tensors), tuple(quantised), config,
                      "config.json" if config else "", metadata,
                      tuple(f.name for f in files))
