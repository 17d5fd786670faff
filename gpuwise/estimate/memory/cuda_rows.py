"""What a PyTorch process on a GPU holds beyond its live tensors, as breakdown rows:

- `allocator_slack`: memory the caching allocator keeps reserved but not in use at the peak
  (block rounding, segment tails, freed blocks too small or in the wrong segment for the next
  request). It is the replay (`cuda_allocator.replay`) of the pass's tensors in transformers'
  order (workload/prefill_heap.py, training_heap.py): reserved peak minus live peak. The pass
  is replayed whole (a few thousand events; the first decode steps of a generation);
- `cublas_workspace`: the BLAS workspace PyTorch takes from its pool on the first matmul;
- `overhead`: the CUDA context (driver, loaded kernels, library handles) outside the pool;
- `nccl_buffers`: each NCCL communicator's channel buffers, outside the pool.

`allocator_slack` and `cublas_workspace` are inside `torch.cuda.memory_reserved`; all four
are inside `nvidia-smi`'s used memory. Weights loaded by `from_pretrained` are carved out of
one block the size of the model (transformers' caching_allocator_warmup) and add no slack.
"""

from __future__ import annotations

from functools import lru_cache

from gpuwise.catalog.allocators import host_allocator
from gpuwise.catalog.cuda_allocator import cublas_workspace_bytes, cuda_allocator
from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.cuda_allocator import ReplayPeak, replay
from gpuwise.estimate.memory.quant_workspace import quant_workspace
from gpuwise.workload import Architecture
from gpuwise.workload.ops import Shape
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.prefill_heap import PairTrace, layer_tensors, norm_tensors
from gpuwise.workload.traced import HeapEvent
from gpuwise.workload.training_heap import training_heap_events

Events = list[tuple[int, int]]
# The cache grows by one token a step and crosses a 2 MiB rounding step only every
# 2 MiB / (bytes a token of one layer) tokens; the steps replayed show the pattern.
DECODE_STEPS_REPLAYED = 16


def uses_cuda_allocator(hw: Hardware) -> bool:
    """GPUs run PyTorch's caching allocator (HIP's on AMD is the same code)."""
    return hw.kind == "gpu"


def device_rows(hw: Hardware, slack: float, communicators: int = 0) -> dict[str, float]:
    """The rows a GPU process adds to its tensors (see the module docstring)."""
    rules = cuda_allocator()
    return {"allocator_slack": slack, "cublas_workspace": float(cublas_workspace_bytes(hw.id)),
            "nccl_buffers": float(communicators * rules.nccl_communicator_bytes),
            "overhead": float(rules.cuda_context_bytes)}


def generate_events(arch: Architecture, batch: int, prompt: int, new_tokens: int, c: float,
                    attention: str, all_logits: bool) -> Events:
    """transformers' generate(): the prefill layer by layer (the cache keeps each layer's keys
    and values), the logits, then decode steps that concatenate one token onto every layer's
    cache (DynamicCache.update: torch.cat into a new tensor, the old one given back)."""
    h = PairTrace()
    h.small = 0  # the GPU pool takes every tensor
    s = Shape(batch, prompt, prompt, c, c, c, attention)
    rows = batch * prompt
    h.take("x", rows * arch.hidden_size * c)
    for layer in range(arch.num_layers):
        layer_tensors(h, arch, s, layer)
    norm_tensors(h, arch, rows * arch.hidden_size, c, "final")
    h.take("logits", batch * (prompt if all_logits else 1) * arch.vocab_size * c)
    h.drop("x", "final")
    h.take("next", batch * arch.vocab_size * 4)  # the last position's logits in fp32
    h.drop("logits")
    events = h.pairs
    _decode_events(events, h, arch.kv_dim * c * batch, prompt, new_tokens, arch.num_layers)
    return events


def _decode_events(events: Events, h: PairTrace, kv: float, prompt: int, new_tokens: int,
                   layers: int) -> None:
    """The decode steps of `generate_events`, appended to `events`: each takes a cache one
    token longer under a new key and gives the old one back (HeapTrace's take, drop and
    rename, written out: a search replays thousands of them), then everything is given
    back, in the order the trace holds it."""
    live, serial = h.live, h.serial
    names = [(f"k{layer}", f"v{layer}", f"qkv{layer}") for layer in range(layers)]
    for step in range(min(max(0, new_tokens - 1), DECODE_STEPS_REPLAYED)):
        nbytes = kv * (prompt + step + 1)
        for k, v, qkv in names:
            for name in (k, v):
                if nbytes >= h.small:
                    serial += 1
                    events.append((serial, int(nbytes)))
                old = live.pop(name, None)
                if old is not None:
                    events.append((old, 0))
                if nbytes >= h.small:
                    live[name] = serial
            old = live.pop(qkv, None)  # a fused projection's views, replaced by the cat's copies
            if old is not None:
                events.append((old, 0))
    events.extend((key, 0) for key in live.values())
    h.serial = serial
    live.clear()


@lru_cache(maxsize=1024)  # a search asks for the same plan on the same model many times
def inference_peak(arch: Architecture, batch: int, prompt: int, new_tokens: int, c: float,
                   attention: str, all_logits: bool, expandable: bool) -> ReplayPeak:
    return replay(generate_events(arch, batch, prompt, new_tokens, c, attention, all_logits),
                  expandable)


def step_events(arch: Architecture, batch: int, seq: int, c: float, param_bytes: float,
                attention: str, checkpointing: bool, vocab_rows: float,
                weight_grads: bool) -> Events:
    """A training step's forward and backward (workload/training_heap.py, transformers'
    order), with the vocabulary-sized tensors the heap leaves out put in at the turn: the
    logits and the fp32 log-probabilities the loss saves, then the two fp32 gradients of
    log_softmax's backward and the logits' gradient in the compute dtype. `vocab_rows`: the
    rows those tensors have at once (all tokens, or one chunk of a chunked loss).
    `weight_grads` False (adapters): the frozen projections take no gradient."""
    shape = Shape(batch, seq, seq, c, param_bytes, c, attention, seq)
    if batch * seq * arch.hidden_size * c < host_allocator().untracked_below_bytes:
        return []  # the heap tracks no tensor this small: a toy pass, no slack to speak of
    heap = [e for e in training_heap_events(arch, shape, param_bytes, "sgd", checkpointing)
            if e.phase != "optimizer"]
    freed = {e.key for e in heap if e.nbytes == 0}
    # A forward tensor never given back is an autocast weight copy of a checkpointed
    # layer's first forward, which the heap does not give back (the first forward saves
    # nothing under checkpointing): it lives only through its matmul.
    heap = [x for e in heap for x in ([e, HeapEvent(e.key, 0, e.phase)]
            if e.phase == "forward" and e.nbytes and e.key not in freed else [e])]
    if not weight_grads:
        heap = [e for e in heap if e.phase == "forward" or e.nbytes == 0 or e.key in freed]
    turn = next((i for i, e in enumerate(heap) if e.phase == "backward"), len(heap))
    top = max((e.key for e in heap), default=0)
    v = vocab_rows * arch.vocab_size
    logits, logp, g1, g2, g3 = range(top + 1, top + 6)
    vocab = [(logits, int(v * c)), (logp, int(v * 4)), (g1, int(v * 4)), (g2, int(v * 4)),
             (g1, 0), (logp, 0), (g3, int(v * c)), (g2, 0), (logits, 0), (g3, 0)]
    events = [(e.key, e.nbytes) for e in heap]
    return events[:turn] + vocab + events[turn:]


@lru_cache(maxsize=1024)
def training_peak(arch: Architecture, batch: int, seq: int, c: float, param_bytes: float,
                  attention: str, checkpointing: bool, vocab_rows: float, weight_grads: bool,
                  expandable: bool) -> ReplayPeak:
    return replay(step_events(arch, batch, seq, c, param_bytes, attention, checkpointing,
                              vocab_rows, weight_grads), expandable)


def device_slack(peak: ReplayPeak, capacity: float, others: float) -> float:
    """The slack a device of `capacity` shows beside `others` (every other row): all the pool
    reserved where there is room; where memory runs short, an out-of-memory retry gives back
    every wholly free segment (release_cached_blocks) and the pool fills the device, but
    never holds less than the segments pinned by live tensors."""
    return float(min(peak.slack, max(peak.pinned_slack, capacity - others)))


def inference_gpu_rows(arch: Architecture, plan: InferencePlan, hw: Hardware,
                       parts: dict[str, float], notes: list[str],
                       in_forward: bool = True, replayed: bool = True) -> float:
    """On a GPU: the quantisation kernel's workspace (a forward pass's: not at a peak
    outside it, `in_forward` False) and the CUDA rows replace the runtime's fixed overhead in
    `parts`. Returns what the rows add to the total (0 elsewhere). `replayed` False: no
    replay, the allocator's slack taken as none (a lower bound, fits.py)."""
    if not uses_cuda_allocator(hw):
        return 0.0
    before = sum(parts.values())
    workspace, kernel = quant_workspace(arch, plan)
    if workspace and in_forward:
        parts["workspace"] = parts.get("workspace", 0.0) + workspace
        notes.append(f"{kernel}: {workspace / 2**20:,.0f} MiB of workspace")
    parts.pop("overhead", None)
    c = plan.compute_format.bytes_per_element
    # AutoAWQ's fused cache never grows: no decode step reallocates it.
    new_tokens = 1 if plan.fuse_layers else plan.new_tokens
    rows = device_rows(hw, 0.0)
    if replayed:
        peak = inference_peak(arch, plan.batch, plan.prompt_tokens, new_tokens, c,
                              plan.attention, plan.logits == "all", plan.expandable_segments)
        rows["allocator_slack"] = device_slack(peak, hw.memory_bytes,
                                               sum(parts.values()) + sum(rows.values()))
    parts.update(rows)
    return sum(parts.values()) - before
