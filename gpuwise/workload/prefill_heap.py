"""The tensors a transformers prefill takes from the host allocator and gives back, in order.

A CPU runs each eager op into a fresh output tensor (glibc malloc), and frees its inputs as
Python drops them. Where glibc gives the heap back between layers, the next layer faults its
pages in again (`estimate/speed/page_faults.py`). This is the sequence of one decoder layer as
transformers' modelling code runs it (per family: RMSNorm's fp32 upcast, rotary's
rotate_half, repeat_kv, GPT-2's Python GELU, the fused q/k/v projections whose key and
value views the cache keeps alive), so the replay can count those faults without torch.

Sizes follow the shapes; what is below 64 KiB (norm statistics, masks of a row) is left
out, as glibc serves it from bins that never go back to the system (`untracked_below_bytes`
in catalog/data/allocators.toml).
"""

from __future__ import annotations

from gpuwise.catalog.allocators import host_allocator
from gpuwise.workload.arch import Architecture
from gpuwise.workload.ops import FUSED_QKV, Shape
from gpuwise.workload.traced import HeapEvent

# transformers' NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))).
PYTHON_GELU_STEPS = 6  # pow, mul, add, mul, tanh, add: each a fresh tensor, the last kept


class HeapTrace:
    """Named tensors taken and dropped, as heap events; each name is one live tensor.
    Tensors below `small` bytes are not tracked."""

    def __init__(self) -> None:
        self.events: list[HeapEvent] = []
        self.live: dict[str, int] = {}
        self.serial = 0
        self.phase = "forward"
        self.small = host_allocator().untracked_below_bytes
        self.frozen = False  # the weights take no gradient (LoRA's frozen base)
        # The host replay's training step (`process_heap`): the rotary inputs given back
        # once both are rotated, and what `training_heap._StepHeap` details. The GPU and
        # fault-time replays keep the coarser list.
        self.detailed = False
        self.cache = False  # the forward fills a DynamicCache (`_cache_update`)
        self.dropout = (0.0, 0.0)  # a training step's (hidden, attention) dropout probabilities

    def take(self, name: str, nbytes: float) -> None:
        if nbytes < self.small:
            return
        self.serial += 1
        self.live[name] = self.serial
        self.events.append(HeapEvent(self.serial, int(nbytes), self.phase))

    def grad_free(self) -> None:
        """The tensor just taken has no input gradient to take in a backward (`cat`'s
        backward hands out views of its output's gradient); a prefill has none."""

    def joined_grads(self) -> None:
        """The projection just taken is split into q, k and v: a backward joins their
        gradients into one tensor for it (`split`'s backward, a cat); a prefill has none."""

    def side_grads(self, *nbytes: float) -> None:
        """The op just taken also takes these inputs' gradients in a backward."""

    def backward_scratch(self, *nbytes: float) -> None:
        """The op just taken's backward also takes these tensors and gives them back at
        once (a product reduced to a small gradient, a derivative's factors)."""

    def linear(self, name: str, nbytes: float, inputs: float, weight: int, src: str = "") -> None:
        """A projection's output; `inputs` (bytes of its input), `weight` (its weight's
        elements) and `src` (its input's name, shared by sibling projections) matter to a
        training step (`training_heap`), not to a prefill."""
        self.take(name, nbytes)

    def drop(self, *names: str) -> None:
        for name in names:
            key = self.live.pop(name, None)
            if key is not None:
                self.events.append(HeapEvent(key, 0, self.phase))

    def release(self, *names: str) -> None:
        """Given back now: tensors nothing saves for a backward (as `drop` in a prefill)."""
        self.drop(*names)

    def rename(self, old: str, new: str) -> None:
        if old in self.live:
            self.live[new] = self.live.pop(old)



class PairTrace(HeapTrace):
    """A HeapTrace that lists its events as bare (key, bytes) pairs in `pairs`, every one of
    the forward phase (`events` stays empty): what the allocator replays read, made without
    an event object each."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[int, int]] = []

    def take(self, name: str, nbytes: float) -> None:
        if nbytes < self.small:
            return
        self.serial += 1
        self.live[name] = self.serial
        self.pairs.append((self.serial, int(nbytes)))

    def drop(self, *names: str) -> None:
        live, pairs = self.live, self.pairs
        for name in names:
            key = live.pop(name, None)
            if key is not None:
                pairs.append((key, 0))

    release = drop

def norm_tensors(h: HeapTrace, arch: Architecture, elements: int, c: float, out: str) -> None:
    """A norm over `elements` values of `c` bytes, its output named `out`."""
    if arch.norm == "layer":  # one kernel (its row statistics are small)
        h.take(out, elements * c)
        return
    # RMSNorm: x.to(fp32); x.pow(2).mean(); x * rsqrt(var + eps); weight * x.to(dtype).
    # Backward, as traced (docs/memory.md, "On a CPU"): each product also takes its other
    # operand's full-size gradient, reduced to the small one; mean's backward divides, and
    # pow's takes x^1, its scaled and its product with the gradient, one after another.
    if c != 4:
        h.take(out + ".up", elements * 4)
    h.take(out + ".pow", elements * 4)
    h.backward_scratch(elements * 4, elements * 4, elements * 4)
    h.release(out + ".pow")  # pow saves its input, mean nothing (derivatives.yaml)
    h.take(out + ".scaled", elements * 4)
    h.backward_scratch(elements * 4)
    h.drop(out + ".up")
    if c != 4:
        h.take(out + ".down", elements * c)
    h.take(out, elements * c)
    h.backward_scratch(elements * c)
    if h.frozen:  # `weight * x` saves x only for the weight's gradient
        h.release(out + ".down", out + ".scaled")
    if c != 4:  # `.to(input_dtype)` saves nothing: the fp32 product goes
        h.release(out + ".scaled")
    h.drop(out + ".down", out + ".scaled")


def _rotary(h: HeapTrace, name: str, elements: float, share: float, c: float) -> None:
    """apply_rotary_pos_emb on one of q or k: (x * cos) + (rotate_half(x) * sin), where
    rotate_half is cat(-x2, x1); a partial rotary (`share` < 1) cats the rotated part back
    onto the rest. The rotated tensor replaces `name` (detailed: the input is left as
    `name`.pre). Autograd saves none of these: a product with cos or sin saves only the table
    (it needs no gradient), `neg` and `cat` nothing (torch/csrc/autograd derivatives.yaml),
    so a training step frees them at once."""
    rot = elements * share * c
    h.take(name + ".cos", rot)
    h.take(name + ".neg", rot / 2)
    h.take(name + ".cat", rot)
    h.release(name + ".neg")
    h.take(name + ".sin", rot)
    h.release(name + ".cat")
    h.take(name + ".rot", rot)
    h.release(name + ".cos", name + ".sin")
    if share < 1:
        h.take(name + ".full", elements * c)
        h.release(name + ".rot")
        h.rename(name + ".full", name + ".rot")
    if h.detailed:  # given back when apply_rotary_pos_emb returns (`_attention`)
        h.rename(name, name + ".pre")
    else:
        h.drop(name)
    h.rename(name + ".rot", name)


def dropout_tensors(h: HeapTrace, name: str, nbytes: float, p: float,
                    saved: bool = False) -> None:
    """A training step's dropout on `name`, which it replaces. On a CPU `at::dropout` takes
    a noise tensor (`empty_like(input).bernoulli_(1 - p).div_(1 - p)`, saved for the
    backward) and the product `input * noise` (aten/src/ATen/native/Dropout.cpp: the fused
    kernel is for a GPU), which saves the noise only; the input goes unless the op that
    made it `saved` it (softmax its output)."""
    if not p:
        return
    h.take(name + ".noise", nbytes)
    h.grad_free()  # the noise takes no gradient
    h.drop(name + ".noise")
    h.take(name + ".out", nbytes)
    (h.drop if saved else h.release)(name)
    h.rename(name + ".out", name)


def _math_scores(h: HeapTrace, arch: Architecture, s: Shape) -> None:
    """SDPA's math path, which a CPU takes when a training step asks for attention dropout
    (the CPU flash kernel has none): `query * sqrt(scale)`, the causal mask (a tokens x
    context float tensor, added in place and held to the attention's end), `key.transpose(-2,
    -1) * sqrt(scale)` and its contiguous copy for the batched matmul (the copy saved, the
    product not), the scores, `_safe_softmax` (saved), dropout, and the product with v
    (aten/src/ATen/native/transformers/attention.cpp, `_scaled_dot_product_attention_math`;
    the order as traced, docs/memory.md "On a CPU")."""
    c = s.compute_bytes
    scores = s.batch * arch.num_heads * s.tokens * s.context * c
    h.take("q.c", s.rows * arch.q_dim * c)
    for name, nbytes in (("ones", 1), ("tril", 1), ("mask", 4)):  # where(tril, 0, -inf)
        h.take(name, s.tokens * s.context * nbytes)
        h.grad_free()  # no gradient
    h.release("ones", "tril")
    h.take("k.t", s.rows * arch.kv_dim * c)
    h.take("k.rep", s.rows * arch.kv_dim * c)
    h.release("k.t")
    h.take("s1", scores)
    h.take("p32", scores)
    h.release("s1")
    dropout_tensors(h, "p32", scores, h.dropout[1], saved=True)
    h.release("mask")
    h.take("attn", s.rows * arch.q_dim * c)
    h.drop("q.c", "k.rep", "p32")


def _attention(h: HeapTrace, arch: Architecture, s: Shape, layer: int) -> None:
    """Projections, rotary, the cache, attention and its output projection; leaves "o"."""
    rows, c, d = s.rows, s.compute_bytes, arch.hidden_size
    q, kv = rows * arch.q_dim, rows * arch.kv_dim
    k_name, v_name = f"k{layer}", f"v{layer}"  # the cache keeps them to the end of the pass
    fused = arch.model_type in FUSED_QKV
    if fused:  # q, k and v are views of one tensor, kept whole while the cache holds k or v
        h.linear(f"qkv{layer}", (q + 2 * kv) * c, rows * d * c, d * (arch.q_dim + 2 * arch.kv_dim))
        h.joined_grads()
    else:
        h.linear("q", q * c, rows * d * c, d * arch.q_dim, "n1")
        h.linear(k_name, kv * c, rows * d * c, d * arch.kv_dim, "n1")
        h.linear(v_name, kv * c, rows * d * c, d * arch.kv_dim, "n1")
    if arch.position == "rope" and arch.rotary_dim:  # of a fused projection: its views
        share = arch.rotary_dim / max(1, arch.head_dim)
        _rotary(h, "q", q, share, c)
        _rotary(h, k_name, kv, share, c)
        h.release("q.pre", k_name + ".pre")  # apply_rotary_pos_emb returned: both rebound
    if h.cache:
        _cache_update(h, k_name, v_name, kv * c)
    math = s.attention != "eager" and bool(h.dropout[1])  # SDPA without its flash kernel
    if s.attention == "eager":
        _eager_scores(h, arch, s, fused, fused and not h.cache)
    elif math:
        _math_scores(h, arch, s)
    else:
        h.take("attn", q * c)  # the CPU flash kernel: its output only
        # its backward (_scaled_dot_product_flash_attention_for_cpu_backward) zero-fills
        # the gradients of q, k and v at once
        h.side_grads(kv * c, kv * c)
    h.drop("q")
    if h.cache and math:  # k and v copied, q scaled: nothing holds a view
        h.release(f"qkv{layer}")
    elif h.cache:  # the cache holds copies: the fused projection goes with its views
        h.drop(f"qkv{layer}")
    if h.detailed and s.attention != "eager" and not math:
        # the CPU flash kernel writes its output as (batch, tokens, heads, dim) and returns
        # it transposed: `transpose(1, 2).contiguous()` is the same tensor (sdp_utils_cpp)
        h.rename("attn", "attn.t")
    else:
        h.take("attn.t", q * c)  # transpose(1, 2).contiguous()
        h.drop("attn")
    h.linear("o", rows * d * c, q * c, arch.q_dim * d)
    h.drop("attn.t")
    dropout_tensors(h, "o", rows * d * c, h.dropout[0])


def _cache_update(h: HeapTrace, k_name: str, v_name: str, nbytes: float) -> None:
    """transformers' DynamicLayer.update (cache_utils.py) on a fresh cache: `self.keys =
    torch.cat([self.keys, key_states], dim=-2)` onto an empty tensor, then the values: a copy
    of each, which the cache and the attention hold (and autograd saves); the layer's own k
    (rotated) and v go when `key_states, value_states` are reassigned to the copies (nothing
    saves them: `cat` saves no input). A fused projection's k and v are views: the copies
    leave the projection's output to its query view."""
    for name in (k_name, v_name):
        h.take(name + ".cat", nbytes)
        h.grad_free()
    h.release(k_name, v_name)
    for name in (k_name, v_name):
        h.rename(name + ".cat", name)


def _eager_scores(h: HeapTrace, arch: Architecture, s: Shape, fused: bool,
                  kv_views: bool) -> None:
    """matmul(q, k^T) * scale + mask, softmax in fp32, downcast, @ v: each a fresh tensor;
    grouped KV heads are repeated first (repeat_kv), views of a fused projection copied (k
    and v only when still views: `kv_views`, no cache copy stands in for them)."""
    c = s.compute_bytes
    scores = s.batch * arch.num_heads * s.tokens * s.context * c
    repeated = s.batch * arch.num_heads * s.context * arch.head_dim * c
    if arch.num_kv_heads != arch.num_heads:
        h.take("k.rep", repeated)
        h.take("v.rep", repeated)
    elif fused:  # batched matmul on transposed views: contiguous copies of q and k; matmul
        # folds (batch, heads) by `reshape`, a view for one sequence (LinearAlgebra.cpp)
        if kv_views or s.batch > 1:
            h.take("q.c", s.rows * arch.q_dim * c)
        if kv_views:
            h.take("k.rep", repeated)
    h.take("s1", scores)
    h.drop("q.c")
    # A backward needs none of the raw, scaled or masked scores (a product or quotient by a
    # constant and a masked fill save nothing that needs a gradient; softmax saves its
    # output): a training step gives them back at once (derivatives.yaml)
    h.take("s2", scores)  # * scaling
    h.release("s1")
    h.take("s3", scores)  # + causal mask
    h.release("s2")
    h.take("p32", scores * 4 / c)  # softmax(dtype=float32)
    h.release("s3")
    if c != 4:
        h.take("p", scores)  # .to(query.dtype)
        h.drop("p32")
        h.rename("p", "p32")
    dropout_tensors(h, "p32", scores, h.dropout[1], saved=True)
    if kv_views and "v.rep" not in h.live:
        h.take("v.rep", repeated)
    h.take("attn", s.rows * arch.q_dim * c)
    h.drop("k.rep", "v.rep")
    # returned as the attention's weights, which the decoder layer holds in a local to its
    # end (`hidden_states, _ = self.self_attn(...)`), through the MLP: traced
    h.rename("p32", "probs")


def _mlp(h: HeapTrace, arch: Architecture, s: Shape, src: str) -> None:
    """The MLP on the normed `src`; leaves "down"."""
    c, d, width = s.compute_bytes, arch.hidden_size, arch.intermediate_size
    inner, hidden = s.rows * width * c, s.rows * d * c
    if arch.gated_mlp:  # down(act(gate(x)) * up(x))
        h.linear("gate", inner, hidden, d * width, src)
        h.take("act", inner)
        h.drop("gate")
        h.linear("up", inner, hidden, d * width, src)
        h.take("mul", inner)
        h.drop("act", "up")
        h.rename("mul", "act")
    else:
        h.linear("fc", inner, hidden, d * width)
        if arch.activation.lower() == "gelu_new":
            h.take("half", inner)  # 0.5 * x, evaluated first
            for i in range(PYTHON_GELU_STEPS):
                h.take(f"g{i}", inner)
                if i == 0:  # pow's backward: x^2, 3 x^2 and their product with the gradient
                    h.backward_scratch(inner, inner)
                # pow saves its input, the two scalings and the sum nothing; tanh saves its
                # output and the last product its operands (derivatives.yaml)
                (h.release if 0 < i < PYTHON_GELU_STEPS - 1 else h.drop)(f"g{i - 1}")
            h.take("act", inner)
            h.side_grads(inner)  # the product's backward takes both operands' gradients
            h.drop("half", f"g{PYTHON_GELU_STEPS - 1}")
        else:
            h.take("act", inner)
        h.drop("fc")
    h.linear("down", hidden, inner, d * width)
    h.drop("act", src)
    dropout_tensors(h, "down", hidden, h.dropout[0])


def layer_tensors(h: HeapTrace, arch: Architecture, s: Shape, layer: int) -> None:
    """Decoder layer `layer` on the residual stream "x", which it replaces."""
    hidden = s.rows * arch.hidden_size
    c = s.compute_bytes
    norm_tensors(h, arch, hidden, c, "n1")
    _attention(h, arch, s, layer)
    if arch.parallel_residual:  # x + attn(ln1(x)) + mlp(ln2(x)), or one norm for both
        if arch.norms_per_layer > 1:
            h.drop("n1")
            norm_tensors(h, arch, hidden, c, "n2")
            _mlp(h, arch, s, "n2")
        else:
            _mlp(h, arch, s, "n1")
        h.take("x.o", hidden * c)
        h.release("o")  # a sum saves neither operand (derivatives.yaml, add)
        h.take("x.next", hidden * c)
        h.release("x.o", "down")
        h.drop("x")
    else:
        h.take("x.mid", hidden * c)  # residual + attention; a sum saves neither operand
        h.release("o")
        h.drop("n1", "x")
        norm_tensors(h, arch, hidden, c, "n2")
        _mlp(h, arch, s, "n2")
        h.take("x.next", hidden * c)
        h.release("down")
        h.drop("x.mid")
    h.drop("probs")
    h.rename("x.next", "x")


def prefill_heap_events(arch: Architecture, s: Shape) -> list[HeapEvent]:
    """One prefill's tensors of 64 KiB and more, taken and given back, in transformers'
    order: the embedding, every layer (the cache keeps each layer's keys and values) and
    the final norm; all given back at the end."""
    h = HeapTrace()
    c = s.compute_bytes
    h.take("x", s.rows * arch.hidden_size * c)
    for layer in range(arch.num_layers):
        layer_tensors(h, arch, s, layer)
    norm_tensors(h, arch, s.rows * arch.hidden_size, c, "final")
    h.drop("x")  # the logits, last, are the lm_head op's own (`Op.fresh`)
    h.drop(*list(h.live))
    return h.events
