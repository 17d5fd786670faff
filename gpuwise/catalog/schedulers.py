"""How each serving runtime schedules requests (data/schedulers.toml), every value with its
source."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache

from gpuwise.catalog.runtime_speed import RUNTIME_IDS
from gpuwise.catalog.sourced import sourced_section

FILE = "schedulers.toml"
POLICIES = ("mixed", "prefill_first", "slots", "static")


@dataclass(frozen=True)
class MemoryTier:
    """What a runtime picks on a device of less than `below_gib` of memory (SGLang's
    server_args.py, by the device's total memory)."""

    below_gib: float
    max_batched_tokens: int  # SGLang's chunked_prefill_size
    # the largest decode batch captured as a CUDA graph: (from this many tensor-parallel
    # devices, the batch), ascending
    cuda_graph_max_bs: tuple[tuple[int, int], ...]

    def graph_batch(self, tp: int) -> int:
        """cuda_graph_max_bs on one device of `tp`."""
        return [bs for least, bs in self.cuda_graph_max_bs if tp >= least][-1]


@dataclass(frozen=True)
class SchedulerDefaults:
    runtime: str
    policy: str
    max_batched_tokens: int
    max_seqs: int
    block_tokens: int
    prefix_cache: bool
    reserve_output: float
    token_host_s: float
    request_host_s: float
    # the next step is chosen while the current one runs, so a request that arrives during
    # a step waits for the step after the next (SGLang's overlap scheduler); off where unset
    overlap: bool = False
    # one cache of cells for every sequence (llama.cpp's unified KV cache): a prompt's
    # attention spans every cell in it, other sequences' masked, and an idle slot keeps its
    # last request's cells (llama-server's prompt cache); off where unset
    shared_cells: bool = False
    # larger defaults on a device of at least `large_device_gib` of memory whose id names
    # none of `large_device_excluded` (vLLM's for H100-class devices); 0: none
    large_device_gib: float = 0.0
    large_device_excluded: tuple[str, ...] = ()
    large_max_batched_tokens: int = 0
    large_max_seqs: int = 0
    # by the device's memory, the first tier it is below: max_batched_tokens (and the CUDA
    # graphs' largest batch) as SGLang picks them; (): none
    memory_tiers: tuple[MemoryTier, ...] = ()
    # max_seqs grows with the KV cache (SGLang's max_running_requests): the cache's tokens
    # over the context, times `seqs_per_context`, between max_seqs and `max_seqs_cap`, and no
    # more than the cache's tokens over `tokens_per_seq_least`; 0: max_seqs as it is
    seqs_per_context: int = 0
    max_seqs_cap: int = 0
    tokens_per_seq_least: int = 1
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def on(self, memory_bytes: int, device_id: str) -> SchedulerDefaults:
        """The defaults the runtime picks on a device of `memory_bytes` named `device_id`."""
        tier = self.tier(memory_bytes)
        if tier is not None:
            return replace(self, max_batched_tokens=tier.max_batched_tokens)
        large = (self.large_device_gib and memory_bytes >= self.large_device_gib * 2**30
                 and not any(x in device_id.lower() for x in self.large_device_excluded))
        if not large:
            return self
        return replace(self, max_batched_tokens=self.large_max_batched_tokens,
                       max_seqs=self.large_max_seqs)

    def tier(self, memory_bytes: int) -> MemoryTier | None:
        """The memory tier of a device of `memory_bytes` (None where the runtime has none)."""
        return next((t for t in self.memory_tiers if memory_bytes < t.below_gib * 2**30), None)

    def with_cache(self, cache_tokens: int, context: int) -> SchedulerDefaults:
        """The defaults with max_seqs as the runtime sizes it by a KV cache of `cache_tokens`
        and a context of `context` tokens (where it does)."""
        if not self.seqs_per_context:
            return self
        grown = int(cache_tokens / context * self.seqs_per_context)
        seqs = min(max(grown, self.max_seqs), self.max_seqs_cap)
        return replace(self, max_seqs=max(1, min(seqs, cache_tokens // self.tokens_per_seq_least)))


@cache
def scheduler_defaults(runtime: str) -> SchedulerDefaults:
    """The runtime's scheduler as it ships (estimate/runtimes/ says whose a runtime uses)."""
    section = RUNTIME_IDS.get(runtime, runtime)
    values, sources = sourced_section(FILE, section)
    tiers = tuple(MemoryTier(t["below_gib"], t["max_batched_tokens"],
                             tuple((least, bs) for least, bs in t["cuda_graph_max_bs"]))
                  for t in values.pop("memory_tiers", ()))
    excluded = tuple(values.pop("large_device_excluded", ()))
    return SchedulerDefaults(**values, runtime=runtime, large_device_excluded=excluded,
                             memory_tiers=tiers, sources=sources)
