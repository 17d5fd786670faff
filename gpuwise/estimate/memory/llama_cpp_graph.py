"""llama.cpp's compute buffer, laid out as ggml-alloc lays it out.

llama.cpp sizes its compute buffer by building the graph of a worst-case micro-batch and
running ggml-alloc's allocator over it (`llama_context::sched_reserve`, `graph_reserve`;
ggml/src/ggml-alloc.c). This module builds the same graph for a dense decoder (the node
order of `llama_model_llama::graph` in src/models/llama.cpp with `build_attn`,
`build_attn_mha`, `build_ffn` and `build_norm` of src/llama-graph.cpp) and runs a port of
that allocator over it, so the buffer's size comes out as llama.cpp logs it
("CPU compute buffer size = ...").

The allocator itself, and the pages a CPU run writes of the buffer, are in
llama_cpp_alloc.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from gpuwise.estimate.memory.llama_cpp_alloc import (
    PAGE,
    Graph,
    Tensor,
    allocate,
    pages,
    touched_pages,
)

F32, F16, I32, I64 = 4, 2, 4, 8


@dataclass(frozen=True)
class GraphDims:
    """What the graph's tensor sizes depend on (a dense decoder layer)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated: bool = True
    qkv_bias: bool = False
    layer_norm: bool = False  # LayerNorm with a bias (norm, mul, add) instead of RMSNorm
    embedding_scale: bool = False  # gemma: the embeddings scaled by sqrt(hidden)
    swa_layers: int = 0  # sliding-window layers: they read their own mask


def _n(ne: tuple[int, ...]) -> int:
    out = 1
    for d in ne:
        out *= d
    return out


def _op(name: str, op: str, ne: tuple[int, ...], *src: Tensor, size: int = F32) -> Tensor:
    return Tensor(name, op, _n(ne) * size, ne, tuple(src))


def _view(name: str, parent: Tensor, ne: tuple[int, ...], op: str = "view", offs: int = 0,
          contiguous: bool = True, src: tuple[Tensor, ...] = ()) -> Tensor:
    base = parent.view_src or parent
    size = parent.nbytes // max(1, _n(parent.ne))
    return Tensor(name, op, _n(ne) * size, ne, src or (parent,), base,
                   parent.view_offs + offs, contiguous)


def _leaf(name: str, ne: tuple[int, ...], size: int, *, input: bool = False) -> Tensor:
    return Tensor(name, "none", _n(ne) * size, ne, input=input, external=not input)


def build_graph(dims: GraphDims, n_tokens: int, n_kv: int, n_outputs: int, flash: bool,
                n_kv_swa: int = 0, legacy: bool = False) -> Graph:
    """The graph llama.cpp builds for one micro-batch of `n_tokens` over `n_kv` cache cells,
    `n_outputs` of whose rows reach the output head.

    `legacy`: the graph of llama.cpp before mid-2025, which stored K and V with ggml_cpy into
    views of the cache (no index inputs) and had no second embeddings input; the published
    startup logs the tests check the allocator against came from such versions."""
    g = Graph()
    d, t, dkv = dims.hidden, n_tokens, dims.kv_heads * dims.head_dim
    tok_embd = _leaf("token_embd", (d, dims.vocab), F16)
    tokens = _leaf("inp_tokens", (t,), I32, input=True)
    embd = _op("embd", "get_rows", (d, t), tok_embd, tokens)
    g.expand(embd)
    if not legacy:
        g.expand(_leaf("inp_embd", (d, t), F32, input=True))  # the embeddings input, unused
    if dims.embedding_scale:
        embd = _op("embd_scaled", "scale", (d, t), embd)
        g.expand(embd)
    pos = _leaf("inp_pos", (t,), I32, input=True)
    k_idxs = None if legacy else _leaf("k_idxs", (t,), I64, input=True)
    v_idxs = None if legacy else _leaf("v_idxs", (t,) if flash else (t * dkv,), I64, input=True)
    mask_size = F16 if flash else F32
    mask = _leaf("kq_mask", (n_kv, t), mask_size, input=True)
    mask_swa = _leaf("kq_mask_swa", (n_kv_swa or n_kv, t), mask_size, input=True)
    out_ids = _leaf("out_ids", (n_outputs,), I32, input=True)
    inp = embd
    for il in range(dims.layers):
        layer_mask = mask_swa if il < dims.swa_layers else mask
        layer_kv = (n_kv_swa or n_kv) if il < dims.swa_layers else n_kv
        inp = _layer(g, dims, il, inp, pos, k_idxs, v_idxs, layer_mask, out_ids,
                     (t, layer_kv, n_outputs, flash))
    norm = _norm(dims, inp, "result_norm", (d, n_outputs))
    norm.output = True
    logits = _op("result_output", "mul_mat", (dims.vocab, n_outputs),
                 _leaf("output", (d, dims.vocab), F16), norm)
    logits.output = True
    g.expand(logits)
    return g


def _norm(dims: GraphDims, x: Tensor, name: str, ne: tuple[int, ...]) -> Tensor:
    """build_norm: rms_norm (or norm) times the weight, plus the bias of a LayerNorm."""
    cur = _op(f"{name}.norm", "norm" if dims.layer_norm else "rms_norm", ne, x)
    cur = _op(name, "mul", ne, cur, _leaf(f"{name}.w", (ne[0],), F32))
    if dims.layer_norm:
        cur = _op(f"{name}.b", "add", ne, cur, _leaf(f"{name}.bias", (ne[0],), F32))
    return cur


def _proj(name: str, x: Tensor, rows: int, t: int, bias: bool) -> Tensor:
    cur = _op(name, "mul_mat", (rows, t), _leaf(f"{name}.w", (x.ne[0], rows), F16), x)
    if bias:
        cur = _op(f"{name}.b", "add", (rows, t), cur, _leaf(f"{name}.bias", (rows,), F32))
    return cur


def _layer(g: Graph, dims: GraphDims, il: int, inp: Tensor, pos: Tensor,
           k_idxs: Tensor | None, v_idxs: Tensor | None, mask: Tensor, out_ids: Tensor,
           sizes: tuple[int, int, int, bool]) -> Tensor:
    t, n_kv, n_out, flash = sizes
    d, hd, h, hkv, f = dims.hidden, dims.head_dim, dims.heads, dims.kv_heads, dims.ffn
    dkv = hkv * hd
    p = f"l{il}."
    cur = _norm(dims, inp, p + "attn_norm", (d, t))
    q = _proj(p + "q", cur, h * hd, t, dims.qkv_bias)
    q = _op(p + "q_rope", "rope", (hd, h, t), _view(p + "q3", q, (hd, h, t), "reshape"), pos)
    k = _proj(p + "k", cur, dkv, t, dims.qkv_bias)
    v = _proj(p + "v", cur, dkv, t, dims.qkv_bias)
    v = _view(p + "v3", v, (hd, hkv, t), "reshape")
    k = _op(p + "k_rope", "rope", (hd, hkv, t), _view(p + "k3", k, (hd, hkv, t), "reshape"), pos)
    g.expand(q)
    g.expand(v)
    g.expand(k)
    cache_k = _leaf(p + "cache_k", (dkv, n_kv), F16)
    cache_v = _leaf(p + "cache_v", (dkv, n_kv), F16)
    _store_kv(g, p, k, v, cache_k, cache_v, k_idxs, v_idxs, flash)
    kv_k = _view(p + "k_view", cache_k, (hd, hkv, n_kv))
    kv_v = _view(p + "v_view", cache_v, (n_kv, hkv, hd) if not flash else (hd, hkv, n_kv))
    qv = _view(p + "q_perm", _view(p + "q4", q, (hd, h, t)), (hd, t, h), "permute",
               contiguous=False)
    kp = _view(p + "k_perm", kv_k, (hd, n_kv, hkv), "permute", contiguous=False)
    vp = _view(p + "v_perm", kv_v, kv_v.ne, "permute", contiguous=False)
    if flash:
        fa = _op(p + "fattn", "flash_attn_ext", (hd, h, t), qv, kp, vp, mask)
        cur = _view(p + "kqv_out", fa, (h * hd, t), "reshape")
    else:
        kq = _op(p + "kq", "mul_mat", (n_kv, t, h), kp, qv)
        kq = _op(p + "kq_soft_max", "soft_max", (n_kv, t, h), kq, mask)
        kqv = _op(p + "kqv", "mul_mat", (hd, t, h), vp, kq)
        cur = _op(p + "kqv_out", "cont", (h * hd, t),
                  _view(p + "kqv_perm", kqv, (hd, h, t), "permute", contiguous=False))
    g.expand(cur)
    cur = _proj(p + "attn_out", cur, d, t, False)
    res = inp
    if il == dims.layers - 1:
        cur = _op(p + "out_rows", "get_rows", (d, n_out), cur, out_ids)
        res = _op(p + "res_rows", "get_rows", (d, n_out), inp, out_ids)
        t = n_out
    ffn_inp = _op(p + "ffn_inp", "add", (d, t), cur, res)
    cur = _norm(dims, ffn_inp, p + "ffn_norm", (d, t))
    if dims.gated:
        gate = _proj(p + "gate", cur, f, t, False)
        up = _proj(p + "up", cur, f, t, False)
        cur = _op(p + "glu", "glu", (f, t), gate, up)
    else:
        cur = _op(p + "act", "unary", (f, t), _proj(p + "up", cur, f, t, False))
    cur = _proj(p + "down", cur, d, t, False)
    return _op(p + "l_out", "add", (d, t), cur, ffn_inp)


def _store_kv(g: Graph, p: str, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor,
              k_idxs: Tensor | None, v_idxs: Tensor | None, flash: bool) -> None:
    """llama_kv_cache::cpy_k / cpy_v: ggml_set_rows into the cache at the index inputs (a
    view of the cache: nothing allocated); the legacy graph's ggml_cpy into cache views."""
    dkv, t = cache_k.ne[0], k.ne[-1]
    k2 = _view(p + "k2", k, (dkv, t))
    if k_idxs is None or v_idxs is None:
        g.expand(_view(p + "cpy_k", cache_k, (dkv, t), "cpy", src=(k2, cache_k)))
        v2 = _view(p + "v2", v, (dkv, t), "reshape")
        if not flash:
            v2 = _view(p + "v2t", v2, (t, dkv), "transpose", contiguous=False)
        g.expand(_view(p + "cpy_v", cache_v, v2.ne, "cpy", src=(v2, cache_v)))
        return
    g.expand(_view(p + "cpy_k", cache_k, cache_k.ne, "set_rows", src=(cache_k, k2, k_idxs)))
    if flash:
        v2 = _view(p + "v2", v, (dkv, t))
        g.expand(_view(p + "cpy_v", cache_v, cache_v.ne, "set_rows", src=(cache_v, v2, v_idxs)))
        return
    v2 = _view(p + "v1", _view(p + "v2", v, (dkv, t), "reshape"), (1, dkv * t), "reshape")
    cache_v1 = _view(p + "cache_v1", cache_v, (1, dkv * cache_v.ne[1]), "reshape")
    g.expand(_view(p + "cpy_v", cache_v1, cache_v1.ne, "set_rows", src=(cache_v1, v2, v_idxs)))


# Layers past the first few repeat the allocator's state exactly (same free blocks, same
# offsets), so the buffer and the pages written are those of a model this deep.
SIMULATED_LAYERS = 4


@lru_cache(maxsize=256)
def compute_buffer(dims: GraphDims, n_ctx: int, n_ubatch: int, flash: bool,
                   runs: tuple[tuple[int, int, int], ...] = (), n_ctx_swa: int = 0,
                   legacy: bool = False, alignment: int = 32) -> tuple[int, int]:
    """(the reserved compute buffer, the bytes of it that `runs` write), in whole pages.

    The reserve is llama.cpp's worst case (`llama_context::sched_reserve`): min(n_ctx,
    n_ubatch) tokens over the whole cache, each an output. Each run is (tokens, cache cells
    in view, outputs)."""
    if dims.layers > SIMULATED_LAYERS:
        dims = replace(dims, layers=SIMULATED_LAYERS,
                       swa_layers=min(dims.swa_layers, SIMULATED_LAYERS // 2))
    n_tok = min(n_ctx, n_ubatch)
    reserved = build_graph(dims, n_tok, n_ctx, n_tok, flash, n_ctx_swa, legacy)
    size, offsets = allocate(reserved, alignment)
    spans: list[tuple[int, int]] = []
    for tokens, n_kv, outputs in runs:
        run = build_graph(dims, tokens, n_kv, outputs, flash, min(n_kv, n_ctx_swa), legacy)
        spans += touched_pages(reserved, offsets, run)
    return size, pages(spans) * PAGE
