"""gpuwise watch's judgement on hand-made logs: the verdict's thresholds (input-, host-,
compute-bound, memory creep, stragglers), energy arithmetic, and a log with a cut line."""

from __future__ import annotations

import json

import pytest

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch import verdict as wv
from gpuwise.estimate.watch.energy import cumulative_series, energy_between
from gpuwise.estimate.watch.log_records import SampleRecord, StepRecord, WatchLog
from gpuwise.estimate.watch.summary import summarize
from gpuwise.estimate.watch.verdict import verdict
from gpuwise.measure.watch.log import read_log
from gpuwise.units import MIB

LIMITS = watch_thresholds()


# --------------------------------------------------------------------- hand-made logs


def steps(n: int, step_s: float = 0.1, data_s: float = 0.0, h2d_s: float = 0.0, rank: int = 0,
          ops: int | None = None, rss: list[int] | None = None, backward_s: float = 0.0,
          samples: int = 32, dispatch_us: float | None = None) -> list[StepRecord]:
    out = []
    for i in range(n):
        out.append(StepRecord(rank=rank, pid=100 + rank, index=i, t_start=1000.0 + i * step_s,
                              step_s=step_s, data_s=data_s, h2d_s=h2d_s, backward_s=backward_s,
                              samples=samples, ops=ops if i == 3 else None, counted=i == 3,
                              dispatch_us=dispatch_us if i == 3 else None,
                              rss_bytes=rss[i] if rss else None))
    return out


def judged(step_list: list[StepRecord], samples: tuple[SampleRecord, ...] = (),
           unavailable: dict | None = None) -> wv.Verdict:
    log = WatchLog({"unavailable": unavailable or {}}, tuple(step_list), samples)
    return verdict(summarize(log))


@pytest.mark.parametrize(
    "share,bound",
    [(LIMITS.input_bound_share - 0.01, "compute-bound"), (LIMITS.input_bound_share + 0.01, "input-bound")],
)
def test_input_bound_threshold(share, bound):
    assert judged(steps(20, 0.1, data_s=0.1 * share, ops=10)).bound == bound


def test_copies_count_as_input_and_change_the_advice():
    v = judged(steps(20, 0.1, data_s=0.02, h2d_s=0.05, ops=10))
    assert v.bound == "input-bound"
    assert any("pin_memory" in tip for tip in v.findings[0].suggestions)


@pytest.mark.parametrize(
    "us,bound",
    [(LIMITS.host_bound_us_per_op - 1, "host-bound"), (LIMITS.host_bound_us_per_op + 1, "compute-bound")],
)
def test_host_bound_threshold(us, bound):
    ops = 1000
    v = judged(steps(20, step_s=ops * us * 1e-6, ops=ops))
    assert v.bound == bound


@pytest.mark.parametrize("dispatch_us", [2.0, 12.0])
def test_host_bound_threshold_scales_with_the_hosts_own_dispatch_cost(dispatch_us):
    """A slow host dispatches slowly: the threshold is 4x its measured tiny-operator cost
    where that is above 25 us, and stays 25 us on a fast one."""
    limit = max(LIMITS.host_bound_us_per_op, LIMITS.host_bound_dispatch_factor * dispatch_us)
    ops = 1000
    for us, bound in ((limit - 1, "host-bound"), (limit + 1, "compute-bound")):
        v = judged(steps(20, step_s=ops * us * 1e-6, ops=ops, dispatch_us=dispatch_us))
        assert v.bound == bound, (dispatch_us, us)
        assert f"threshold {limit:.0f} us" in " ".join(v.findings[0].evidence)
    scaled = "this host's 12.0 us per tiny operator" in " ".join(v.findings[0].evidence)
    assert scaled == (dispatch_us == 12.0)


def test_low_gpu_use_without_operator_count_is_host_bound():
    busy = tuple(SampleRecord(t=1000.0 + i * 0.2, gpu_util_percent=35.0) for i in range(20))
    v = judged(steps(20, 0.2), busy)
    assert v.bound == "host-bound" and "35%" in v.findings[0].evidence[0]
    assert judged(steps(20, 0.2), ()).bound == "compute-bound"


@pytest.mark.parametrize("per_step,creep", [(31 * MIB / 15, False), (34 * MIB / 15, True)])
def test_memory_creep_threshold(per_step, creep):
    # 20 steps, the first 4 are warm-up: 15 steps of growth are judged
    rss = [int(100 * MIB + i * per_step) for i in range(20)]
    found = [f.kind for f in judged(steps(20, rss=rss)).findings]
    assert ("memory-creep" in found) == creep


def test_memory_noise_is_not_creep():
    rss = [int(200 * MIB + (50 * MIB if i % 2 else 0)) for i in range(20)]  # big but no trend
    assert "memory-creep" not in [f.kind for f in judged(steps(20, rss=rss)).findings]


def test_memory_creep_from_samples_when_steps_have_none():
    # a job without step memory (--no-inject): GPU memory used rises 2 MiB/s for 60 s
    samples = tuple(
        SampleRecord(t=1000.0 + i, gpu_mem_bytes=int(1e9 + 2 * i * MIB)) for i in range(60)
    )
    v = judged([], samples)
    creep = [f for f in v.findings if f.kind == "memory-creep"]
    assert v.bound == "no-steps" and creep and "GPU memory used" in creep[0].title
    assert "per hour" in creep[0].evidence[1]


def test_straggler_named_by_work_before_sync():
    fast = steps(20, 0.1, data_s=0.001, backward_s=0.08, rank=0)
    slow = steps(20, 0.1, data_s=0.075, backward_s=0.005, rank=1)
    v = judged(fast + slow)
    found = {f.kind: f for f in v.findings}
    assert found["stragglers"].title.endswith("1")
    summary = summarize(WatchLog({}, tuple(fast + slow), ()))
    assert summary.ranks is not None and summary.ranks.wait_s_per_step == pytest.approx(0.075)
    even = steps(20, 0.1, data_s=0.01, backward_s=0.05, rank=1)
    assert "stragglers" not in [f.kind for f in judged(fast[:0] + steps(20, 0.1, data_s=0.01,
                                backward_s=0.05) + even).findings]


def test_energy_from_counters_and_from_power():
    # 200 W for 10 s: the counter rises 2000 J; a GPU without a counter integrates power
    counted = [SampleRecord(t=1000.0 + i, gpu_energy_j=200.0 * i, cpu_energy_j=50.0 * i)
               for i in range(11)]
    series = cumulative_series(counted, "gpu")
    assert series is not None and energy_between(series, 1002.5, 1004.5) == pytest.approx(400)
    powered = [SampleRecord(t=1000.0 + i, gpu_power_w=200.0) for i in range(11)]
    series = cumulative_series(powered, "gpu")
    assert series is not None and energy_between(series, 1000, 1010) == pytest.approx(2000)
    # 20 steps of 0.1 s from t=1000 with 40% data wait, 32 samples each
    s = summarize(WatchLog({}, tuple(steps(20, 0.1, data_s=0.04)), tuple(counted)))
    e = s.energy
    assert e.job_j == pytest.approx(2500)  # GPU 2000 J + CPU 500 J
    assert e.in_steps_j == pytest.approx(500)  # 2 s at 250 W
    assert e.outside_steps_j == pytest.approx(2000)
    assert e.idle_j == pytest.approx(500 * 0.4)
    assert e.per_step_j == pytest.approx(25)
    assert e.per_1000_samples_j == pytest.approx(1000 * 500 / (20 * 32))
    assert sum(e.per_phase_j.values()) == pytest.approx(500)


def test_energy_missing_says_why():
    s = summarize(WatchLog({"unavailable": {"gpu": "no NVIDIA driver",
                                            "cpu_energy": "no permission"}},
                           tuple(steps(5)), (SampleRecord(t=1000.0),)))
    assert s.energy.job_j is None
    assert s.energy.missing == {"gpu": "no NVIDIA driver", "cpu": "no permission"}


def test_no_steps_verdict():
    assert judged([]).bound == "no-steps"


def test_log_with_a_cut_line_is_read(tmp_path):
    log = tmp_path / "cut.jsonl"
    good = {"kind": "step", "rank": 0, "pid": 1, "step": 0, "t_start": 1.0, "step_s": 0.1}
    log.write_text(json.dumps(good) + "\n" + json.dumps(good)[:25])
    assert len(read_log([log]).steps) == 1
