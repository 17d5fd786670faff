"""The grid of sizes a roofline step is timed on, and a step's timed rows summed
(estimate/speed/step.py): the ops that do not read the cache are timed once per number of
tokens on the grid, a decode step's cache reads once per context on it, linear between."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuwise.estimate.speed.roofline import OpTime

EXACT_TOKENS = 64  # steps of up to this many tokens are timed at their own size
SIZES_PER_DOUBLING = 32


def bucket_below(tokens: int) -> int:
    """The size at or below `tokens` the context-free ops are timed at (itself up to 64)."""
    if tokens <= EXACT_TOKENS:
        return max(1, tokens)
    step = 1 << (tokens.bit_length() - 6)  # 2 ** (floor(log2(tokens)) - 5)
    return tokens // step * step


def bucket_above(tokens: int) -> int:
    """The next such size at or above `tokens`."""
    low = bucket_below(tokens)
    if low == tokens:
        return low
    return low + (1 << (tokens.bit_length() - 6))


@dataclass(frozen=True)
class Sums:
    """Timed rows summed: compute-bound and memory-bound seconds and the kernels they run."""

    compute_s: float = 0.0
    memory_s: float = 0.0
    kernels: float = 0.0
    rows: tuple[OpTime, ...] = field(default=(), repr=False)

    @staticmethod
    def of(times: tuple[OpTime, ...]) -> Sums:
        c = m = k = 0.0
        for t in times:
            if t.bound == "compute":
                c += t.seconds
            else:
                m += t.seconds
            k += t.op.count
        return Sums(c, m, k, times)

    def between(self, other: Sums, f: float, rows: bool = False) -> Sums:
        """The sums a share `f` of the way to `other`; its rows this one's, or with `rows`,
        each row's work and seconds as far between (an op table's rows at the shape asked
        for, where the work grows linearly between the two)."""
        between = self.rows
        if rows:
            between = tuple(_row_between(a, b, f) for a, b in zip(self.rows, other.rows,
                                                                  strict=True))
        return Sums(self.compute_s + f * (other.compute_s - self.compute_s),
                    self.memory_s + f * (other.memory_s - self.memory_s),
                    self.kernels + f * (other.kernels - self.kernels), between)


def _row_between(a: OpTime, b: OpTime, f: float) -> OpTime:
    op = replace(a.op, flops=a.op.flops + f * (b.op.flops - a.op.flops),
                 bytes=a.op.bytes + f * (b.op.bytes - a.op.bytes))
    return a._replace(op=op, compute_s=a.compute_s + f * (b.compute_s - a.compute_s),
                      memory_s=a.memory_s + f * (b.memory_s - a.memory_s))
