"""`gpuwise repro`'s statistics: the F and beta distributions against closed forms and
printed tables, spreads, variance-ratio intervals and run counts by hand, the analysis's
findings from synthetic runs, and the terminal view of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwise.estimate.repro.analysis import ConditionRuns, analyze
from gpuwise.estimate.repro.distributions import beta_cdf, f_cdf, f_quantile
from gpuwise.estimate.repro.stats import (
    all_identical,
    arithmetic_share,
    detectable_difference,
    first_divergence,
    runs_needed,
    spread,
    variance_ratio_interval,
)
from gpuwise.measure.repro.runner import Study

# --- distributions: closed forms and printed F tables ---------------------------------------


@pytest.mark.parametrize(("x", "a", "b", "expected"), [
    (0.3, 2.5, 1.0, 0.3**2.5),            # I_x(a, 1) = x^a
    (0.3, 1.0, 4.0, 1 - 0.7**4),          # I_x(1, b) = 1 - (1 - x)^b
    (0.5, 7.0, 7.0, 0.5),                 # symmetry
    (0.9, 0.5, 0.5, 2 / math.pi * math.asin(math.sqrt(0.9))),  # arcsine distribution
])
def test_beta_cdf_closed_forms(x: float, a: float, b: float, expected: float) -> None:
    assert beta_cdf(x, a, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("p", "d1", "d2", "table"), [
    (0.95, 5, 10, 3.3258),   # F tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.3)
    (0.975, 4, 4, 9.6045),
    (0.99, 10, 20, 3.3682),
    (0.975, 4, 10, 4.4683),
    (0.975, 10, 4, 8.8439),
    (0.95, 1, 10, 2.228139**2),  # F(1, v) = t(v)^2; t_{0.975}(10) = 2.228139
])
def test_f_quantile_matches_tables(p: float, d1: int, d2: int, table: float) -> None:
    assert f_quantile(p, d1, d2) == pytest.approx(table, abs=6e-5)


def test_f_quantile_exact_case_and_reciprocal() -> None:
    # F(2, 2) has CDF f / (1 + f): its 0.975 quantile is exactly 39.
    assert f_quantile(0.975, 2, 2) == pytest.approx(39.0, rel=1e-10)
    assert f_quantile(0.025, 4, 7) == pytest.approx(1 / f_quantile(0.975, 7, 4), rel=1e-9)


@given(st.floats(0.01, 0.99), st.integers(1, 60), st.integers(1, 60))
def test_f_cdf_inverts_f_quantile(p: float, d1: int, d2: int) -> None:
    assert f_cdf(f_quantile(p, d1, d2), d1, d2) == pytest.approx(p, abs=1e-9)


# --- statistics against hand-computed values --------------------------------------------------


def test_spread_by_hand() -> None:
    s = spread([1.0, 2.0, 3.0, 4.0])
    assert (s.n, s.mean, s.min, s.max, s.range) == (4, 2.5, 1.0, 4.0, 3.0)
    assert s.sd == pytest.approx(math.sqrt(5 / 3))  # squares 2.25+0.25+0.25+2.25 over 3
    assert spread([0.1, 0.1, 0.1]).sd == 0.0  # exactly, not a rounding residue
    assert spread([5.0]).sd is None


def test_arithmetic_share_by_hand() -> None:
    share = arithmetic_share([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])  # variances 1 and 4
    assert share.ratio == pytest.approx(0.25)
    # n = 3 and 3: F_{0.975}(2, 2) = 39, so the interval is [0.25/39, 0.25*39].
    assert share.low == pytest.approx(0.25 / 39, rel=1e-9)
    assert share.high == pytest.approx(0.25 * 39, rel=1e-9)
    zero = arithmetic_share([1.0, 1.0], [1.0, 2.0])
    assert zero.exactly_zero and (zero.low, zero.high) == (0.0, 0.0)
    undefined = arithmetic_share([1.0, 2.0], [3.0, 3.0])
    assert undefined.ratio is None and "no spread" in undefined.note
    assert arithmetic_share([1.0], [1.0, 2.0]).ratio is None


def test_variance_ratio_interval_by_hand() -> None:
    low, high = variance_ratio_interval(2.0, 5, 11)  # F_{.975}(4,10)=4.4683, (10,4)=8.8439
    assert low == pytest.approx(2.0 / 4.4683, rel=1e-4)
    assert high == pytest.approx(2.0 * 8.8439, rel=1e-4)


@pytest.mark.parametrize(("sd", "diff", "alpha", "power", "runs"), [
    (1.0, 1.0, 0.05, 0.8, 16),   # 2 (1.959964 + 0.841621)^2 = 15.70
    (0.5, 1.0, 0.05, 0.8, 4),    # 3.92
    (2.0, 1.0, 0.05, 0.8, 63),   # 62.79
    (1.0, 1.0, 0.01, 0.9, 30),   # 2 (2.575829 + 1.281552)^2 = 29.76
    (0.0, 1.0, 0.05, 0.8, 2),    # no spread: two runs, the least that shows a spread
])
def test_runs_needed_by_hand(sd: float, diff: float, alpha: float, power: float, runs: int) -> None:
    assert runs_needed(sd, diff, alpha, power) == runs


def test_detectable_difference_by_hand() -> None:
    assert detectable_difference(1.0, 16) == pytest.approx(2.801585 * math.sqrt(2 / 16), rel=1e-6)
    with pytest.raises(ValueError):
        runs_needed(1.0, 0.0)


def test_identity_and_divergence() -> None:
    assert all_identical(["a", "a"]) is True
    assert all_identical(["a", "b"]) is False
    assert all_identical(["a", None]) is None and all_identical(["a"]) is None
    assert first_divergence([[1, 2, 3], [1, 2, 4]]) == 2
    assert first_divergence([[1, 2], [1, 2, 3]]) == 2  # one run stopped early
    assert first_divergence([[1, 2], [1, 2]]) is None


# --- the analysis: findings from synthetic runs ---------------------------------------------


def _runs(name: str, values: list[float], hashes: list[str | None] | None = None,
          steps: list[list[tuple[int, str]]] | None = None,
          applied: list[bool | None] | None = None) -> ConditionRuns:
    n = len(values)
    return ConditionRuns(name, {"loss": values}, hashes or [None] * n, steps or [[]] * n,
                         [1.0] * n, [None] * n, applied or [None] * n)


def test_seed_ignored_is_found() -> None:
    a = analyze([_runs("seeds", [0.5, 0.5, 0.5], ["h", "h", "h"]), _runs("same-seed", [0.5, 0.5])])
    assert [f.code for f in a.findings] == ["seed-ignored"]
    assert a.shares["loss"]["same-seed"].exactly_zero


def test_unseeded_randomness_is_found_only_where_arithmetic_is_deterministic() -> None:
    runs = [_runs("same-seed", [0.5, 0.6], ["a", "b"]), _runs("seeds", [0.4, 0.6])]
    assert [f.code for f in analyze(runs, ["same-seed"]).findings] == ["unseeded-randomness"]
    assert analyze(runs, []).findings == []  # on a GPU, same-seed runs may differ


def test_divergent_step_cost_and_detect() -> None:
    steps = [[(0, "a"), (10, "b"), (20, "c")], [(0, "a"), (10, "x"), (20, "y")]]
    same = _runs("same-seed", [1.0, 1.0], steps=steps)
    det = ConditionRuns("deterministic", {"loss": [1.0, 1.0]}, [None, None], [[], []],
                        [3.0, 3.0], [None, None], [False, True])
    seeds = _runs("seeds", [1.0, 3.0])  # sd = sqrt(2)
    a = analyze([same, det, seeds], detect_diff={"*": 0.1}, detect_relative=True)
    assert a.conditions["same-seed"].first_divergent_step == 10
    assert a.deterministic_time_ratio == pytest.approx(3.0)
    assert "deterministic-not-applied" in [f.code for f in a.findings]
    (d,) = a.detect
    assert (d.sd_from, d.diff) == ("seeds", pytest.approx(0.2))  # 10% of the mean 2.0
    assert d.runs_needed == math.ceil(2 * 2.801585**2 * 2 / 0.2**2)


def test_terminal_view_says_what_is_measured_and_what_is_not(tmp_path: Path) -> None:
    from rich.console import Console

    from gpuwise.report.repro_view import format_study

    runs = [_runs("same-seed", [1.0, 1.0], ["a", "a"]), _runs("threads", [1.0, 1.5]),
            _runs("seeds", [1.0, 3.0], ["b", "c"])]
    a = analyze(runs, ["same-seed"], {"*": 0.5})
    study = Study(("python", "t.py"), ("same-seed", "threads", "seeds"), 2, tmp_path / "r")
    console = Console(record=True, width=200)
    console.print(format_study(a, study, ["NA: no RAPL counters"]))
    text = console.export_text()
    assert "yes (parameters)" in text and "0 (exactly)" in text
    assert "0.0625" in text  # threads: variance 0.125 over the seeds' 2
    assert "runs needed per setting" in text and "(estimated" in text and "(measured)" in text
    assert "NA: no RAPL counters" in text and "NA: the runs hashed no steps" in text


# --- hardware as a source of variance ---------------------------------------------------------


def test_group_share_by_hand() -> None:
    from gpuwise.estimate.repro.stats import group_share

    # means 2 and 6 around 4: MSB = 16, MSW = 2, F(1, 2) = 8, whose cdf is sqrt(f / (f + 2));
    # n0 = 2, so the between component is (16 - 2) / 2 = 7 and its share 7 / 9.
    g = group_share([1.0, 3.0, 5.0, 7.0], ["a", "a", "b", "b"])
    assert g.runs == {"a": 2, "b": 2} and g.means == {"a": 2.0, "b": 6.0}
    assert g.f == pytest.approx(8.0) and g.within == pytest.approx(2.0)
    assert g.p == pytest.approx(1 - math.sqrt(0.8)) and g.share == pytest.approx(7 / 9)
    # unbalanced: n0 = (N - Σn²/N) / (k - 1); a between component below zero is 0
    u = group_share([1.0, 2.0, 3.0, 2.0, 2.5], ["a", "a", "a", "b", "b"])
    assert u.between == 0.0 and u.share == 0.0 and u.p is not None and u.p > 0.5
    same = group_share([0.5, 0.5, 0.7, 0.7], ["x", "x", "y", "y"])
    assert (same.share, same.p, same.f) == (1.0, 0.0, math.inf)  # identical within, not between
    assert group_share([0.5] * 4, ["x", "x", "y", "y"]).share == 0.0
    assert group_share([1.0, 2.0], ["x", "y"]).share is None  # no spread within a group
    assert group_share([1.0, 2.0], ["x", "x"]).note == "one group"


def _placed(name: str, values: list[float], hardware: list[str | None]) -> ConditionRuns:
    n = len(values)
    return ConditionRuns(name, {"loss": values}, [None] * n, [[] for _ in values], [1.0] * n,
                         [None] * n, hardware={"loss": hardware})


def test_hardware_is_a_source_only_when_more_than_one_kind_ran() -> None:
    seeds = [0.50, 0.52, 0.49, 0.51]
    one = analyze([_placed("same-seed", [0.5] * 4, ["H100"] * 4),
                   _placed("seeds", seeds, ["H100"] * 4)])
    bare = analyze([_placed("same-seed", [0.5] * 4, []), _placed("seeds", seeds, [])])
    assert one.hardware == [] and one == bare  # one kind: the analysis of a single machine
    two = analyze([_placed("same-seed", [0.5, 0.5, 0.6, 0.6], ["H100", "H100", "A100", "A100"]),
                   _placed("seeds", seeds, ["H100", "H100", "A100", None])])
    by = {(h.condition, h.metric): h.groups for h in two.hardware}
    assert by[("same-seed", "loss")].share == 1.0
    assert by[("seeds", "loss")].runs == {"A100": 1, "H100": 2}  # unknown hardware left out
    assert [f.code for f in two.findings] == ["hardware-differs"]
