"""The numbers behind each current finding, as the exporter serves them: each the summary's
value that the finding's rule in verdict.py read, with its threshold. Pure."""

from __future__ import annotations

import statistics

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch.metric_families import label_value
from gpuwise.estimate.watch.summary import WatchSummary
from gpuwise.estimate.watch.verdict import (
    Verdict,
    creep_finding,
    host_bound_threshold_us,
    input_share,
)


def evidence(s: WatchSummary, v: Verdict) -> list[tuple[str, str, float, float | None]]:
    """(finding, measure, value, threshold or None) for each current finding: the numbers of
    the summary its rule read (verdict.py), each measure named with its unit."""
    t = watch_thresholds()
    out: list[tuple[str, str, float, float | None]] = []
    ops = s.us_per_op is not None and bool(s.ops_per_step)
    for finding in v.findings:
        kind = label_value(finding.kind)
        if finding.kind == "input-bound":
            out += [(kind, "input_share_ratio", input_share(s), t.input_bound_share),
                    (kind, "data_share_ratio", s.phase_share.get("data", 0.0), None),
                    (kind, "h2d_share_ratio", s.phase_share.get("h2d", 0.0), None)]
        elif finding.kind in ("host-bound", "compute-bound"):
            if finding.kind == "compute-bound":
                out.append((kind, "compute_share_ratio", 1.0 - input_share(s), None))
            if ops:
                out += [(kind, "operator_seconds", (s.us_per_op or 0.0) / 1e6,
                         host_bound_threshold_us(s) / 1e6),
                        (kind, "operators_per_step", s.ops_per_step or 0.0, None)]
            elif s.gpu_util_percent is not None:
                out.append((kind, "gpu_utilization_ratio", s.gpu_util_percent / 100,
                            t.low_gpu_util_percent / 100))
    for trend in s.memory:
        if creep_finding(trend) is not None:
            least = max(t.creep_min_bytes, t.creep_min_fraction * trend.first_bytes)
            out += [("memory_creep", f"{trend.what}_growth_bytes", trend.growth_bytes, least),
                    ("memory_creep", f"{trend.what}_growth_correlation", trend.r,
                     t.creep_min_r)]
    spread = s.ranks
    if spread is not None and spread.stragglers:
        slow = max((r for r in spread.ranks if r.rank in spread.stragglers),
                   key=lambda r: r.before_sync_s_median)
        typical = statistics.median(r.before_sync_s_median for r in spread.ranks
                                    if r.rank != slow.rank)
        limit = max(t.straggler_ratio * typical, typical + t.straggler_min_s)
        out += [("stragglers", "before_sync_seconds", slow.before_sync_s_median, limit),
                ("stragglers", "others_before_sync_seconds", typical, None),
                ("stragglers", "wait_seconds_per_step", spread.wait_s_per_step or 0.0, None)]
    return out
