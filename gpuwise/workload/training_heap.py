"""The tensors one training step under transformers takes from the host allocator and gives
back, in order: the forward (`prefill_heap`'s layers, with what autograd saves kept), the
backward, and the optimizer's step, so `estimate/speed/page_faults.py` can count the pages
the step faults.

- Forward: a layer's tensors stay until its backward (autograd saves nearly every
  intermediate of a layer: projections' inputs, norms' upcasts, attention's q, k, v and
  output). Under activation checkpointing only each layer's input stays, and the backward
  runs the layer's forward again first.
- Backward, operation by operation in reverse: the gradient of the operation's input is
  taken and its output's given back, then what the operation saved; each projection takes
  its weight's gradient, kept to the end of the step (`zero_grad` sets it to None). Under
  autocast the projection saved its weight's cast, and its gradient is taken in the compute
  dtype, then copied to the fp32 parameter's. A LoRA projection (peft) takes no gradient for
  the frozen base's weight but lora_B's and lora_A's (fp32), and four more: the output's
  gradient scaled for the adapters' branch, the input's gradient through lora_A and through
  the frozen base, and their sum.
- `detailed` (the host replay, `process_heap`): what autograd saves nothing of is given back
  in the forward (rotary's products, RMSNorm's pow, a residual sum's operands), the forward
  fills transformers' DynamicCache with copies of k and v, the attention's backward takes
  k's and v's gradients with q's, and projections sharing an input have their input
  gradients summed into a new tensor.
- Optimizer (torch.optim's single-tensor loop a CPU runs; LoRA: the adapters only): the
  states the first step creates and keeps; AdamW's `denom = (exp_avg_sq.sqrt() /
  c).add_(eps)` takes the square root and the quotient, gives the root back, and keeps the
  quotient until the next parameter's replaces it; Adafactor's squared gradient and update
  stay the same way.
  SGD with momentum takes nothing.

Vocabulary-sized tensors (logits, the embedding's and head's gradients and their optimizer
temporaries) are left out: 32 MiB and larger (glibc's largest mmap threshold), glibc maps them
apart from the heap, and the operations that make them charge their faults (`Op.fresh`). So
are tensors below 64 KiB. Both sizes: catalog/data/allocators.toml.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from gpuwise.catalog.allocators import host_allocator
from gpuwise.catalog.optimizers import optimizers
from gpuwise.workload.arch import Architecture
from gpuwise.workload.ops import FUSED_QKV, Shape
from gpuwise.workload.prefill_heap import HeapTrace, dropout_tensors, layer_tensors, norm_tensors
from gpuwise.workload.traced import HeapEvent

ADAPTER_BYTES = 4  # peft upcasts LoRA weights to fp32 (get_peft_model's autocast_adapter_dtype)


@dataclass
class _Record:
    """An operation's output as the backward meets it: its key (None: too small to track),
    the bytes of its input's gradient, and, for a projection, its weight's elements and the
    key of the weight's autocast copy."""

    key: int | None
    grad_bytes: float
    weight: int = 0
    cast: int | None = None
    joins: bool = False  # a fused projection: its output's gradient is joined from q's, k's, v's
    scratch: tuple[float, ...] = ()  # taken and given back in its backward (`backward_scratch`)
    out_bytes: float = 0.0  # a projection's output
    side: tuple[float, ...] = ()  # more inputs' gradients (attention's k and v)
    src: str = ""  # a projection's input, when sibling projections share it
    adapter_in: int | None = None  # a LoRA projection's lora_A output, saved
    adapter_x: int | None = None  # its input's fp32 copy (a half-precision base), saved


class _StepHeap(HeapTrace):
    """A training step's tensors: drops in a saving forward are deferred to the backward."""

    def __init__(self, param_bytes: float, compute_bytes: float, adapted: bool = False,
                 rows: int = 0, rank: int = 0) -> None:
        super().__init__()
        self.param_bytes, self.compute_bytes = param_bytes, compute_bytes
        self.adapted = adapted  # LoRA adapters on every projection (peft)
        self.frozen = adapted
        self.rows, self.rank = rows, rank  # the step's tokens; the adapters' rank
        self.saving = True
        self.records: list[_Record] = []
        self.grads = 0
        self.last_src = ""  # the input of the projection the backward met last
        self.pending: list[int | None] = []  # side gradients, given back at the next projection

    def take(self, name: str, nbytes: float) -> None:
        super().take(name, nbytes)
        self.records.append(_Record(self.serial if nbytes >= self.small else None, nbytes))

    def linear(self, name: str, nbytes: float, inputs: float, weight: int, src: str = "") -> None:
        cast = None
        copy = weight * self.compute_bytes
        if self.param_bytes != self.compute_bytes and copy >= self.small:  # autocast's copy
            super().take(name + ".weight", copy)
            cast = self.live.pop(name + ".weight")  # saved by the projection
        self.take(name, nbytes)
        record = self.records[-1]
        record.grad_bytes, record.weight, record.cast = inputs, weight, cast
        record.out_bytes = nbytes
        record.src = src
        if self.adapted and record.key is not None:
            self._adapter_sum(name, record, nbytes)

    def _adapter_sum(self, name: str, record: _Record, nbytes: float) -> None:
        """peft's lora.Linear.forward (peft/tuners/lora/layer.py): `x =
        self._cast_input_dtype(x, lora_A.weight.dtype)`, then `result = result +
        lora_B(lora_A(dropout(x))) * scaling`, then `result.to(torch_result_dtype)`. With a
        half-precision base the input's fp32 copy is taken (a projection's own, saved by
        lora_A), and the sum is fp32 until it is cast back. lora_B's output and its scaled
        copy are taken and given back at once (neither is saved), and the sum replaces the
        base layer's output, which is given back too. lora_A's output (tokens x rank, fp32)
        is saved for lora_B's weight gradient (tracked when 64 KiB or more, as every
        tensor)."""
        wide = nbytes * ADAPTER_BYTES / self.compute_bytes  # the adapters' fp32 output
        if self.compute_bytes != ADAPTER_BYTES:
            record.adapter_x = self.take_key(record.grad_bytes * ADAPTER_BYTES / self.compute_bytes)
        record.adapter_in = self.take_key(self.rows * self.rank * ADAPTER_BYTES)
        lora_b = self.take_key(wide)
        scaled = self.take_key(wide)
        self.free(lora_b)
        total = self.take_key(wide)
        self.free(scaled)
        self.free(record.key)
        if self.compute_bytes != ADAPTER_BYTES:  # result.to(torch_result_dtype)
            cast = self.take_key(nbytes)
            self.free(total)
            total = cast
        record.key = total
        if total is not None:
            self.live[name] = total

    def grad_free(self) -> None:
        self.records[-1].grad_bytes = -1.0  # the output's gradient passes through

    def backward_scratch(self, *nbytes: float) -> None:
        if self.detailed:
            self.records[-1].scratch = nbytes

    def joined_grads(self) -> None:
        self.records[-1].joins = self.detailed

    def side_grads(self, *nbytes: float) -> None:
        if self.detailed:
            self.records[-1].side = nbytes

    def release(self, *names: str) -> None:
        """Given back in the forward even while saving (detailed; else as `drop`): the
        backward does not free them."""
        if not self.detailed:
            self.drop(*names)
            return
        for name in names:
            key = self.live.pop(name, None)
            if key is None:
                continue
            self.free(key)
            for r in self.records:
                r.key = None if r.key == key else r.key

    def drop(self, *names: str) -> None:
        if not self.saving:
            super().drop(*names)
            return
        for name in names:  # saved: given back in the backward
            self.live.pop(name, None)

    def free(self, key: int | None) -> None:
        if key is not None:
            self.events.append(HeapEvent(key, 0, self.phase))

    def take_key(self, nbytes: float) -> int | None:
        """An unnamed tensor (a gradient); its key, None when too small to track."""
        self.grads += 1
        name = f"grad{self.grads}"
        self.take(name, nbytes)
        self.records.pop()
        return self.live.pop(name, None)

    def _accumulate(self, r: _Record, new: int | None) -> int | None:
        """Projections sharing an input (q, k, v on the norm's output; gate and up): autograd
        sums their input gradients into a new tensor, `old_var + var`, and gives both back
        (torch/csrc/autograd/input_buffer.cpp, accumulate); the older is the chain's."""
        if self.detailed and r.src and r.src == self.last_src:
            total = self.take_key(r.grad_bytes)
            self.free(new)
            new = total
        self.last_src = r.src
        return new

    def _adapter_sizes(self, r: _Record) -> tuple[int, int]:
        """Bytes of lora_B (out x rank) and lora_A (rank x in), and of their gradients (kept
        to zero_grad like any .grad): fp32, as peft keeps the adapters."""
        if not (self.rank and self.rows and r.out_bytes):
            return 0, 0
        out = round(r.out_bytes / (self.rows * self.compute_bytes))
        return out * self.rank * ADAPTER_BYTES, r.weight // max(1, out) * self.rank * ADAPTER_BYTES

    def backward(self, records: list[_Record], grad: int | None) -> int | None:
        """Each operation in reverse: its weight's gradient (kept), its input's gradient,
        the output's gradient and what it saved given back. Returns the last gradient."""
        for r in reversed(records):
            if r.grad_bytes < 0:  # a copy's backward hands its gradient on (a view)
                self.free(r.key)
                continue
            joined = self.take_key(r.out_bytes) if r.joins else None  # cat([dq, dk, dv])
            if r.weight and self.pending:  # the projection that consumes them
                for key in self.pending:
                    self.free(key)
                self.pending = []
            if r.weight and not self.adapted:  # .grad, kept to zero_grad; autocast: from bf16
                cast = self.take_key(r.weight * self.compute_bytes) if r.cast else None
                self.take_key(r.weight * self.param_bytes)
                self.free(cast)
            adapter = self.adapted and r.weight
            new = self._adapter_grads(r) if adapter else self.take_key(r.grad_bytes)
            if r.weight:
                new = self._accumulate(r, new)
            self.pending += [self.take_key(n) for n in r.side]
            for key in [self.take_key(n) for n in r.scratch]:
                self.free(key)
            self.free(grad)
            self.free(r.key)
            self.free(r.cast)
            self.free(joined)
            grad = new
        return grad

    def _adapter_grads(self, r: _Record) -> int | None:
        """The input's gradient of a LoRA projection (peft/tuners/lora/layer.py, `result +
        lora_B(lora_A(x)) * scaling`). With a half-precision base the output's gradient is
        first cast to fp32 (`.to`'s backward) and back for the base's branch. The engine runs
        the adapters' branch first (its nodes are newer): the output's gradient scaled,
        lora_B's weight gradient, the scaled one given back once lora_B's backward is done,
        lora_A's weight gradient and the input's gradient through lora_A (fp32, cast back
        to the input's dtype: then the fp32 copy of the input goes); then the frozen base's,
        and their sum, into a new tensor (torch/csrc/autograd/input_buffer.cpp,
        accumulate), the two given back."""
        half = self.compute_bytes != ADAPTER_BYTES
        widen = ADAPTER_BYTES / self.compute_bytes
        wide = self.take_key(r.out_bytes * widen) if half else None  # grad.to(fp32)
        base_grad = self.take_key(r.out_bytes) if half else None  # and back, for the base
        scaled = self.take_key(r.out_bytes * widen)
        self.free(wide)
        lora_b, lora_a = self._adapter_sizes(r)
        self.take_key(lora_b)
        middle = self.take_key(self.rows * self.rank * ADAPTER_BYTES)  # lora_A output's
        self.free(scaled)
        self.free(r.adapter_in)
        self.take_key(lora_a)
        through_adapters = self.take_key(r.grad_bytes * widen)
        self.free(middle)
        if half:
            narrowed = self.take_key(r.grad_bytes)
            self.free(through_adapters)
            self.free(r.adapter_x)
            through_adapters = narrowed
        through_base = self.take_key(r.grad_bytes)
        self.free(base_grad)
        total = self.take_key(r.grad_bytes)
        self.free(through_adapters)
        self.free(through_base)
        return total


def training_heap_events(arch: Architecture, s: Shape, param_bytes: float,
                         optimizer: str = "adamw", checkpointing: bool = False,
                         adapted: bool = False, detailed: bool = False,
                         lora_rank: int = 0) -> list[HeapEvent]:
    """One training step's tensors of 64 KiB and more below 32 MiB, in order, by phase
    (forward, backward, optimizer); what the step leaves (gradients) is given back by the
    replay at its end. `adapted`: LoRA adapters of `lora_rank` on every projection (their
    sums' tensors, their weight gradients and optimizer step; the frozen base takes none).
    `detailed` (the host replay): what autograd does not save is given back in the forward,
    the attention's backward takes k's and v's gradients, sibling projections' input
    gradients are summed, and the forward fills a DynamicCache (`prefill_heap._cache_update`),
    as transformers' models do when called with `use_cache` left to the config's True, but
    not under checkpointing (`GradientCheckpointingLayer` turns the cache off)."""
    h = _StepHeap(param_bytes, s.compute_bytes, adapted, s.rows, lora_rank)
    h.detailed, h.cache = detailed, detailed and not checkpointing
    if detailed:
        h.dropout = (arch.hidden_dropout, arch.attention_dropout)
    hidden = s.rows * arch.hidden_size * s.compute_bytes
    h.take("x", hidden)
    if detailed:  # the embeddings' dropout (GPT-2's embd_pdrop, as its resid_pdrop)
        dropout_tensors(h, "x", hidden, arch.hidden_dropout)
    stem, h.records = h.records, []
    inputs, layers = [], []
    for layer in range(arch.num_layers):
        inputs.append(h.live["x"])
        if checkpointing:  # kept by the checkpoint, not the layer
            h.saving = False
            h.live.pop("x")
        layer_tensors(h, arch, s, layer)
        if checkpointing:  # no cache under checkpointing: the layer's keys and values go
            h.drop(*[name for name in h.live if name != "x"])
        layers.append(h.records)
        h.records = []
    h.saving = True
    inputs.append(h.live["x"])
    norm_tensors(h, arch, s.rows * arch.hidden_size, s.compute_bytes, "final")
    head, h.records = h.records, []
    h.live.clear()
    h.phase = "backward"
    grad = h.backward(head, None)
    for layer in reversed(range(arch.num_layers)):
        if checkpointing:  # the layer's forward again, from its saved input
            h.free(inputs[layer + 1])
            h.phase = "recompute" if detailed else "backward"  # its graph grows again
            layer_tensors(h, arch, s, layer)
            h.phase = "backward"
            layers[layer], h.records = h.records, []
            h.live.clear()
        grad = h.backward(layers[layer], grad)
    h.free(h.backward(stem, grad))
    if adapted:
        h.events += adapter_step_events(arch, optimizer, lora_rank, h.serial + 1)
    else:
        h.events += optimizer_events(arch, optimizer, param_bytes, h.serial + 1)
    return h.events


def layer_projections(arch: Architecture) -> list[tuple[int, int]]:
    """(in, out) features of one layer's projections, in the order torch.optim steps them."""
    d, i = arch.hidden_size, arch.intermediate_size
    if arch.model_type in FUSED_QKV:
        attention = [(d, arch.q_dim + 2 * arch.kv_dim), (arch.q_dim, d)]
    else:
        attention = [(d, arch.q_dim), (d, arch.kv_dim), (d, arch.kv_dim), (arch.q_dim, d)]
    return attention + [(d, i)] * (2 if arch.gated_mlp else 1) + [(i, d)]


def layer_weights(arch: Architecture) -> list[int]:
    """Elements of one layer's projection weights, in the order torch.optim steps them."""
    return [n * m for n, m in layer_projections(arch)]


def adapter_step_events(arch: Architecture, optimizer: str, rank: int,
                        first_key: int) -> list[HeapEvent]:
    """The optimizer step over the LoRA adapters (the only parameters that train): each
    projection's lora_A (rank x in) then lora_B (out x rank), fp32, in the order peft
    registers them (model.parameters()); those of 64 KiB and more."""
    sizes = [n * ADAPTER_BYTES for i, o in layer_projections(arch) for n in (rank * i, o * rank)]
    small = host_allocator().untracked_below_bytes
    sizes = [n for n in sizes * arch.num_layers if n >= small]
    return step_events(sizes, optimizer, itertools.count(first_key))


def optimizer_events(arch: Architecture, optimizer: str, state_bytes: float,
                     first_key: int) -> list[HeapEvent]:
    """The optimizer step's states (created on the first step, kept) and temporaries."""
    sizes = [int(n * state_bytes) for n in layer_weights(arch) * arch.num_layers]
    if arch.position == "learned":
        sizes.insert(0, int(arch.max_position * arch.hidden_size * state_bytes))
    rules = host_allocator()
    sizes = [n for n in sizes if rules.untracked_below_bytes <= n < rules.mmap_threshold_max]
    return step_events(sizes, optimizer, itertools.count(first_key))


# What torch.optim's single-tensor loop (AdamW) and transformers' Adafactor take per
# parameter, in order: ("take", name) a parameter-sized tensor; ("give", name) it back;
# ("give", "last " + name) the one the previous parameter's step left in a Python local,
# which lives until this step's assignment replaces it. AdamW: `denom = (exp_avg_sq.sqrt()
# / c).add_(eps)`. Adafactor: `grad_sqr = grad**2 + eps`, `update = row x column factors`
# (or `exp_avg_sq.rsqrt()`), then `p.add_(-update)`. SGD with momentum works in place.
STEP_TEMPORARIES: dict[str, tuple[tuple[str, str], ...]] = {
    "adamw": (("take", "root"), ("take", "denom"), ("give", "root"), ("give", "last denom")),
    "adafactor": (("take", "square"), ("take", "grad_sqr"), ("give", "square"),
                  ("give", "last grad_sqr"), ("take", "update"), ("give", "last update"),
                  ("take", "negated"), ("give", "negated")),
}


def step_events(sizes: list[int], optimizer: str, keys: Iterator[int]) -> list[HeapEvent]:
    """The optimizer step over parameter tensors of `sizes` bytes, in the order it steps
    them: the states (created on the first step, kept), then each tensor's temporaries
    (`STEP_TEMPORARIES`); what the last tensor left is given back at the end."""
    spec = optimizers().get(optimizer)
    states = spec.states_per_param if spec else 0
    events = [
        HeapEvent(next(keys), n, "optimizer", kept=True) for n in sizes for _ in range(states)
    ]
    left: dict[str, int] = {}  # what the previous parameter's step left in its locals
    for n in sizes:
        now: dict[str, int] = {}
        for action, name in STEP_TEMPORARIES.get(optimizer, ()):
            if action == "take":
                now[name] = next(keys)
                events.append(HeapEvent(now[name], n, "optimizer"))
            elif name.startswith("last "):
                if name.removeprefix("last ") in left:
                    events.append(HeapEvent(left.pop(name.removeprefix("last ")), 0, "optimizer"))
            else:
                events.append(HeapEvent(now.pop(name), 0, "optimizer"))
        left = now
    return events + [HeapEvent(k, 0, "optimizer") for k in left.values()]
