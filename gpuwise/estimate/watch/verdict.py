"""The verdict of `gpuwise watch`: what limits the training loop, with its evidence and
what to try. Pure: it reads a WatchSummary and states the thresholds it uses.

- input-bound: waiting for data plus host-to-device copies take at least
  `input_bound_share` of the step time (the device idles meanwhile);
- host/launch-bound: otherwise, when the step's remaining time divided by the operators it
  runs is at most `host_bound_us_per_op` microseconds, or `host_bound_dispatch_factor`
  times this host's measured cost of one tiny operator where that is more (the cost of
  dispatching an operator and launching its kernel, not of the arithmetic; a slow host
  dispatches slowly); without an operator count, a GPU busy less than
  `low_gpu_util_percent` of the time with the input not to blame says the same;
- compute-bound: neither of these: the time goes into operators big enough to be worth
  their launch;
- memory creep: RSS or device memory grows across steps after warm-up by at least
  `creep_min_bytes` and `creep_min_fraction` of where it started, steadily (correlation of
  bytes with step number at least `creep_min_r`);
- stragglers: see `ranks`.

The thresholds, with their sources: catalog/data/thresholds.toml, `[watch]`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch.ranks import RankSpread
from gpuwise.estimate.watch.summary import MemoryTrend, WatchSummary
from gpuwise.units import format_bytes


@dataclass(frozen=True)
class Finding:
    kind: str  # input-bound, host-bound, compute-bound, memory-creep, stragglers, no-steps
    title: str
    evidence: tuple[str, ...]
    suggestions: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    bound: str  # the first finding's kind: input-bound, host-bound, compute-bound or no-steps
    findings: tuple[Finding, ...]


def verdict(summary: WatchSummary) -> Verdict:
    """Classify the loop; memory creep and stragglers are added when present."""
    if summary.steps_total == 0:
        evidence = ["no optimizer step, DataLoader batch or w.step() marker was recorded"]
        if summary.gpu_util_percent is not None:
            evidence.append(f"GPU busy {summary.gpu_util_percent:.0f}% of the run (measured)")
        first = Finding("no-steps", "no training steps were seen", tuple(evidence), (
            "run a PyTorch loop without --no-inject, or mark steps with `gpuwise.watch()` "
            "(see docs/watch.md)",))
    else:
        first = _input_bound(summary) or _host_bound(summary) or _compute_bound(summary)
    extra = [f for f in (*(creep_finding(t) for t in summary.memory), _stragglers(summary)) if f]
    return Verdict(first.kind, (first, *extra))


def input_share(summary: WatchSummary) -> float:
    share = summary.phase_share
    return share.get("data", 0.0) + share.get("h2d", 0.0)


def _input_bound(s: WatchSummary) -> Finding | None:
    total = input_share(s)
    limit = watch_thresholds().input_bound_share
    if total < limit:
        return None
    data, h2d = s.phase_share.get("data", 0.0), s.phase_share.get("h2d", 0.0)
    evidence = [f"waiting for data: {data:.1%} of step time, host-to-device copies: "
                f"{h2d:.1%} (measured; threshold {limit:.0%})",
                f"idle time: {s.phase_s['data'] + s.phase_s['h2d']:.2f} s of "
                f"{sum(s.phase_s.values()):.2f} s in steps (measured)"]
    if s.energy.idle_j is not None:
        evidence.append(f"energy spent waiting for data: {s.energy.idle_j:,.0f} J (estimated)")
    if s.gpu_util_percent is not None:
        evidence.append(f"GPU busy {s.gpu_util_percent:.0f}% of the time (measured)")
    if s.ranks is not None:  # one slow input pipeline makes every rank wait in backward
        evidence.append("waiting for data by rank (median step): " + ", ".join(
            f"{r.rank}: {r.data_s_median / r.step_s_median:.0%}" for r in s.ranks.ranks
            if r.step_s_median > 0))
    gpu = _saw_gpu(s)
    tips = [
        "more DataLoader workers (num_workers), persistent_workers=True, a larger prefetch_factor",
        "decode/augment once offline, or on the GPU; cache the dataset" if gpu else
        "decode/augment once offline; cache the dataset",
    ]
    if h2d > data:
        tips = [
            "pin_memory=True with .to(device, non_blocking=True)",
            "send compact dtypes (uint8 images, int32 tokens) and convert on the device",
        ]
    tips.append("a faster GPU will not help: it would wait longer" if gpu else
                "faster compute will not help: the model would wait longer for its input")
    return Finding("input-bound", f"input-bound: {total:.0%} of each step waits for data",
                   tuple(evidence), tuple(tips))


def _saw_gpu(s: WatchSummary) -> bool:
    """Whether the job ran on a GPU, as far as the log says (GPU readings or device memory):
    a CPU-only job's tips do not talk about a GPU."""
    return s.gpu_util_percent is not None or any(t.what == "device" for t in s.memory)


def host_bound_threshold_us(s: WatchSummary) -> float:
    """Microseconds per operator at or below which the loop is host-bound."""
    t = watch_thresholds()
    if s.dispatch_us is None:
        return t.host_bound_us_per_op
    return max(t.host_bound_us_per_op, t.host_bound_dispatch_factor * s.dispatch_us)


def _threshold_words(s: WatchSummary) -> str:
    t = watch_thresholds()
    limit = host_bound_threshold_us(s)
    if limit == t.host_bound_us_per_op:
        return f"threshold {limit:.0f} us"
    return (f"threshold {limit:.0f} us: {t.host_bound_dispatch_factor:.0f}x this host's "
            f"{s.dispatch_us:.1f} us per tiny operator, measured")


def _host_bound(s: WatchSummary) -> Finding | None:
    low_util = watch_thresholds().low_gpu_util_percent
    if s.us_per_op is not None and s.ops_per_step:
        if s.us_per_op > host_bound_threshold_us(s):
            return None
        evidence = [f"{s.ops_per_step:,.0f} operators per step, {s.us_per_op:.1f} us each on "
                    f"average (measured; {_threshold_words(s)})"]
    elif s.gpu_util_percent is not None and s.gpu_util_percent < low_util:
        evidence = [f"GPU busy only {s.gpu_util_percent:.0f}% of the time (measured; threshold "
                    f"{low_util:.0f}%) while the input takes "
                    f"{input_share(s):.0%} of the step"]
    else:
        return None
    if s.gpu_util_percent is not None:
        evidence.append(f"GPU busy {s.gpu_util_percent:.0f}% of the time (measured)")
    tips = (
        "a larger batch (the same operators do more work each)",
        "torch.compile (fuses operators) or CUDA graphs (one launch for the step)",
        "fused/foreach optimizers (torch.optim.AdamW(..., fused=True))",
        "fewer, larger tensors: avoid Python loops over small tensors",
    )
    return Finding("host-bound", "host/launch-bound: operators too small to keep the device busy",
                   tuple(evidence), tips)


def _compute_bound(s: WatchSummary) -> Finding:
    compute = 1.0 - input_share(s)
    evidence = [f"compute (forward, backward, optimizer, rest): {compute:.0%} of step time; "
                f"input {input_share(s):.0%} (measured)"]
    if s.us_per_op is not None:
        evidence.append(f"{s.us_per_op:,.0f} us per operator on average: well above launch "
                        f"cost ({_threshold_words(s)}; measured)")
    if s.gpu_util_percent is not None:
        evidence.append(f"GPU busy {s.gpu_util_percent:.0f}% of the time (measured)")
    tips = (
        "mixed precision (bf16 autocast) if not already on",
        "torch.compile to fuse memory-bound operators",
        "a faster device helps here: the loop keeps it busy",
    )
    return Finding("compute-bound", "compute-bound: the device is the limit", tuple(evidence),
                   tips)


def creep_finding(t: MemoryTrend) -> Finding | None:
    """The memory-creep finding of one trend, or None when it does not creep."""
    limits = watch_thresholds()
    min_bytes, min_fraction = limits.creep_min_bytes, limits.creep_min_fraction
    big = t.growth_bytes >= max(min_bytes, min_fraction * t.first_bytes)
    if not big or t.r < limits.creep_min_r:
        return None
    where = {"rss": "process RSS", "device": "device memory allocated"}[t.what]
    if t.per == "second":
        where = {"rss": "RSS of the job's processes", "device": "GPU memory used"}[t.what]
    span = f"{t.points} steps" if t.per == "step" else f"{t.points} samples"
    ahead = (f"+{format_bytes(1000 * t.slope_bytes)} per 1000 steps" if t.per == "step"
             else f"+{format_bytes(3600 * t.slope_bytes)} per hour")
    evidence = (f"{where} grew by {format_bytes(t.growth_bytes)} over {span} after warm-up "
                f"({format_bytes(t.slope_bytes)} per {t.per}, r={t.r:.2f}; thresholds "
                f"{format_bytes(min_bytes)} and {min_fraction:.0%}, r>={limits.creep_min_r}; "
                "measured)", f"at this rate: {ahead}")
    tips = (
        "accumulate losses with loss.item() or loss.detach(), not the tensor",
        "do not keep outputs, logits or graphs in lists across steps",
        "look for caches that grow (dict keyed by batch, metric objects never reset)",
    )
    return Finding("memory-creep", f"memory creep: {where} grows every {t.per}", evidence, tips)


def _stragglers(s: WatchSummary) -> Finding | None:
    spread = s.ranks
    if spread is None or not spread.stragglers:
        return None
    names = ", ".join(str(r) for r in spread.stragglers)
    by_rank = {r.rank: r for r in spread.ranks}
    evidence = [f"rank {r}: {1e3 * by_rank[r].before_sync_s_median:.1f} ms of work before the "
                f"gradient sync per step (data {1e3 * by_rank[r].data_s_median:.1f} ms), vs "
                f"{1e3 * _others(spread, r):.1f} ms on the other ranks (measured)"
                for r in spread.stragglers]
    evidence.append(f"spread of step times across ranks: {spread.step_spread:.0%} (the "
                    "all-reduce evens them out: the wait hides in backward)")
    if spread.wait_s_per_step:
        evidence.append(f"the other ranks wait about {1e3 * spread.wait_s_per_step:.1f} ms per "
                        "step for them in backward (measured)")
    tips = (
        "balance the data pipeline per rank (workers, shard sizes, sequence lengths)",
        "check that rank's host: CPU contention, slower disk or network",
    )
    return Finding("stragglers", f"straggler rank(s): {names}", tuple(evidence), tips)


def _others(spread: RankSpread, rank: int) -> float:
    return statistics.median(r.before_sync_s_median for r in spread.ranks if r.rank != rank)
