"""How each serving runtime schedules requests (data/schedulers.toml), every value with its
source."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache

from gpuwise.catalog.runtime_speed import RUNTIME_IDS
from gpuwise.catalog.sourced import sourced_record

FILE = "schedulers.toml"
POLICIES = ("mixed", "prefill_first", "slots", "static")


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
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def on(self, memory_bytes: int, device_id: str) -> SchedulerDefaults:
        """The defaults the runtime picks on a device of `memory_bytes` named `device_id`."""
        large = (self.large_device_gib and memory_bytes >= self.large_device_gib * 2**30
                 and not any(x in device_id.lower() for x in self.large_device_excluded))
        if not large:
            return self
        return replace(self, max_batched_tokens=self.large_max_batched_tokens,
                       max_seqs=self.large_max_seqs)


@cache
def scheduler_defaults(runtime: str) -> SchedulerDefaults:
    """The runtime's scheduler as it ships (estimate/runtimes/ says whose a runtime uses)."""
    section = RUNTIME_IDS.get(runtime, runtime)
    record = sourced_record(SchedulerDefaults, FILE, section, runtime=runtime)
    return replace(record, large_device_excluded=tuple(record.large_device_excluded))
