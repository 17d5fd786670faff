"""Which GGUF tensors llama.cpp's CPU backend copies into extra buffers, and what stays mapped.

`ggml_repack_get_optimal_repack_type` (ggml/src/ggml-cpu/repack.cpp) picks, by ggml type and
the CPU's instruction sets, an interleaved layout for a matmul's weight; the loader then puts
the tensor in the `CPU_REPACK` buffer (or in `AMX`, the first extra buffer type where built in:
ggml-cpu.cpp `ggml_backend_cpu_get_extra_buffer_types`) instead of leaving it in the mapped
file. The tensors and their types are a GGUF checkpoint's own where the plan has them, else
those llama-quant.cpp gives a file of the plan's format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

# GGUF 2-D tensors llama.cpp reads by row (ggml_get_rows), never through a matmul.
ROW_TABLES = ("token_embd.weight", "position_embd.weight", "per_layer_token_embd.weight")


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as llama.cpp loads it: its ggml type, ne[1] (rows, the outputs; 1 for a
    vector), ne[0] (columns) and stored bytes; `experts` > 1 for a 3-D MoE tensor."""

    name: str
    ggml_type: str
    rows: int
    cols: int
    nbytes: float
    experts: int = 1

    @property
    def matmul(self) -> bool:
        """A weight some MUL_MAT (or MUL_MAT_ID) reads: what an extra buffer may take."""
        return self.rows > 1 and not self.name.endswith(ROW_TABLES)


def _padded(n: int, pad: int) -> int:
    return -(-n // pad) * pad


def ggml_bytes(ggml_type: str, elements: float) -> float:
    block, size = llama_cpp_runtime().ggml_types[ggml_type]
    return elements / block * size


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers Q4_K_M/Q5_K_M give Q6_K attn_v/ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(ggml_type: str, cols: int) -> str:
    """llama-quant.cpp's tensor_type_fallback for a width the type's blocks do not divide."""
    rt = llama_cpp_runtime()
    if cols % rt.ggml_types[ggml_type][0] == 0:
        return ggml_type
    other = rt.quant_fallback.get(ggml_type, ggml_type)
    return other if cols % rt.ggml_types[other][0] == 0 else "f16"


def _layer_shapes(arch: Architecture) -> list[tuple[str, int, int, int]]:
    """(name, rows, cols, experts) of one layer's tensors, in llama-quant.cpp's order (by
    name within the layer: the order llama-quantize writes them)."""
    d = arch.hidden_size
    out = [("attn_k", arch.kv_dim, d, 1), ("attn_norm", 1, d, 1),
           ("attn_output", d, arch.q_dim, 1), ("attn_q", arch.q_dim, d, 1),
           ("attn_v", arch.kv_dim, d, 1)]
    if arch.moe:
        m, f = arch.moe, arch.moe.expert_intermediate
        out += [("ffn_down_exps", d, f, m.num_experts), ("ffn_gate_exps", f, d, m.num_experts),
                ("ffn_gate_inp", m.num_experts, d, 1), ("ffn_norm", 1, d, 1),
                ("ffn_up_exps", f, d, m.num_experts)]
        if m.shared_experts:
            sf = m.shared_intermediate
            out += [("ffn_down_shexp", d, sf, 1), ("ffn_gate_shexp", sf, d, 1),
                    ("ffn_up_shexp", sf, d, 1)]
        return sorted(out)
    f = arch.intermediate_size
    out += [("ffn_down", d, f, 1), ("ffn_norm", 1, d, 1), ("ffn_up", f, d, 1)]
    if arch.gated_mlp:
        out.append(("ffn_gate", f, d, 1))
    return sorted(out)


def estimated_tensors(arch: Architecture, plan: InferencePlan) -> tuple[GgufTensor, ...]:
    """The tensors of a GGUF of the plan's format in llama-quantize's order, typed as
    llama-quant.cpp types them (`llama_tensor_get_type`) for the file types gpuwise's formats
    name; () for other formats."""
    return _format_tensors(arch, plan.weight_format.id)


@lru_cache(maxsize=256)  # a search estimates one model and format many times
def _format_tensors(arch: Architecture, fmt: str) -> tuple[GgufTensor, ...]:
    rt = llama_cpp_runtime()
    mix = rt.ftype_mix.get(fmt)
    if mix is None:
        return ()
    main, more_bits = mix[0], (mix[1] if len(mix) > 1 else "")
    d, vocab = arch.hidden_size, arch.vocab_size
    head = main if main in ("f32", "f16", "bf16", "q8_0") else "q6_k"
    head = "q8_0" if head == "q6_k" and d % 256 else head
    out: list[GgufTensor] = []
    if not arch.tie_embeddings:
        out.append(GgufTensor("output.weight", head, vocab, d, ggml_bytes(head, vocab * d)))
    out.append(GgufTensor("output_norm.weight", "f32", 1, d, 4.0 * d))
    embd = head if arch.tie_embeddings else _fallback(main, d)
    out.append(GgufTensor("token_embd.weight", embd, vocab, d, ggml_bytes(embd, vocab * d)))
    for il in range(arch.num_layers):
        for role, rows, cols, experts in _layer_shapes(arch):
            t = main if rows > 1 else "f32"
            if more_bits and role in ("attn_v", "ffn_down") and _use_more_bits(il, arch.num_layers):
                t = more_bits
            t = _fallback(t, cols)
            out.append(GgufTensor(f"blk.{il}.{role}.weight", t, rows, cols,
                                  ggml_bytes(t, rows * cols * experts), experts))
    return tuple(out)


def gguf_tensors(arch: Architecture, plan: InferencePlan) -> tuple[GgufTensor, ...]:
    """A checkpoint's own tensors where the plan has them, else the format's."""
    sw = plan.stored_weights
    if sw is not None and sw.gguf_tensors:
        return tuple(GgufTensor(name, t.lower(), rows, cols, nbytes, experts)
                     for name, t, rows, cols, nbytes, experts in sw.gguf_tensors)
    return estimated_tensors(arch, plan)


def weight_copies(arch: Architecture, plan: InferencePlan,
                  features: frozenset[str]) -> tuple[dict[str, float], float]:
    """(bytes copied into each CPU extra buffer, bytes of them unmapped after loading) of the
    plan's GGUF; kept per model and format where the file is the format's."""
    sw = plan.stored_weights
    if sw is not None and sw.gguf_tensors:
        return _copies(gguf_tensors(arch, plan), features)
    extra, unmapped = _format_copies(arch, plan.weight_format.id, features)
    return dict(extra), unmapped


@lru_cache(maxsize=256)
def _format_copies(arch: Architecture, fmt: str,
                   features: frozenset[str]) -> tuple[dict[str, float], float]:
    return _copies(_format_tensors(arch, fmt), features)


def _copies(tensors: tuple[GgufTensor, ...],
            features: frozenset[str]) -> tuple[dict[str, float], float]:
    extra = repacked(tensors, features)
    return extra, unmapped_after_load(tensors, features) if extra else 0.0


def cpu_features(hw: Hardware) -> frozenset[str]:
    """The instruction sets llama.cpp's CPU backend checks, as the catalogue knows them: by
    hardware id where listed, else by vendor (x86-64: AVX2; ARM: NEON with dot products)."""
    rt = llama_cpp_runtime()
    listed = rt.cpu_features_by_id.get(hw.id)
    if listed is None:
        listed = rt.cpu_features_by_vendor.get(hw.vendor.lower(), ())
    return frozenset(listed)


def _rule_for(ggml_type: str, features: frozenset[str]) -> tuple[str, int, int] | None:
    """(extra buffer, rows multiple, columns multiple) the type is copied into, or None."""
    rt = llama_cpp_runtime()
    if "amx" in features and ggml_type in rt.amx_types:
        return "AMX", rt.amx_row_multiple, rt.amx_types[ggml_type]
    for feature, types in rt.repack_types.items():
        if feature in features and ggml_type in types:
            return "CPU_REPACK", types[ggml_type], 1
    return None


def extra_buffers(tensors: tuple[GgufTensor, ...], features: frozenset[str]) -> list[str | None]:
    """The extra buffer each tensor is copied into (`select_weight_buft`: the first of the
    CPU's extra buffer types whose supports_op takes the matmul), None where it stays mapped."""
    out: list[str | None] = []
    for t in tensors:
        rule = _rule_for(t.ggml_type, features) if t.matmul else None
        out.append(None if rule is None or t.rows % rule[1] or t.cols % rule[2] else rule[0])
    return out


def repacked(tensors: tuple[GgufTensor, ...], features: frozenset[str]) -> dict[str, float]:
    """Bytes copied into each CPU extra buffer (empty when nothing is repacked)."""
    rt = llama_cpp_runtime()
    out: dict[str, float] = {}
    for t, buffer in zip(tensors, extra_buffers(tensors, features), strict=True):
        if buffer is None:
            continue
        size = t.nbytes
        if buffer == "AMX":  # mmq.cpp get_row_size: compensation and scale words per block
            block = rt.ggml_types[t.ggml_type][0]
            size += t.rows * t.experts * (t.cols // block) * rt.amx_extra.get(t.ggml_type, 0)
        out[buffer] = out.get(buffer, 0.0) + _padded(math.ceil(size), rt.cpu_alignment)
    return out


def unmapped_after_load(tensors: tuple[GgufTensor, ...], features: frozenset[str]) -> float:
    """Bytes of copied tensors before the first or after the last tensor that stays mapped:
    `load_all_data` unmaps the file outside that range once loaded (llama-quantize writes
    each layer's tensors by name, so a repacked blk.N.ffn_up ends the file)."""
    buffers = extra_buffers(tensors, features)
    mapped = [i for i, b in enumerate(buffers) if b is None]
    if not mapped:
        return sum(t.nbytes for t in tensors)
    outside = list(range(mapped[0])) + list(range(mapped[-1] + 1, len(tensors)))
    return sum(tensors[i].nbytes for i in outside)
