"""A traced PyTorch module: what one forward (and backward) pass did, op by op, and what
memory it held. Produced by `gpuwise.measure.module.trace` (which needs torch); plain data
here so that the estimators stay pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HeapEvent:
    """A tensor's memory taken (`nbytes` > 0) or given back (`nbytes` == 0), in order;
    `kept`: taken on the first pass only and never given back (an optimizer's states)."""

    key: int
    nbytes: int
    phase: str = "forward"  # forward, backward, optimizer; recompute: a checkpointed layer's
    kept: bool = False


@dataclass(frozen=True)
class TracedOp:
    """One aten operation as dispatched. `flops` are torch.utils.flop_counter's count for
    matmuls, convolutions and attention, one per output element for anything else; `bytes`
    are the tensors it reads plus those it writes (0 for views, which move nothing)."""

    name: str  # aten op, e.g. "addmm", "convolution", "native_layer_norm_backward"
    phase: str  # forward | backward
    kind: str  # matmul | attention | elementwise | view
    flops: float
    bytes: float
    dtype: str
    m: int = 0  # matmul-like shape: (m x k) @ (k x n)
    n: int = 0
    k: int = 0
    weight_bytes: float = 0.0  # of `bytes`, what a parameter operand contributes
    heads: int = 0  # attention: batch x heads
    causal: bool = False  # attention with a causal mask
    variant: str = ""  # the kernel's flavour where one op has several: "tanh" for a tanh GELU


@dataclass(frozen=True)
class MemoryMoment:
    """The tensors alive at the highest point of a phase, beyond those at rest (weights,
    buffers, inputs), by what they are: saved for backward, parameter gradients, the rest."""

    total_bytes: int
    saved_bytes: int = 0
    gradient_bytes: int = 0

    @property
    def other_bytes(self) -> int:
        return self.total_bytes - self.saved_bytes - self.gradient_bytes


@dataclass(frozen=True)
class TracedModule:
    """The facts of one traced pass of a module on example inputs.

    Sizes in bytes of storages (a storage shared by several views counts once). `peak` is the
    highest point of the traced pass (no-grad forward; or forward + backward in training),
    over the tensors it created; `saved_bytes` is what autograd saved for backward at the end
    of the forward pass, parameters, buffers and inputs excluded.
    """

    name: str
    training: bool
    dtype: str  # compute dtype of the parameters and floating inputs
    param_count: int
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    trainable_count: int  # parameters that received a gradient (training) or require one
    largest_trainable: int  # elements of the largest trainable parameter
    factored_state_count: int  # Adafactor's second moment: rows + columns (full for 1-D)
    ops: tuple[TracedOp, ...]
    peak: MemoryMoment
    saved_bytes: int
    output_bytes: int
    optimizer_ops: dict[str, int] = field(default_factory=dict)  # aten ops of one step
    # The trainable parameter tensors as (elements, how many): what an optimizer loops over.
    trainable_tensors: tuple[tuple[int, int], ...] = ()
    # Their elements one by one, in the order the model lists them (and an optimizer steps).
    trainable_order: tuple[int, ...] = ()
    # The tensors the pass takes and gives back, in order (for the allocator's page faults).
    heap: tuple[HeapEvent, ...] = field(default=(), repr=False)
    cast_bytes: int = 0  # the largest tensor a cast to `dtype` replaced (freed before the pass)
    notes: tuple[str, ...] = ()

    def phase_ops(self, phase: str) -> tuple[TracedOp, ...]:
        return tuple(op for op in self.ops if op.phase == phase)

    def flops(self, phase: str | None = None) -> float:
        return sum(op.flops for op in self.ops if phase is None or op.phase == phase)
