"""What a CPU process keeps resident beyond its live tensors: the plan's run replayed through
the host allocator's rules (the "allocator" row of a CPU estimate). Pure: no I/O, no torch.

glibc as users start it (malloc/malloc.c; the values in catalog/data/allocators.toml):

- a request that no free chunk and not the heap's top can hold is mapped on its own when it is
  at least the mmap threshold, else the heap grows (sysmalloc); the threshold starts at 128
  KiB, but a torch + transformers process's imports have raised it to 1.9 MiB before the
  model is built (`mmap_threshold_at_build`), and the replay starts there;
- a tensor comes through posix_memalign at 64 bytes, and _int_memalign asks for its chunk +
  64 + MINSIZE and gives back a leader before the aligned spot and the trailer after it: the
  chunk a freed tensor leaves (with the 48-byte leaders beside it) is 16 bytes too small for a
  tensor of its size, which goes on top (`GlibcHeap.memalign`);
- freeing a mapped chunk unmaps it and raises the threshold to its size, up to 32 MiB, and the
  trim threshold to twice that (__libc_free): from then on tensors of that size come from the
  heap, and the heap's pages stay resident after they are freed;
- a freed heap chunk is coalesced with free neighbours and reused best fit; only when it
  borders the top and the top reaches the trim threshold does the heap shrink (_int_free,
  systrim). Free chunks inside the heap keep their pages.

So after the first large tensor is freed, a process holds the high-water mark of its heap,
holes included, plus what is mapped now. The replay (`estimate/speed/page_faults.GlibcHeap`,
with the resident pages counted) runs the tensors `workload/process_heap.py` lists and reports
the most the process held against the most its tensors held; the difference is the row.
Other allocators (`--allocator`): glibc pinned at a 64 KiB threshold keeps nothing; jemalloc
keeps freed extents below its oversize threshold (8 MiB) for its 10 s dirty decay and rounds
to four size classes a doubling; tcmalloc keeps every freed span (8 KiB pages). Tensors below
64 KiB and allocations outside PyTorch's (the interpreter's, oneDNN's) are not replayed one by
one; what they do to the tensors' chunks is: a small request that no bin of its size holds is
served from the start of a chunk a freed tensor left (the last remainder, or the best-fitting
larger free chunk), so the chunk no longer holds the next tensor of its own size and that
tensor goes on top. Freed, the small chunk waits in tcache and keeps the split. A training
forward's splits stay for the run; elsewhere (a backward, an optimizer step, an inference)
only the last `pinned_small_chunks` do (`carved_by_small_bytes`; docs/memory.md, "On a CPU").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from gpuwise.catalog.allocators import allocator_choice
from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.blas_buffers import blas_buffer_bytes
from gpuwise.estimate.memory.host_replay import ResidentHeap, replay_pairs, replay_resident
from gpuwise.workload import Architecture
from gpuwise.workload.ops import Shape
from gpuwise.workload.plans import InferencePlan, TrainingPlan
from gpuwise.workload.process_heap import generate_pairs, training_step_events
from gpuwise.workload.traced import HeapEvent

DECODE_STEPS_REPLAYED = 16  # more new tokens are replayed in as many steps, each a stride long
TRAINING_STEPS = 2  # as `gpuwise validate` runs them (measure/runs/jobs.py)


@dataclass(frozen=True)
class AllocatorSlack:
    """The most the process held beyond the most its tensors held, in the replay."""

    allocator: str
    slack_bytes: int
    peak_live_bytes: int
    peak_resident_bytes: int
    mmap_threshold_bytes: int  # glibc's threshold at the end of the run


@lru_cache(maxsize=256)
def _generate_slack(arch: Architecture, allocator: str, shape: Shape, steps: int,
                    stride: int) -> AllocatorSlack:
    return _slack_of(replay_pairs(generate_pairs(arch, shape, steps, stride),
                                  allocator_choice(allocator)))


@lru_cache(maxsize=128)
def _training_slack(arch: Architecture, allocator: str, shape: Shape, param: float,
                    optimizer: str, checkpointing: bool, full: bool,
                    lora_rank: int = 0) -> AllocatorSlack:
    step = training_step_events(arch, shape, param, optimizer, checkpointing, trains_weights=full,
                                lora_rank=lora_rank)
    return _slack(allocator, [step] * TRAINING_STEPS, training=True)


def _slack(allocator: str, passes: list[list[HeapEvent]], training: bool = False) -> AllocatorSlack:
    return _slack_of(replay_resident(passes, allocator_choice(allocator), training))


def _slack_of(heap: ResidentHeap) -> AllocatorSlack:
    assert heap.choice is not None
    return AllocatorSlack(heap.choice.name, max(0, heap.peak_resident - heap.peak_live),
                          heap.peak_live, heap.peak_resident, heap.mmap_threshold)


def allocator_slack(arch: Architecture, plan: InferencePlan | TrainingPlan) -> AllocatorSlack:
    """What the plan's allocator keeps beyond the live tensors at the process's peak. The
    replay is cached on what it depends on (the tensors' shapes and dtypes), so plans that
    differ only in their weight format share one."""
    s = _plan_shape(plan)
    if isinstance(plan, InferencePlan):
        stride = max(1, -(-plan.new_tokens // DECODE_STEPS_REPLAYED))
        steps = -(-max(0, plan.new_tokens - 1) // stride)
        return _generate_slack(arch, plan.allocator, s, steps + 1, stride)
    full = plan.finetune == "full"
    return _training_slack(arch, plan.allocator, s, s.weight_bytes, plan.optimizer,
                           plan.checkpointing, full, 0 if full else plan.lora_rank)


def _plan_shape(plan: InferencePlan | TrainingPlan) -> Shape:
    """The prefill's shape, or a training step's (its weights fp32 under autocast)."""
    if isinstance(plan, InferencePlan):
        fmt = plan.weight_format
        c = weight_format(fmt.compute_dtype).bytes_per_element
        kv = weight_format(plan.kv_dtype or fmt.compute_dtype).bytes_per_element
        return Shape(plan.batch, plan.prompt_tokens, plan.prompt_tokens, c, c, kv, plan.attention)
    c = weight_format(plan.compute_dtype).bytes_per_element
    param = 4.0 if plan.mixed else c
    return Shape(plan.batch, plan.seq, plan.seq, c, param, c, plan.attention)


def host_allocator_rows(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware,
                        held: float | None = None) -> dict[str, float]:
    """The "allocator" row of a CPU estimate (what the plan's host allocator keeps beyond the
    live tensors) and the "blas_buffers" row (the matrix products' packing buffers,
    blas_buffers.py); no rows elsewhere. `held` stands in for the replay: a search holds one
    replay's slack while it narrows (fits.py)."""
    if hw.kind != "cpu":
        return {}
    slack = allocator_slack(arch, plan).slack_bytes if held is None else held
    return {"allocator": float(slack), "blas_buffers": float(_blas_buffers(arch, plan, hw))}


def blas_threads(plan: InferencePlan | TrainingPlan, hw: Hardware) -> int:
    """The threads a CPU plan's matrix products run on: the plan's, else one a core."""
    return max(1, getattr(plan, "threads", None) or hw.compute_units)


def _blas_buffers(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware) -> int:
    """The packing buffers the plan's matrix products leave on the host's threads
    (`blas_buffers`): the prefill and a decode step, or a training step."""
    threads, s = blas_threads(plan, hw), _plan_shape(plan)
    if isinstance(plan, InferencePlan):
        decode = replace(s, tokens=1, context=plan.context_tokens)
        return blas_buffer_bytes(arch, [s, decode], threads)
    return blas_buffer_bytes(arch, [replace(s, logits_tokens=plan.seq)], threads,
                             training=True, trains_weights=plan.finetune == "full")


def host_allocator_row(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware,
                       parts: dict[str, float], notes: list[str],
                       held: float | None = None) -> float:
    """`host_allocator_rows` put into `parts` before the overhead, with a note naming the
    allocator; the bytes it adds (0 off a CPU)."""
    rows = host_allocator_rows(arch, plan, hw, held)
    if not rows:
        return 0.0
    overhead = parts.pop("overhead")
    parts.update(rows, overhead=overhead)
    notes.append(f"allocator: {allocator_choice(plan.allocator).label}; it keeps "
                 f"{rows['allocator'] / 2**20:,.0f} MiB beyond the live tensors at the peak "
                 "(docs/memory.md, the CPU process)")
    notes.append(f"blas_buffers: the matrix products' packing buffers, kept by each of "
                 f"{blas_threads(plan, hw)} threads (docs/memory.md, the CPU process)")
    return sum(rows.values())
