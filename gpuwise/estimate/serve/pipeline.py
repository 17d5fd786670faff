"""A pipeline-parallel replica as the simulation sees it (docs/plan.md, "Pipeline
parallelism"): `pp` stages of `tp` devices, each stage holding 1/pp of the layers and their
KV cache. vLLM and SGLang keep pp batches in flight, one a stage, so every device is busy
and each batch crosses every stage in turn: a batch's step takes the whole model's time on
`tp` devices plus the hidden states' hops between stages, and the replica runs pp such
batches at once. So a replica of pp stages is pp engines, each with the full model's step
(plus the hops), 1/pp of the replica's KV pool and 1/pp of its sequences."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.estimate.serve.simulate import StepParts
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.workload import Architecture

Parts = tuple[float, float, float]


def pipeline_hops_s(arch: Architecture, rows: int, compute_bytes: float, rates: DeviceRates,
                    pp: int) -> float:
    """The hidden states of a step's `rows` tokens sent from each stage to the next: pp - 1
    point-to-point sends over the device link, each a collective's latency."""
    if pp <= 1:
        return 0.0
    bw = rates.interconnect_bytes_per_s or rates.memory_bytes_per_s
    return (pp - 1) * (rates.collective_latency_s + rows * arch.hidden_size * compute_bytes / bw)


@dataclass(frozen=True)
class StagedStep:
    """One in-flight batch's step parts: the model's step on one stage's `tp` devices
    (`parts`) with the hops between the `pp` stages added to its host part (a frozen
    record, so that an engine holding it pickles)."""

    parts: StepParts  # the model's step on one stage's devices
    arch: Architecture
    rates: DeviceRates
    compute_bytes: float
    pp: int

    def __call__(self, tokens: int, prompt: int, kv_read: float, flops: float,
                 masked: float = 0.0) -> Parts:
        c, m, h = self.parts(tokens, prompt, kv_read, flops, masked)
        if tokens <= 0:
            return c, m, h
        return c, m, h + pipeline_hops_s(self.arch, tokens, self.compute_bytes, self.rates,
                                         self.pp)


def in_flight_seqs(max_seqs: int, pp: int) -> int:
    """Each in-flight batch's share of the replica's running sequences (vLLM's max_num_seqs
    bounds them all)."""
    return max(1, max_seqs // pp)
