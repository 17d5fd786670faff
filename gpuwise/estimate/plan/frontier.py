"""The frontiers `gpuwise plan` draws (docs/plan.md, "The frontier"), over the configurations
it sized that meet the targets: at each one's knee (the highest rate a replica serves within
the targets), output tokens a second per device against tokens a second per user (1 / p90
time per output token), both higher better, as NVIDIA's AIConfigurator draws them; and, at
the load, dollars per million tokens against p90 time per output token, both lower better.
A point is on a frontier where no other is at least as good on both and better on one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuwise.estimate.plan.search import Evaluated

P = TypeVar("P")


@dataclass(frozen=True)
class SpeedPoint:
    """A configuration at its knee: the rate a replica serves within the targets, and what
    a device and a user get there."""

    evaluated: Evaluated
    rate: float
    per_device: float  # output tokens a second a device
    per_user: float  # tokens a second a user at the p90 time per output token


def per_device(e: Evaluated) -> float:
    """Output tokens a second a device serves, its replica at the load."""
    return e.sizing.tokens_per_s / max(1, e.sizing.devices_per_replica)


def per_user(e: Evaluated) -> float:
    """Tokens a second a user sees at the p90 time per output token."""
    return 1.0 / e.sizing.tpot_s if e.sizing.tpot_s else 0.0


def usd_per_mtok(e: Evaluated) -> float:
    return e.option.cost.usd_per_million_tokens or 0.0


def p90_tpot(e: Evaluated) -> float:
    return e.sizing.tpot_s or 0.0


def speed_frontier(points: Sequence[SpeedPoint]) -> list[SpeedPoint]:
    """Throughput per device against speed per user at the knee, highest per user first."""
    return _pareto(list(points), lambda p: (-p.per_user, -p.per_device))


def cost_frontier(points: Sequence[Evaluated]) -> list[Evaluated]:
    """$ per million tokens against p90 time per output token, cheapest first."""
    return _pareto([e for e in points if e.meets], lambda e: (usd_per_mtok(e), p90_tpot(e)))


def _pareto(points: list[P], key: Callable[[P], tuple[float, float]]) -> list[P]:
    """Points no other dominates on `key` (both parts lower better), by the first part."""
    out: list[P] = []
    best_second = float("inf")
    for e in sorted(points, key=key):
        second = key(e)[1]
        if second < best_second:
            out.append(e)
            best_second = second
    return out
