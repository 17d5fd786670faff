"""Random-weight llama-architecture GGUF files written from a config, and llama.cpp's own
quantizer run on them.

The file holds what llama.cpp needs to load a llama model: the hyperparameters, a minimal
SentencePiece-style vocabulary (<unk>, <s>, </s>, the 256 byte tokens, then filler pieces) and
F16 weights drawn from N(0, 0.02) with the norms at 1.0 in F32. Tensors are written one at a
time (`GGUFWriter.add_tensor_info` first, then `write_tensor_data`), so a ~2 GB model needs
about its largest tensor in memory, not the whole file.

Numpy shapes are PyTorch's (out_features, in_features); gguf stores them reversed, as
llama.cpp expects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuwise.errors import GpuwiseError, unknown_name_error

GGUF_HINT = "pip install 'gpuwise[checkpoints]' (the gguf package and numpy)"
LLAMA_HINT = "pip install 'gpuwise[llama]' (builds llama.cpp; a few minutes)"
WEIGHT_STD = 0.02
RMS_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0
N_BYTE_TOKENS = 256
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# gguf's TokenType values, as llama.cpp reads them.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6
# qtype name -> the llama_cpp ftype constant (None: the F16 file as written).
QTYPES: dict[str, str | None] = {
    "f16": None,
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
}
QUANTIZE_TIMEOUT_S = 1800.0
_CHUNK_ELEMENTS = 1 << 24  # random numbers drawn per step: 64 MiB of float32


@dataclass(frozen=True)
class GgufConfig:
    """A llama-architecture model: sizes only, weights random."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int = 32000
    ctx: int = 4096

    def __post_init__(self) -> None:
        sizes = (self.hidden, self.layers, self.heads, self.kv_heads, self.ffn, self.ctx)
        if min(sizes) <= 0:
            raise GpuwiseError(f"model sizes must be positive, got {self}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise GpuwiseError(
                f"hidden {self.hidden}, heads {self.heads}, kv_heads {self.kv_heads} do not divide",
                "hidden must be a multiple of heads, heads a multiple of kv_heads",
            )
        minimum = len(SPECIAL_TOKENS) + N_BYTE_TOKENS
        if self.vocab < minimum:
            raise GpuwiseError(f"vocab {self.vocab} is too small", f"at least {minimum} tokens")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def name(self) -> str:
        return f"h{self.hidden}-l{self.layers}"

    @property
    def params(self) -> int:
        """All parameters: token embedding, blocks, final norm and the untied output head."""
        return sum(_count(shape) for _, shape in tensor_shapes(self))


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def tensor_shapes(cfg: GgufConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF tensor name, numpy shape) in file order; 1-D tensors are the F32 norms."""
    h, kv, f = cfg.hidden, cfg.kv_dim, cfg.ffn
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (cfg.vocab, h))]
    for i in range(cfg.layers):
        block = (("attn_norm", (h,)), ("attn_q", (h, h)), ("attn_k", (kv, h)),
                 ("attn_v", (kv, h)), ("attn_output", (h, h)), ("ffn_norm", (h,)),
                 ("ffn_gate", (f, h)), ("ffn_up", (f, h)), ("ffn_down", (h, f)))
        shapes += [(f"blk.{i}.{name}.weight", shape) for name, shape in block]
    shapes += [("output_norm.weight", (h,)), ("output.weight", (cfg.vocab, h))]
    return shapes


def need_gguf() -> tuple[ModuleType, ModuleType]:
    """The gguf and numpy modules, or a GpuwiseError saying how to install them."""
    try:
        import gguf
        import numpy
    except ImportError as exc:
        raise GpuwiseError(f"{exc.name or 'gguf'} is not installed", GGUF_HINT) from None
    return gguf, numpy


def need_llama_cpp() -> ModuleType:
    try:
        import llama_cpp
    except ImportError:
        raise GpuwiseError("llama-cpp-python is not installed", LLAMA_HINT) from None
    return llama_cpp


def vocabulary(n: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: the specials, the 256 byte tokens, then fillers."""
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * N_BYTE_TOKENS
    fillers = n - len(tokens)
    tokens += [f"\u2581t{i}" for i in range(fillers)]
    types += [TOKEN_NORMAL] * fillers
    scores = [0.0] * (n - fillers) + [-float(i) for i in range(fillers)]
    return tokens, scores, types


def _add_metadata(writer: Any, cfg: GgufConfig, gguf: ModuleType) -> None:
    writer.add_name(f"random-llama-{cfg.name}")
    writer.add_context_length(cfg.ctx)
    writer.add_embedding_length(cfg.hidden)
    writer.add_block_count(cfg.layers)
    writer.add_feed_forward_length(cfg.ffn)
    writer.add_head_count(cfg.heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_vocab_size(cfg.vocab)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, scores, types = vocabulary(cfg.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def _random_tensor(np: ModuleType, rng: Any, shape: tuple[int, ...]) -> Any:
    """F32 ones for a norm; otherwise F16 N(0, WEIGHT_STD) drawn a few rows at a time."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    out = np.empty(shape, dtype=np.float16)
    rows = max(1, _CHUNK_ELEMENTS // shape[1])
    for start in range(0, shape[0], rows):
        block = rng.standard_normal((min(rows, shape[0] - start), shape[1]), dtype=np.float32)
        block *= WEIGHT_STD
        out[start : start + len(block)] = block
    return out


def write_random_gguf(path: str | os.PathLike[str], cfg: GgufConfig, seed: int = 0) -> Path:
    """Write a random-weight F16 llama GGUF at `path` (through a .part file) and return it."""
    gguf, np = need_gguf()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    shapes = tensor_shapes(cfg)
    writer = gguf.GGUFWriter(part, arch="llama")
    try:
        _add_metadata(writer, cfg, gguf)
        for name, shape in shapes:
            dtype = np.dtype(np.float32 if len(shape) == 1 else np.float16)
            writer.add_tensor_info(name, shape, dtype, _count(shape) * dtype.itemsize)
        writer.write_header_to_file(part)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for _, shape in shapes:
            writer.write_tensor_data(_random_tensor(np, rng, shape))
    finally:
        writer.close()
    os.replace(part, path)
    return path


def qtype_key(qtype: str) -> str:
    """The canonical qtype name ("f16", "q8_0", "q4_0", "q4_k_m"), any case; else an error."""
    key = qtype.strip().lower().replace("-", "_")
    if key not in QTYPES:
        raise unknown_name_error("quantization type", qtype, QTYPES, "gguf_model.QTYPES")
    return key


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], qtype: str) -> Path:
    """`src` (an F16 GGUF) quantized to `qtype` by llama.cpp's quantizer, written at `dst`.

    "f16" quantizes nothing: `src` itself is returned. The quantizer runs in a child process
    (`bench_child`), with os.cpu_count() threads, so its log and memory stay out of the caller.
    """
    key = qtype_key(qtype)
    src = Path(src)
    if not src.is_file():
        raise GpuwiseError(f"no GGUF file at {src}", "write one with write_random_gguf()")
    if QTYPES[key] is None:
        return src
    need_llama_cpp()
    from gpuwise.measure.llama_cpp.bench_child import run_child

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    job = {"kind": "quantize", "src": str(src), "dst": str(dst), "ftype": QTYPES[key],
           "nthread": os.cpu_count() or 1}
    run_child(job, QUANTIZE_TIMEOUT_S, f"quantizing {src.name} to {key}")
    return dst
