"""The state a serving engine keeps (docs/serve.md, "The simulation"): each request's progress
through its prompt and output, and the KV cache it holds, in blocks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuwise.workload.requests import Request


@dataclass(eq=False, slots=True)  # slots: the simulation's hot loops read its fields
class Seq:
    """A request inside the engine. `target` is the prompt to (re)compute: the prompt, plus
    the tokens generated so far after a preemption by recompute."""

    id: int
    req: Request
    target: int
    computed: int = 0  # positions whose keys and values are in the cache
    base: int = 0  # of them, the shared prefix the prefix cache holds (not this sequence's blocks)
    generated: int = 0
    blocks: int = 0
    first_token_s: float = -1.0
    last_token_s: float = -1.0
    done_s: float = -1.0
    received: bool = False  # seen by a scheduler that picks a step ahead (Limits.overlap)
    tick0: int = -1  # the decoding group's clock when it joined (decoding.py); -1: not in it

    @property
    def prefilling(self) -> bool:
        return self.computed < self.target


@dataclass
class KvPool:
    """The KV cache: `blocks` blocks of `block_tokens` positions, shared by the sequences."""

    blocks: int
    block_tokens: int
    used: int = 0
    peak: int = 0
    timeline: list[tuple[float, float]] = field(default_factory=list)

    def need(self, seq: Seq, positions: int) -> int:
        """More blocks `seq` needs to hold `positions` positions."""
        return max(0, -(-(positions - seq.base) // self.block_tokens) - seq.blocks)

    def fits(self, blocks: int) -> bool:
        return self.used + blocks <= self.blocks

    def take(self, seq: Seq, blocks: int) -> None:
        seq.blocks += blocks
        self.used += blocks
        self.peak = max(self.peak, self.used)

    def free(self, seq: Seq) -> None:
        self.used -= seq.blocks
        seq.blocks = 0

    def note(self, now: float, every_s: float) -> None:
        """The fraction in use, at most once every `every_s` seconds of simulated time."""
        if not self.timeline or now - self.timeline[-1][0] >= every_s:
            self.timeline.append((now, self.used / self.blocks if self.blocks else 0.0))


@dataclass
class Step:
    """What one engine step runs: (sequence, new tokens) pairs."""

    work: list[tuple[Seq, int]] = field(default_factory=list)
    preempted: int = 0
    group: bool = False  # and every member of the decoding group one token (decoding.py)


@dataclass
class Histogram:
    """Counts of values in bins 1% wide (log scale): percentiles within 1% of the exact ones,
    in constant memory, for the millions of inter-token gaps of a long run."""

    bins: dict[int, int] = field(default_factory=dict)
    total: int = 0
    STEP = math.log(1.01)

    def add(self, value: float, count: int = 1) -> None:
        b = math.floor(math.log(max(value, 1e-9)) / self.STEP)
        self.bins[b] = self.bins.get(b, 0) + count
        self.total += count

    def percentile(self, p: float) -> float | None:
        """The bin's middle value where the p-th percentile falls (None: empty)."""
        if not self.total:
            return None
        rank, seen = p / 100 * self.total, 0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= rank:
                return math.exp((b + 0.5) * self.STEP)
        return math.exp((max(self.bins) + 0.5) * self.STEP)

    def mean(self) -> float | None:
        if not self.total:
            return None
        return sum(n * math.exp((b + 0.5) * self.STEP) for b, n in self.bins.items()) / self.total
