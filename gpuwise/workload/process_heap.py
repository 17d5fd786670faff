"""The tensors a whole run of a plan takes from the host allocator and gives back, in order, so
that `estimate/memory/host_allocator.py` can replay them through the allocator's rules and
say what the process keeps resident beyond its live tensors.

- generate(): the prefill (`prefill_heap`'s layers, a fresh DynamicCache copying each layer's
  keys and values with `torch.cat`, as `DynamicLayer.update` does), the last position's
  logits and the sampler's fp32 copies (transformers' `_sample`: `logits[:, -1, :].to(float32,
  copy=True)`, then a processor's `clone()`), and
  each decode step: every layer's cache grown by `torch.cat` into a new tensor (the old one
  given back), eager attention repeating grouped keys and values (`repeat_kv`), the logits.
- Training steps: `training_heap`'s forward, backward and optimizer step (`detailed`: what
  autograd does not save given back in the forward, the cache's copies of k and v, the
  attention's k and v gradients, sibling projections' summed gradients; LoRA's adapters of
  64 KiB and more with their gradients and optimizer step), with the
  vocabulary-sized tensors it leaves out put back: the logits, their fp32 copy and
  `log_softmax`'s output (saved), the two fp32 gradients `log_softmax`'s backward holds, the
  embedding's and head's weight gradients, their optimizer states and step temporaries.

The weights are not replayed: transformers builds them before the run, the ones over the mmap
threshold the imports left (1.9 MiB, `mmap_threshold_at_build` in catalog/data/
allocators.toml) mapped on their own and the smaller ones at the bottom of the heap, below
anything the run takes: either way they are resident exactly while they live, and add the same
to the replay's live and resident bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import lru_cache

from gpuwise.workload.arch import Architecture
from gpuwise.workload.ops import Shape
from gpuwise.workload.prefill_heap import HeapTrace, PairTrace, layer_tensors, norm_tensors
from gpuwise.workload.traced import HeapEvent
from gpuwise.workload.training_heap import step_events, training_heap_events


def _sample(h: HeapTrace, arch: Architecture, batch: int, c: float) -> None:
    """The last position's logits, the sampler's fp32 copy and a processor's clone. Each
    replaces the previous step's, which `_sample`'s locals (`outputs`, `next_token_logits`,
    `next_token_scores`) hold until they are assigned again."""
    for name, nbytes in (("logits", c), ("scores", 4), ("processed", 4)):
        h.take(name + ".new", batch * arch.vocab_size * nbytes)
        h.drop(name)
        h.rename(name + ".new", name)


def _rotary_tables(h: HeapTrace, arch: Architecture, rows: int, c: float) -> None:
    """The model's rotary embedding, once a forward: freqs and their cat in fp32, cos and sin
    (cast to the compute dtype); kept for every layer as "cos" and "sin"."""
    if arch.position != "rope" or not arch.rotary_dim:
        return
    width = rows * arch.rotary_dim
    h.take("freqs", width * 2)  # fp32, half the rotary width
    h.take("emb", width * 4)
    h.drop("freqs")
    for name in ("cos", "sin"):
        h.take(name, width * 4)
        if c != 4:
            h.take(name + ".c", width * c)
            h.drop(name)
            h.rename(name + ".c", name)
    h.drop("emb")


def _decode_step(h: PairTrace, arch: Architecture, s: Shape, t: int, stride: int) -> None:
    """A new token (`stride` of them at once): each layer's cache concatenated into a new
    tensor of `t + stride` positions (keys, then values; a fused projection's whole output
    goes once both are replaced). HeapTrace's take, drop and rename written out: a search
    replays thousands of them."""
    c, kv = s.compute_bytes, s.kv_bytes
    cached = s.batch * arch.num_kv_heads * arch.head_dim * (t + stride) * kv
    repeated = s.batch * arch.num_heads * arch.head_dim * (t + stride) * c
    live, pairs = h.live, h.pairs
    tracked, nbytes = cached >= h.small, int(cached)
    repeats = s.attention == "eager" and arch.num_kv_heads != arch.num_heads
    for k, v, qkv in _layer_names(arch.num_layers):
        for name in (k, v):  # take name.new, drop name, rename name.new to name
            if tracked:
                h.serial += 1
                pairs.append((h.serial, nbytes))
            old = live.pop(name, None)
            if old is not None:
                pairs.append((old, 0))
            if tracked:
                live[name] = h.serial
        old = live.pop(qkv, None)
        if old is not None:
            pairs.append((old, 0))
        if repeats:
            h.take("k.rep", repeated)
            h.take("v.rep", repeated)
            h.drop("k.rep", "v.rep")
    _sample(h, arch, s.batch, c)


@lru_cache(maxsize=64)
def _layer_names(layers: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"k{layer}", f"v{layer}", f"qkv{layer}") for layer in range(layers))


def generate_events(arch: Architecture, s: Shape, new_tokens: int,
                    stride: int = 1) -> list[HeapEvent]:
    """One generate() call of `new_tokens` after a prompt of `s.tokens` (`s.context` equal);
    with `stride` > 1 each decode step stands for that many, its cache grown by as many
    positions (a long generation replayed in fewer steps). Every event is of the forward."""
    return [HeapEvent(key, nbytes) for key, nbytes in generate_pairs(arch, s, new_tokens, stride)]


def generate_pairs(arch: Architecture, s: Shape, new_tokens: int,
                   stride: int = 1) -> list[tuple[int, int]]:
    """`generate_events` as (key, bytes) pairs, as the host replay reads them."""
    h = PairTrace()
    h.cache = True  # the prefill fills a fresh DynamicCache: copies of k and v
    c, rows = s.compute_bytes, s.rows
    h.take("x", rows * arch.hidden_size * c)
    _rotary_tables(h, arch, rows, c)
    if s.attention == "eager":  # the 4-D float mask of the whole prompt, kept to the end
        h.take("mask", s.batch * s.tokens * s.context * c)
    for layer in range(arch.num_layers):
        layer_tensors(h, arch, s, layer)
    norm_tensors(h, arch, rows * arch.hidden_size, c, "final")
    h.drop("x", "mask", "cos", "sin")
    _sample(h, arch, s.batch, c)
    h.drop("final")
    for step in range(max(0, new_tokens - 1)):
        _decode_step(h, arch, s, s.context + step * stride, stride)
    h.drop(*list(h.live))
    return h.pairs


def _phases(events: list[HeapEvent]) -> dict[str, list[HeapEvent]]:
    out: dict[str, list[HeapEvent]] = {"forward": [], "backward": [], "optimizer": []}
    for e in events:
        out["backward" if e.phase == "recompute" else e.phase].append(e)
    return out


def tied_sum(keys: Iterator[int], head: int, embedding: int, nbytes: int) -> list[HeapEvent]:
    """A tied weight's two gradients meet in its AccumulateGrad's input buffer: the head's,
    taken early in the backward, waits there for the embedding's, taken last, and their sum
    is a new tensor before both are given back (traced by benchmarks/malloc_trace.py: GPT-2
    and SmolLM2 take a third vocabulary x hidden tensor, then free the two; docs/memory.md,
    "On a CPU")."""
    total = next(keys)
    return [HeapEvent(total, nbytes, "backward"), HeapEvent(head, 0, "backward"),
            HeapEvent(embedding, 0, "backward")]


def _loss(keys: Iterator[int], arch: Architecture, s: Shape,
          param_bytes: float) -> tuple[list[HeapEvent], list[HeapEvent], int]:
    """The loss's vocabulary-sized tensors: (end of the forward, start of the backward, the
    head's weight gradient's key). transformers' ForCausalLMLoss upcasts the logits,
    `cross_entropy` saves log_softmax's fp32 output; its backward holds two fp32 gradients,
    then the head's weight gradient is taken (kept to zero_grad) while the logits' gradient
    lives."""
    logits = s.rows * arch.vocab_size
    c = s.compute_bytes
    k = {name: next(keys) for name in ("logits", "up", "logsm", "g1", "g2", "gc", "head")}
    fwd = [HeapEvent(k["logits"], int(logits * c))]
    if c != 4:
        fwd.append(HeapEvent(k["up"], int(logits * 4)))
    fwd.append(HeapEvent(k["logsm"], int(logits * 4)))
    fwd += [HeapEvent(k["up"], 0)] if c != 4 else []
    fwd.append(HeapEvent(k["logits"], 0))
    back = [HeapEvent(k["g1"], int(logits * 4), "backward"),
            HeapEvent(k["g2"], int(logits * 4), "backward"),
            HeapEvent(k["g1"], 0, "backward"), HeapEvent(k["logsm"], 0, "backward")]
    if c != 4:
        back += [HeapEvent(k["gc"], int(logits * c), "backward"), HeapEvent(k["g2"], 0, "backward")]
        k["g2"] = k["gc"]
    if param_bytes:
        back.append(HeapEvent(k["head"], int(arch.vocab_size * arch.hidden_size * param_bytes),
                              "backward"))
    back.append(HeapEvent(k["g2"], 0, "backward"))
    return fwd, back, k["head"]


def training_step_events(arch: Architecture, s: Shape, param_bytes: float, optimizer: str,
                         checkpointing: bool, trains_weights: bool = True,
                         lora_rank: int = 0) -> list[HeapEvent]:
    """One training step's tensors of 64 KiB and more, vocabulary-sized ones included; with
    `trains_weights` False (LoRA of `lora_rank`) the base takes no weight gradients and the
    optimizer steps the adapters only (`training_heap.adapter_step_events`)."""
    events = training_heap_events(arch, s, param_bytes, optimizer, checkpointing,
                                  adapted=not trains_weights, detailed=True,
                                  lora_rank=lora_rank)
    keys = itertools.count(max((e.key for e in events), default=0) + 1)
    parts = _phases(events)
    fwd, back, head = _loss(keys, arch, s, param_bytes if trains_weights else 0.0)
    vocab = arch.vocab_size * arch.hidden_size * param_bytes
    grads = []
    if trains_weights:
        grads = [HeapEvent(next(keys), int(vocab), "backward")]
        if arch.tie_embeddings:
            grads += tied_sum(keys, head, grads[0].key, int(vocab))
    step = []
    if trains_weights:
        heads = 1 if arch.tie_embeddings else 2
        step = step_events([int(vocab)] * heads, optimizer, keys)
    both = step + parts["optimizer"]  # torch.optim creates every state before it steps any
    states = [e for e in both if e.kept] + [e for e in step if not e.kept]
    return (parts["forward"] + fwd + back + parts["backward"] + grads + states
            + [e for e in parts["optimizer"] if not e.kept])
