"""Writers of small safetensors and GGUF files for the checkpoint tests (real libraries)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")
from safetensors import TensorSpec, serialize_file  # noqa: E402

Q = gguf.GGMLQuantizationType


def write_safetensors(path: Path, specs: dict[str, tuple[str, list[int], int]]) -> int:
    """Write tensors given as name -> (dtype, shape, data bytes); returns the bytes written."""
    total = sum(n for _, _, n in specs.values())
    buf = np.arange(max(total, 1), dtype=np.uint8)
    tensors, at = {}, 0
    for name, (dtype, shape, n) in specs.items():
        tensors[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data + at,
                                   data_len=n)
        at += n
    serialize_file(tensors, str(path), metadata={"format": "pt"})
    return total


def header_bytes(path: Path) -> dict[str, int]:
    """Bytes per tensor from the header's data_offsets: the file's own account."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
            if k != "__metadata__"}


def gptq_layer(prefix: str, out: int, inp: int, bits: int = 4, group: int = 128) -> dict:
    pack = 32 // bits
    return {
        f"{prefix}.qweight": ("int32", [inp // pack, out], inp // pack * out * 4),
        f"{prefix}.qzeros": ("int32", [inp // group, out // pack], inp // group * out // pack * 4),
        f"{prefix}.scales": ("float16", [inp // group, out], inp // group * out * 2),
        f"{prefix}.g_idx": ("int32", [inp], inp * 4),
    }


def awq_layer(prefix: str, out: int, inp: int, bits: int = 4, group: int = 128) -> dict:
    pack = 32 // bits
    return {
        f"{prefix}.qweight": ("int32", [inp, out // pack], inp * out // pack * 4),
        f"{prefix}.qzeros": ("int32", [inp // group, out // pack], inp // group * out // pack * 4),
        f"{prefix}.scales": ("float16", [inp // group, out], inp // group * out * 2),
    }


LLAMA_META = {"block_count": 2, "context_length": 512, "embedding_length": 64,
              "feed_forward_length": 128, "head_count": 4, "head_count_kv": 2}


def write_gguf(path: Path, types: list, vocab: int = 96, tied: bool = True) -> dict[str, int]:
    """A tiny llama GGUF with one tensor per ggml type; returns name -> bytes written."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    written = {}
    rng = np.random.default_rng(0)

    def add(name: str, shape: tuple[int, int], qtype) -> None:
        values = rng.standard_normal(shape).astype(np.float32)
        if qtype == Q.F32:
            data = values
        elif qtype == Q.F16:
            data = values.astype(np.float16)
        else:
            try:
                data = gguf.quants.quantize(values, qtype)
            except (NotImplementedError, gguf.quants.QuantError):  # K-quants: raw blocks
                data = np.zeros(gguf.quants.quant_shape_to_byte_shape(shape, qtype), np.uint8)
        w.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        written[name] = int(data.nbytes)

    add("token_embd.weight", (vocab, 64), Q.Q8_0)
    if not tied:
        add("output.weight", (vocab, 64), Q.Q5_0)
    for i, qtype in enumerate(types):
        add(f"blk.{i}.ffn_up.weight", (128, 256), qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written
