"""A repro study's verdict: spread per condition, arithmetic share, costs, and findings.

Pure: takes what the runs reported (per condition) and returns records. The conditions:

- ``same-seed``: the same seed every run, default (possibly nondeterministic) kernels;
- ``deterministic``: the same seed with deterministic algorithms on;
- ``seeds``: a different seed every run;
- ``threads``: the same seed with a different CPU thread count per run (reduction order).

Runs also carry the hardware they ran on; when a study's runs ran on more than one kind, the
hardware is one more source of variance, measured within each condition (`hardware`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwise.estimate.repro.stats import (
    GroupShare,
    Share,
    Spread,
    all_identical,
    arithmetic_share,
    detectable_difference,
    first_divergence,
    group_share,
    runs_needed,
    spread,
)

CONDITIONS = ("same-seed", "deterministic", "seeds", "threads")
FIXED_SEED = ("same-seed", "deterministic", "threads")


@dataclass(frozen=True)
class ConditionRuns:
    """What the successful runs of one condition reported, in run order."""

    name: str
    metrics: dict[str, list[float]]
    params_hashes: list[str | None]
    step_hashes: list[list[tuple[int, str]]]
    wall_s: list[float]
    energy_j: list[float | None]
    deterministic_applied: list[bool | None] = field(default_factory=list)
    failed: int = 0
    # per metric, the hardware each of its values ran on (aligned with `metrics`; None: unknown)
    hardware: dict[str, list[str | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class ConditionSummary:
    name: str
    runs: int
    failed: int
    metrics: dict[str, Spread]
    bit_identical: bool | None  # None: not known (fewer than two runs, no hash of parameters)
    metrics_identical: bool | None
    first_divergent_step: int | None  # None: no per-step hashes, or no divergence
    step_hashes_compared: bool
    wall_s: Spread | None
    energy_j: Spread | None


@dataclass(frozen=True)
class DetectPower:
    """Runs per setting needed to tell two settings apart, from the seeds-varied spread."""

    metric: str
    sd: float
    sd_from: str  # the condition whose standard deviation is used
    diff: float | None
    runs_needed: int | None
    detectable_at_runs: int
    detectable_diff: float
    alpha: float
    power: float


@dataclass(frozen=True)
class HardwareShare:
    """One metric of one condition, its runs grouped by the hardware they ran on."""

    metric: str
    condition: str
    groups: GroupShare


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    hint: str = ""


@dataclass(frozen=True)
class StudyAnalysis:
    conditions: dict[str, ConditionSummary]
    shares: dict[str, dict[str, Share]]  # metric -> fixed-seed condition -> share
    detect: list[DetectPower]
    deterministic_time_ratio: float | None
    deterministic_energy_ratio: float | None
    findings: list[Finding]
    source: str = "measured"
    # Only when the runs ran on more than one kind of hardware: a study on one kind has none,
    # and its analysis is the same wherever (and however spread) its runs ran.
    hardware: list[HardwareShare] = field(default_factory=list)


def summarize(runs: ConditionRuns) -> ConditionSummary:
    """Spread and identity of one condition's runs."""
    metrics = {name: spread(vals) for name, vals in runs.metrics.items() if vals}
    per_run = [tuple(sorted((k, v[i]) for k, v in runs.metrics.items() if i < len(v)))
               for i in range(len(runs.wall_s))]
    with_steps = [s for s in runs.step_hashes if s]
    position = first_divergence(with_steps) if len(with_steps) == len(runs.step_hashes) else None
    step = None
    if position is not None:
        longest = max(with_steps, key=len)
        step = longest[min(position, len(longest) - 1)][0]
    energies = [e for e in runs.energy_j if e is not None]
    return ConditionSummary(
        name=runs.name, runs=len(runs.wall_s), failed=runs.failed, metrics=metrics,
        bit_identical=all_identical(runs.params_hashes),
        metrics_identical=all_identical(per_run) if per_run and per_run[0] else None,
        first_divergent_step=step,
        step_hashes_compared=len(with_steps) >= 2 and len(with_steps) == len(runs.step_hashes),
        wall_s=spread(runs.wall_s) if runs.wall_s else None,
        energy_j=spread(energies) if energies and len(energies) == len(runs.energy_j) else None,
    )


def identical(summary: ConditionSummary) -> bool | None:
    """Bit-identical by the parameter hash when there is one, else by the reported metrics."""
    return summary.bit_identical if summary.bit_identical is not None else summary.metrics_identical


def analyze(conditions: Sequence[ConditionRuns], expected_deterministic: Sequence[str] = (),
            detect_diff: dict[str, float] | None = None, detect_relative: bool = False,
            alpha: float = 0.05, power: float = 0.8,
            confidence: float = 0.95) -> StudyAnalysis:
    """The study's verdict.

    expected_deterministic: conditions whose arithmetic is deterministic on this machine (for
    example `same-seed` on a CPU with a fixed thread count), where runs that differ mean that
    something random is not controlled by the seed.
    detect_diff: per metric (or "*" for all), the difference between two settings the user
    wants to detect; with detect_relative, as a fraction of the metric's mean.
    """
    by_name = {c.name: c for c in conditions}
    summaries = {c.name: summarize(c) for c in conditions}
    shares: dict[str, dict[str, Share]] = {}
    if "seeds" in by_name:
        for metric, varied in by_name["seeds"].metrics.items():
            shares[metric] = {name: arithmetic_share(by_name[name].metrics.get(metric, []),
                                                     varied, confidence)
                              for name in FIXED_SEED if name in by_name}
    detect = _detect_power(summaries, detect_diff or {}, detect_relative, alpha, power)
    time_ratio = _ratio(summaries, "wall_s")
    energy_ratio = _ratio(summaries, "energy_j")
    hardware = hardware_shares(conditions)
    findings = _findings(by_name, summaries, expected_deterministic)
    findings += _hardware_findings(hardware, alpha)
    return StudyAnalysis(summaries, shares, detect, time_ratio, energy_ratio, findings,
                         hardware=hardware)


def hardware_shares(conditions: Sequence[ConditionRuns]) -> list[HardwareShare]:
    """Per condition and metric, the share of the variance between kinds of hardware; empty
    unless the study's runs ran on more than one kind (runs of unknown hardware, from results
    files older than the hardware field, are left out)."""
    kinds = {h for c in conditions for hs in c.hardware.values() for h in hs if h is not None}
    if len(kinds) < 2:
        return []
    out = []
    for c in conditions:
        for metric, values in sorted(c.metrics.items()):
            pairs = [(v, h) for v, h in zip(values, c.hardware.get(metric, []), strict=False)
                     if h is not None]
            if len({h for _, h in pairs}) >= 2:
                share = group_share([v for v, _ in pairs], [h for _, h in pairs])
                out.append(HardwareShare(metric, c.name, share))
    return out


def _hardware_findings(shares: Sequence[HardwareShare], alpha: float) -> list[Finding]:
    found = []
    for s in shares:
        g = s.groups
        if g.p is not None and g.p < alpha and g.share:
            found.append(Finding(
                "hardware-differs",
                f"in '{s.condition}', {s.metric} differs between the hardware its runs ran on "
                f"(p = {g.p:.2g}; {g.share:.0%} of its variance lies between hardware)",
                "compare settings on one kind of hardware, or run each setting on every kind "
                "alike"))
    return found


def _ratio(summaries: dict[str, ConditionSummary], what: str) -> float | None:
    det, base = summaries.get("deterministic"), summaries.get("same-seed")
    if det is None or base is None:
        return None
    a, b = getattr(det, what), getattr(base, what)
    if a is None or b is None or b.mean <= 0:
        return None
    return float(a.mean / b.mean)


def _detect_power(summaries: dict[str, ConditionSummary], diffs: dict[str, float],
                  relative: bool, alpha: float, power: float) -> list[DetectPower]:
    """Runs needed, from the seeds-varied sd (two settings compared on different seeds)."""
    out = []
    metrics = sorted({m for s in summaries.values() for m in s.metrics})
    for metric in metrics:
        source = "seeds" if metric in summaries.get("seeds", _EMPTY).metrics else None
        candidates: list[tuple[float, str]] = [(s.metrics[metric].sd or 0.0, s.name) for s in summaries.values()
                      if metric in s.metrics and s.metrics[metric].sd is not None]
        if source and summaries[source].metrics[metric].sd is not None:
            sd, sd_from = summaries[source].metrics[metric].sd or 0.0, source
        elif candidates:
            sd, sd_from = max(candidates)
        else:
            continue
        runs = summaries[sd_from].runs
        diff = diffs.get(metric, diffs.get("*"))
        if diff is not None and relative:
            diff *= abs(summaries[sd_from].metrics[metric].mean)
        needed = runs_needed(sd, diff, alpha, power) if diff else None
        out.append(DetectPower(metric, sd, sd_from, diff, needed, runs,
                               detectable_difference(sd, runs, alpha, power), alpha, power))
    return out


_EMPTY = ConditionSummary("", 0, 0, {}, None, None, None, False, None, None)


def _findings(by_name: dict[str, ConditionRuns], summaries: dict[str, ConditionSummary],
              expected_deterministic: Sequence[str]) -> list[Finding]:
    found: list[Finding] = []
    seeds = summaries.get("seeds")
    if seeds is not None and seeds.runs >= 2 and identical(seeds):
        found.append(Finding(
            "seed-ignored",
            f"the {seeds.runs} runs with different seeds gave identical results: the program "
            "does not use the seed it is given",
            "call gpuwise.seed_everything() at the start, or name the program's own seed "
            "option with --seed-flag"))
    for name in expected_deterministic:
        s = summaries.get(name)
        if s is not None and s.runs >= 2 and identical(s) is False:
            found.append(Finding(
                "unseeded-randomness",
                f"runs of '{name}' differ although its arithmetic is deterministic here: "
                "something random is not controlled by the seed (the program ignores the seed, "
                "or draws from an unseeded source such as the clock or os.urandom)",
                "seed every generator from GPUWISE_SEED (gpuwise.seed_everything() does it)"))
    det = by_name.get("deterministic")
    if det is not None and det.deterministic_applied and not all(det.deterministic_applied):
        found.append(Finding(
            "deterministic-not-applied",
            "in the 'deterministic' runs the program did not report turning deterministic "
            "algorithms on, so that condition may measure the default kernels",
            "call gpuwise.seed_everything(), which applies GPUWISE_DETERMINISTIC=1, or call "
            "torch.use_deterministic_algorithms(True) when that variable is set"))
    for s in summaries.values():
        if s.failed:
            found.append(Finding("failed-runs", f"{s.failed} run(s) of '{s.name}' failed",
                                 "see the stderr tails in the results file"))
        if s.runs < 2:
            found.append(Finding("too-few-runs", f"'{s.name}' has {s.runs} successful run(s): "
                                 "no spread", "use --runs 2 or more"))
    return found
