"""Statistics of repeated runs: spread, the arithmetic share of the variance, runs needed.

Pure functions on lists of numbers; no I/O. The formulas (docs/repro.md has them in full):

- spread: mean, sample standard deviation (n - 1 in the denominator), range.
- arithmetic share: s_fixed^2 / s_seeds^2, the variance left with the seed fixed over the
  variance with the seeds varied. If both samples are independent and normal,
  (s1^2/σ1^2) / (s2^2/σ2^2) follows F(n1 - 1, n2 - 1), so the interval for σ1^2/σ2^2 is
  [R / F_{1-α/2}(n1-1, n2-1), R * F_{1-α/2}(n2-1, n1-1)].
- runs per setting to detect a difference d between two settings (two-sided test at level α,
  power 1 - β, normal approximation): n = 2 (z_{1-α/2} + z_{1-β})^2 s^2 / d^2, rounded up.
- between groups (runs grouped by the hardware they ran on): one-way random-effects ANOVA.
  With k groups of n_i runs (N in all), MSB = Σ n_i (m_i - m)^2 / (k - 1) and
  MSW = Σ Σ (x - m_i)^2 / (N - k); the between-group variance component is
  max(0, (MSB - MSW) / n0), n0 = (N - Σ n_i^2 / N) / (k - 1), its share of the total
  component + MSW, and MSB / MSW ~ F(k - 1, N - k) when the groups do not differ.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwise.estimate.repro.distributions import f_cdf, f_quantile


@dataclass(frozen=True)
class Spread:
    """Mean, sample standard deviation and range of one metric over n runs."""

    n: int
    mean: float
    sd: float | None  # None with fewer than two runs
    min: float
    max: float

    @property
    def variance(self) -> float | None:
        return None if self.sd is None else self.sd**2

    @property
    def range(self) -> float:
        return self.max - self.min


def spread(values: Sequence[float]) -> Spread:
    """The spread of a sample; needs at least one value."""
    if not values:
        raise ValueError("spread of an empty sample")
    sd = statistics.stdev(values) if len(values) > 1 else None
    # Equal values give exactly 0, not a rounding residue: "bit-identical" must read as 0.
    if sd is not None and min(values) == max(values):
        sd = 0.0
    return Spread(len(values), statistics.fmean(values), sd, min(values), max(values))


@dataclass(frozen=True)
class Share:
    """Variance with the seed fixed as a fraction of the variance with the seeds varied."""

    ratio: float | None  # None when undefined (no spread with seeds varied, or too few runs)
    low: float | None
    high: float | None
    confidence: float
    n_fixed: int
    n_varied: int
    note: str = ""

    @property
    def exactly_zero(self) -> bool:
        """The runs with the seed fixed did not differ at all."""
        return self.ratio == 0.0


def variance_ratio_interval(ratio: float, n_num: int, n_den: int,
                            confidence: float = 0.95) -> tuple[float, float]:
    """Confidence interval for σ_num^2 / σ_den^2 given the sample ratio s_num^2 / s_den^2."""
    if n_num < 2 or n_den < 2:
        raise ValueError("a variance ratio needs at least two runs on each side")
    upper_tail = 1.0 - (1.0 - confidence) / 2.0
    low = ratio / f_quantile(upper_tail, n_num - 1, n_den - 1)
    high = ratio * f_quantile(upper_tail, n_den - 1, n_num - 1)
    return low, high


def arithmetic_share(fixed: Sequence[float], varied: Sequence[float],
                     confidence: float = 0.95) -> Share:
    """The share of the seed-varied variance that remains with the seed fixed."""
    n1, n2 = len(fixed), len(varied)
    if n1 < 2 or n2 < 2:
        return Share(None, None, None, confidence, n1, n2, "needs at least two runs each")
    v1, v2 = spread(fixed).variance or 0.0, spread(varied).variance or 0.0
    if v1 == 0.0:
        note = "runs with the seed fixed are identical" + ("" if v2 else "; so are the seeds'")
        return Share(0.0, 0.0, 0.0, confidence, n1, n2, note)
    if v2 == 0.0:
        return Share(None, None, None, confidence, n1, n2, "no spread with the seeds varied")
    ratio = v1 / v2
    low, high = variance_ratio_interval(ratio, n1, n2, confidence)
    note = "above 1: within noise, the seed adds nothing measurable" if ratio > 1 else ""
    return Share(ratio, low, high, confidence, n1, n2, note)


def _z_sum(alpha: float, power: float) -> float:
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    z = statistics.NormalDist()
    return z.inv_cdf(1.0 - alpha / 2.0) + z.inv_cdf(power)


def runs_needed(sd: float, diff: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Runs per setting to detect a true difference `diff` between two settings.

    At least 2 (a standard deviation needs two runs); with sd = 0 any difference shows at once.
    """
    if diff <= 0:
        raise ValueError(f"the difference to detect must be positive, got {diff}")
    n = 2.0 * _z_sum(alpha, power) ** 2 * sd**2 / diff**2
    return max(2, math.ceil(n - 1e-9))  # the epsilon keeps exact integers from rounding up


def detectable_difference(sd: float, runs: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference that `runs` runs per setting detect (same approximation)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    return _z_sum(alpha, power) * sd * math.sqrt(2.0 / runs)


def all_identical(items: Sequence[object]) -> bool | None:
    """True if every item equals the first; None with fewer than two items or any missing."""
    if len(items) < 2 or any(x is None for x in items):
        return None
    return all(x == items[0] for x in items[1:])


def first_divergence(sequences: Sequence[Sequence[object]]) -> int | None:
    """The first position where the sequences differ (or one ends early); None if all agree."""
    if len(sequences) < 2:
        return None
    for i in range(max(len(s) for s in sequences)):
        column = [s[i] if i < len(s) else None for s in sequences]
        if any(c != column[0] for c in column[1:]):
            return i
    return None


@dataclass(frozen=True)
class GroupShare:
    """How much of a sample's variance lies between groups (one-way random-effects ANOVA)."""

    runs: dict[str, int]  # group -> runs in it
    means: dict[str, float]
    between: float | None  # the between-group variance component; None: not estimable
    within: float | None  # the pooled within-group variance (MSW)
    share: float | None  # between / (between + within)
    f: float | None  # MSB / MSW (inf: the groups differ, runs within each are identical)
    p: float | None  # P(F >= f) if the groups did not differ
    note: str = ""


def group_share(values: Sequence[float], groups: Sequence[str]) -> GroupShare:
    """The between-group share of the variance of `values`, grouped by `groups` (same order)."""
    by: dict[str, list[float]] = {}
    for value, group in zip(values, groups, strict=True):
        by.setdefault(group, []).append(value)
    runs = {g: len(v) for g, v in sorted(by.items())}
    means = {g: statistics.fmean(v) for g, v in sorted(by.items())}
    n, k = len(values), len(by)
    if k < 2:
        return GroupShare(runs, means, None, None, None, None, None, "one group")
    grand = statistics.fmean(values)
    ssb = sum(runs[g] * (means[g] - grand) ** 2 for g in by)
    ssw = sum((x - means[g]) ** 2 for g, v in by.items() for x in v)
    if all(min(v) == max(v) for v in by.values()):
        ssw = 0.0  # equal values: exactly 0, not a rounding residue
    if len(set(values)) == 1:
        return GroupShare(runs, means, 0.0, 0.0, 0.0, None, None, "every run is identical")
    msb = ssb / (k - 1)
    if n == k:
        return GroupShare(runs, means, None, None, None, None, None,
                          "one run per group: no spread within a group")
    msw = ssw / (n - k)
    n0 = (n - sum(c * c for c in runs.values()) / n) / (k - 1)
    between = max(0.0, (msb - msw) / n0)
    if msw == 0.0:
        return GroupShare(runs, means, between, 0.0, 1.0, math.inf, 0.0,
                          "runs within each group are identical; the groups differ")
    f = msb / msw
    p = 1.0 - f_cdf(f, k - 1, n - k)
    return GroupShare(runs, means, between, msw, between / (between + msw), f, p)
