"""A forward pass as a list of operations with their FLOPs and bytes moved.

Bytes count what an eager runtime (PyTorch, as transformers runs it) reads and writes: a
matrix multiply reads its weight and input and writes its output; an elementwise step
reads and writes whole tensors, once per kernel. Norms and rotary embeddings in
transformers are several kernels each, and eager attention with grouped KV heads copies the
keys and values to every query head first (`repeat_kv`); sdpa does not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.workload.arch import Architecture, MoE


@dataclass(frozen=True)
class Op:
    """One operation of one layer (or of the model); `count` is how many times it runs."""

    name: str
    kind: str  # matmul | attention | norm | elementwise | embedding | logits
    flops: float
    bytes: float
    count: int = 1
    m: int = 0  # matmul shape (m x k) @ (k x n), for size-dependent efficiency
    n: int = 0
    k: int = 0
    weight_bytes: float = 0.0  # of `bytes`, what the weight matrix contributes
    # Which probed kernel times it where measured (binary, silu, gelu, sdpa; a convolution's
    # window and stride, "3x3/s1"), in which dtype (empty: the phase's compute dtype);
    # `heads` is batch x heads for sdpa.
    kernel: str = ""
    dtype: str = ""
    heads: int = 0
    causal: bool = True  # sdpa: a causal mask (decoders), else full attention (encoders)
    # Sweeps tensors larger than any cache (an optimizer over the parameters): a kernel rate
    # probed on a cache-sized tensor is capped at the memory bandwidth.
    streamed: bool = False
    # "nn": x @ W with W stored (in, out), as GPT-2's Conv1D runs it (addmm); "" F.linear.
    layout: str = ""
    # Output tensors each call allocates afresh, as (bytes of one tensor, tensors per call),
    # forward and backward: a host allocator maps large ones in anew and faults every page.
    fresh: tuple[tuple[float, float], ...] = ()
    fresh_backward: tuple[tuple[float, float], ...] = ()
    # A matmul the runtime runs as several GEMMs on the same input (q, k and v; gate and
    # up): their output widths (summing to n). Probed kernels time each; () is one GEMM.
    splits: tuple[int, ...] = ()
    # A sparse layer's routed experts: how many of them the op's weights are (the step's
    # touched experts; 0: not routed). Expert parallelism divides them whole.
    experts: float = 0.0

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class Shape:
    """Tokens processed now (`tokens` per sequence) against a cache of `context` positions."""

    batch: int
    tokens: int
    context: int  # keys/values attended to, including the new tokens
    compute_bytes: float  # activation dtype size
    weight_bytes: float  # bytes per weight element (quantised formats: scales included)
    kv_bytes: float
    attention: str = "sdpa"
    logits_tokens: int = 1  # positions whose logits are computed

    @property
    def rows(self) -> int:
        return self.batch * self.tokens


# Families whose q, k and v come out of one projection (views of one output), and those whose
# gated MLP runs gate and up as one; the others run a GEMM each (transformers' modelling).
FUSED_QKV = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "falcon", "phi3"})
FUSED_GATE_UP = frozenset({"phi3", "glm4"})


def _matmul(name: str, s: Shape, n: int, k: int, count: int, rows: int | None = None,
            layout: str = "", splits: tuple[int, ...] = ()) -> Op:
    m = s.rows if rows is None else rows
    c = s.compute_bytes
    weights = n * k * s.weight_bytes
    return Op(name, "matmul", 2.0 * m * n * k, weights + m * k * c + m * n * c, count, m, n, k,
              weights, layout=layout, splits=splits)


def _qkv_splits(arch: Architecture) -> tuple[int, ...]:
    if arch.model_type in FUSED_QKV or arch.mla:
        return ()
    return (arch.q_dim, arch.kv_dim, arch.kv_dim)


def _elementwise(name: str, elements: float, passes: float, c: float, count: int,
                 kind: str = "elementwise", kernel: str = "binary") -> Op:
    """`passes` full read-or-write sweeps over `elements` values of `c` bytes."""
    return Op(name, kind, elements * passes / 2, elements * passes * c, count, kernel=kernel,
              dtype="fp32" if c == 4 else "")


def _norm(arch: Architecture, s: Shape, count: int) -> Op:
    elements = s.rows * arch.hidden_size
    if arch.norm == "layer":
        return _elementwise("layernorm", elements, 2, s.compute_bytes, count, "norm")
    # transformers' RMSNorm: upcast, pow, mean, rsqrt-scale, downcast, weight: ~7 fp32 sweeps.
    return _elementwise("rmsnorm", elements, 7, 4, count, "norm")


def _qk_norm(arch: Architecture, s: Shape) -> list[Op]:
    """The norms of the queries and keys (Qwen3, Gemma 3, OLMo 2): one a layer over every
    head's q and k, as many sweeps as the model's other norms (heads divide under TP)."""
    if not arch.qk_norm:
        return []
    norm = _norm(arch, s, arch.num_layers)
    return [replace(norm, name="qk_norm",
                    flops=norm.flops * (arch.q_dim + arch.kv_dim) / arch.hidden_size,
                    bytes=norm.bytes * (arch.q_dim + arch.kv_dim) / arch.hidden_size)]


def _attended(arch: Architecture, s: Shape) -> tuple[float, float]:
    """(query-key pairs of one sequence's head, cached positions read) a layer, averaged over
    the layers: a sliding-window or chunked layer (Gemma 2/3, gpt-oss, Mistral, Llama 4)
    attends to at most its window, which its cache keeps (a chunk counted as a window)."""
    t, n = s.tokens, s.context
    prompt = t == n and t > 1  # a causal prompt from the start: half the square
    full = t * n * (0.5 if prompt else 1.0)
    w, sliding = arch.sliding_window or 0, arch.windowed_layers
    if not sliding or n <= w:
        return full, float(n)
    windowed = t * w - w * (w - 1) / 2 if prompt else t * w
    layers = arch.num_layers
    return (((layers - sliding) * full + sliding * windowed) / layers,
            ((layers - sliding) * n + sliding * w) / layers)


def _attention(arch: Architecture, s: Shape, rotary: bool = True) -> list[Op]:
    L = arch.num_layers
    h, hd, c = arch.num_heads, arch.head_dim, s.compute_bytes
    qk_dim = arch.q_dim // h
    pairs, context = _attended(arch, s)
    pairs *= s.batch * h
    flops = 2 * pairs * (qk_dim + hd)
    kv_elems = s.batch * context * arch.kv_cache_elements_per_token()
    kv_read = kv_elems * s.kv_bytes
    q_out = 2 * s.rows * arch.q_dim * c
    ops = []
    if s.attention == "eager":
        groups = arch.num_heads // arch.num_kv_heads
        if groups > 1:  # repeat_kv materialises keys and values for every query head
            ops.append(Op("repeat_kv", "elementwise", 0.0, kv_read * (1 + groups), L,
                          kernel="binary"))
            kv_read *= groups
        scores = s.batch * h * s.tokens * context
        # scores matmul write, scale, mask add, fp32 softmax, downcast, read for P @ V
        ops.append(Op("attention", "attention", flops, kv_read + q_out + scores * (6 * c + 8), L,
                      s.batch * h * s.tokens, s.context, hd))
    else:
        ops.append(Op("attention", "attention", flops, kv_read + q_out, L,
                      s.batch * h * s.tokens, s.context, hd, kernel="sdpa",
                      heads=s.batch * h))
    rope = s.rows * (arch.q_dim + arch.kv_dim) * (arch.rotary_dim / max(1, hd))
    if rope and rotary:
        ops.append(_elementwise("rotary", rope, 10, c, L))
    return ops


def experts_touched(moe: MoE, rows: float) -> float:
    """The routed experts a layer's `rows` tokens reach between them, expected, each token
    choosing `experts_per_token` (k) of the `num_experts` (E) uniformly: an expert is missed
    by one token with probability 1 - k/E, so E (1 - (1 - k/E)^rows) are touched: k for one
    token, all E as the batch grows (docs/speed.md, "Mixture of experts")."""
    if rows <= 0:
        return 0.0
    e = moe.num_experts
    return e * (1.0 - (1.0 - moe.experts_per_token / e) ** rows)


def _routed_experts(arch: Architecture, s: Shape, moe: MoE, layout: str) -> list[Op]:
    """A sparse layer's routed experts as its grouped GEMMs run them: the weights of each
    expert the step touches read once (`experts_touched`), the FLOPs of tokens x k experts,
    and each expert's GEMM over its share of the routed rows (tokens x k / touched, rounded),
    the row count its matmul efficiency is read at."""
    inner, d, c = moe.expert_intermediate, arch.hidden_size, s.compute_bytes
    routed = s.rows * moe.experts_per_token
    touched = experts_touched(moe, s.rows)
    rows = max(1, round(routed / touched))
    ops = []
    for name, n, k in (("mlp_in", 2 * inner, d), ("mlp_out", d, inner)):
        weights = touched * n * k * s.weight_bytes
        ops.append(Op(name, "matmul", 2.0 * routed * n * k,
                      weights + routed * (n + k) * c, moe.layers, rows,
                      max(1, round(n * touched)) if name == "mlp_in" else n,
                      k if name == "mlp_in" else max(1, round(k * touched)),
                      weights, layout=layout, experts=touched))
    return ops + _activation(arch, routed * inner, True, c, moe.layers)


def _mlp(arch: Architecture, s: Shape) -> list[Op]:
    L, moe = arch.num_layers, arch.moe
    layout = "nn" if arch.conv1d else ""
    ops = _dense_mlp(arch, s, arch.intermediate_size, L - (moe.layers if moe else 0),
                     arch.gated_mlp, layout, arch.model_type not in FUSED_GATE_UP)
    if moe:
        ops.append(_matmul("router", s, moe.num_experts, arch.hidden_size, moe.layers))
        ops += _routed_experts(arch, s, moe, layout)
        if moe.shared_experts:  # every token runs them: a dense MLP of their width
            ops += _dense_mlp(arch, s, moe.shared_intermediate, moe.layers, True, layout, False)
    return ops


def _dense_mlp(arch: Architecture, s: Shape, inner: int, layers: int, gated: bool, layout: str,
               apart: bool) -> list[Op]:
    """An MLP every token runs (`apart`: a gated one's gate and up as two GEMMs)."""
    if not layers:
        return []
    n_in = 2 * inner if gated else inner
    d, c = arch.hidden_size, s.compute_bytes
    return [_matmul("mlp_in", s, n_in, d, layers, s.rows, layout,
                    (inner, inner) if gated and apart else ()),
            _matmul("mlp_out", s, d, inner, layers, s.rows, layout),
            *_activation(arch, s.rows * inner, gated, c, layers)]


# transformers' NewGELUActivation is Python: pow, mul, add, mul, tanh, add, mul, mul kernels:
# 16 sweeps of products and a tanh (2 sweeps), which on a CPU is a transcendental: 1.6 ms
# of the 2.5 ms the whole GELU takes on GPT-2's (2 x 256 x 3072) fp32 MLP, a mul 0.065.
PYTHON_GELU_PASSES = 16


def _activation(arch: Architecture, elements: float, gated: bool, c: float,
                layers: int) -> list[Op]:
    """The MLP's activation, and for a gated MLP the product of the gate with the up branch."""
    act = arch.activation.lower()
    ops = [_elementwise("gate_mul", elements, 3, c, layers)] if gated else []
    if act == "gelu_new":
        return [_elementwise("activation", elements, PYTHON_GELU_PASSES, c, layers),
                _elementwise("activation tanh", elements, 2, c, layers, kernel="tanh"), *ops]
    # transformers' "gelu" is the exact (erf) GELU, a kernel four times faster than the tanh
    # approximation ("gelu_pytorch_tanh" and the rest) on a CPU.
    kernel = ("silu" if act in ("silu", "swish") else "gelu_erf" if act == "gelu"
              else "gelu" if "gelu" in act else "binary")
    return [_elementwise("activation", elements, 2, c, layers, kernel=kernel), *ops]


def forward_ops(arch: Architecture, s: Shape) -> list[Op]:
    """Every operation of one forward pass over `s` (prefill, a decode step, or training)."""
    L, d, c = arch.num_layers, arch.hidden_size, s.compute_bytes
    ops = [_elementwise("embedding", s.rows * d, 2, c, 1, "embedding")]
    norms = arch.norms_per_layer
    ops.append(_norm(arch, s, L * norms))
    layout = "nn" if arch.conv1d else ""
    ops.append(_matmul("qkv", s, arch.q_dim + 2 * arch.kv_dim, d, L, layout=layout,
                       splits=_qkv_splits(arch)))
    ops += _qk_norm(arch, s)
    ops += _attention(arch, s)
    ops.append(_matmul("attn_out", s, d, arch.q_dim, L, layout=layout))
    ops += _mlp(arch, s)
    ops.append(_elementwise("residual", s.rows * d, 3, c, 2 * L))
    ops.append(_norm(arch, s, 1))
    head_rows = s.batch * s.logits_tokens
    head = _matmul("lm_head", s, arch.vocab_size, d, 1, head_rows)
    # The logits are a fresh tensor; in backward so is the head's weight gradient.
    ops.append(replace(head, fresh=((head_rows * arch.vocab_size * c, 1),),
                       fresh_backward=((arch.vocab_size * d * s.weight_bytes, 1),)))
    return ops


def context_ops(arch: Architecture, s: Shape, fused: bool) -> list[Op]:
    """The ops of `forward_ops` (and, unfused, `kv_append_ops`) whose work grows with the
    cached positions, in their order there: attention (eager's `repeat_kv` with it) and the
    cache's append. A runtime that fuses (`fused`) keeps the attention kernel alone."""
    ops = _attention(arch, s, rotary=False)
    if fused:
        return [op for op in ops if op.kind == "attention"]
    return ops + kv_append_ops(arch, s)


def kv_append_ops(arch: Architecture, s: Shape) -> list[Op]:
    """transformers' DynamicCache appends each step's keys and values with torch.cat: every
    layer copies its whole cache into a new tensor (reads old and new, writes both)."""
    per_token = arch.kv_cache_elements_per_token() * s.kv_bytes * s.batch
    moved = per_token * 2 * s.context
    return [Op("kv_append", "elementwise", 0.0, moved, arch.num_layers, kernel="cat",
               streamed=True)]


def loss_ops(arch: Architecture, s: Shape) -> list[Op]:
    """Cross-entropy over the logits in fp32: upcast, log_softmax, gather (forward only).
    Fresh vocab-sized tensors: the fp32 upcast (under a 16-bit dtype) and log_softmax's
    output; in backward nll_loss's zero-filled gradient, log_softmax's, and the downcast."""
    elements = s.rows * arch.vocab_size
    upcast = 1 if s.compute_bytes != 4 else 0
    op = _elementwise("loss", elements, 4, 4, 1, "logits")
    return [replace(op, fresh=((elements * 4, 1 + upcast),),
                    fresh_backward=((elements * 4, 2), (elements * s.compute_bytes, upcast)))]


def tensor_parallel_share(op: Op, tp: int) -> Op:
    """One device's share of `op` under tensor parallelism over `tp` devices: each layer's
    matrices and heads are divided (the embedding, residual adds and norms stay whole)."""
    if tp == 1 or op.name in ("embedding", "residual", "layernorm", "rmsnorm"):
        return op
    if op.kind == "attention":  # heads are split; each still attends to the whole context
        return replace(op, flops=op.flops / tp, bytes=op.bytes / tp, m=max(1, op.m // tp),
                       heads=op.heads // tp)
    return replace(op, flops=op.flops / tp, bytes=op.bytes / tp, n=max(1, op.n // tp),
                   weight_bytes=op.weight_bytes / tp)


def embedding_grad_ops(arch: Architecture, s: Shape) -> list[Op]:
    """Backward of the token embedding on a CPU-style dense path: a zero-filled vocab x hidden
    gradient, the rows' index_add, and with tied weights the sum with the head's gradient
    (AccumulateGrad adds out of place). Each vocab-sized tensor is fresh."""
    table = arch.vocab_size * arch.hidden_size * s.weight_bytes  # the gradient: weights' dtype
    passes = 1 + (3 if arch.tie_embeddings else 0)
    moved = table * passes + 3 * s.rows * arch.hidden_size * s.compute_bytes
    fresh = ((table, 2 if arch.tie_embeddings else 1),)
    return [Op("embedding_grad", "elementwise", 0.0, moved, 1, kernel="binary", streamed=True,
               fresh=fresh)]
