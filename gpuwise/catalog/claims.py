"""What `gpuwise claims` decides its verdicts by (data/claims.toml), every value with its
source: the thresholds of each claim, human reading speed, and the per-thread watts a CPU's
power is estimated from where no counter can be read."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import sourced_record, sourced_section

FILE = "claims.toml"


@dataclass(frozen=True)
class ClaimThresholds:
    decode_bandwidth_factor: float  # measured decode time within [1/f, f] of bytes / bandwidth
    memory_bound_share: float  # of a phase's time, above which the phase is memory-bound
    reading_words_per_minute: float  # adults, silent reading of English non-fiction
    tokens_per_word: float  # English, a BPE tokenizer
    energy_per_flop_ratio: float  # decode's joules per FLOP over a training step's, at least
    target_busy_share: float  # the slow-loader job's busy share, by construction
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def reading_tokens_per_s(self) -> float:
        """Human reading speed in tokens per second."""
        return self.reading_words_per_minute * self.tokens_per_word / 60.0


@dataclass(frozen=True)
class ThreadWatts:
    """A CPU thread's power at idle and fully busy, in watts, and where the numbers come from."""

    vendor: str
    idle_w: float
    busy_w: float
    source: str

    def watts(self, threads: float, utilisation: float) -> float:
        """Cloud Carbon Footprint's model: threads x (idle + utilisation x (busy - idle))."""
        share = min(max(utilisation, 0.0), 1.0)
        return threads * (self.idle_w + share * (self.busy_w - self.idle_w))


@cache
def claim_thresholds() -> ClaimThresholds:
    return sourced_record(ClaimThresholds, FILE, "claims")


def thread_watts(vendor: str) -> ThreadWatts:
    """The per-thread watts of a CPU vendor ("amd", "intel", "arm"); Intel's, the higher, for
    any other vendor (the estimate then says so)."""
    values, sources = sourced_section(FILE, "cpu_watts_per_thread")
    key = vendor.strip().lower()
    if key not in values:
        idle, busy = values["intel"]
        return ThreadWatts(key or "unknown", float(idle), float(busy),
                           f"no coefficients for vendor {vendor!r}: Intel's, the higher; "
                           + sources["intel"])
    idle, busy = values[key]
    return ThreadWatts(key, float(idle), float(busy), sources[key])


@dataclass(frozen=True)
class PeopleRun:
    """The runtime and weights people use for a phase on a kind of device, and the source."""

    runtime: str  # as --runtime takes it
    weights: str  # as --weights (or train's --dtype) takes it
    source: str


def runtime_people_use(key: str) -> PeopleRun | None:
    """What people run inference with on a device of kind `key` (hardware.toml `kind`), or
    "training"; None for a kind the catalogue names nothing for."""
    values, sources = sourced_section(FILE, "runtime_people_use")
    if key not in values:
        return None
    runtime, weights = values[key]
    return PeopleRun(str(runtime), str(weights), sources[key])
