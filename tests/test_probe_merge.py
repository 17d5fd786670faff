"""`gpuwise probe --repeat N`: several probes made into one profile, each reading the median
of its readings, matched by what it measures (shape, dtype, kind), not by position."""

from __future__ import annotations

from dataclasses import replace

from test_steadiness import PLAN, _Slowing

from gpuwise.cli import main
from gpuwise.measure.probe import BandwidthReading, MatmulPoint, Profile, probe_with
from gpuwise.measure.probe.merge import keep_full_parts, median_profile, probe_spread


def _profile(speed: float, skip_big: bool = False) -> Profile:
    """A profile of a machine running at `speed` (1.0, 2.0, ...): every rate x speed."""
    base = probe_with(_Slowing(), PLAN, fingerprint="x")
    shapes = [(64, 64, 64)] + ([] if skip_big else [(1024, 1024, 1024)])
    points = tuple(MatmulPoint(m, n, k, "fp32", 1.0 / speed, 1.1 / speed, 2 * m * n * k * speed,
                               int(10 * speed)) for m, n, k in shapes)
    return replace(
        base,
        bandwidth=(BandwidthReading("read", 10.0 * speed, 2**26, 2**26, 0.1 / speed),),
        matmul_points=points,
        matmul_best={"fp32": points[-1]},
        runtime={"decode_op_s": 1e-5 / speed, "gemv": {"fp32": [[1e6, 1e10 * speed]]}},
        kernels={"linear": {"fp32": {"forward": [[1, 512, 512, 1e-4 / speed]]
                                     + ([] if skip_big else [[1024, 512, 512, 1e-2 / speed]])}},
                 "elementwise": {"fp32": {"cat": 1e10 * speed}},
                 "conv": {"fp32": {"backward:7x7/s2": [[100, 147, 64, 1, 1e-3 / speed]]}}},
        steadiness={"read": speed / 2},
        notes=(f"note {speed}",),
        created_at=f"t{speed}",
    )


def test_each_reading_is_the_median_of_its_readings() -> None:
    merged = median_profile([_profile(1.0), _profile(3.0), _profile(2.0)])
    assert merged.bandwidth_gbs("read") == 20.0
    assert merged.runtime["decode_op_s"] == 1e-5 / 2
    assert merged.runtime["gemv"]["fp32"] == [[1e6, 2e10]]
    assert merged.kernels["linear"]["fp32"]["forward"] == [[1, 512, 512, 1e-4 / 2],
                                                          [1024, 512, 512, 1e-2 / 2]]
    assert merged.kernels["elementwise"]["fp32"]["cat"] == 2e10
    # a convolution's GEMM count is part of what the point is, its seconds the reading
    assert merged.kernels["conv"]["fp32"]["backward:7x7/s2"] == [[100, 147, 64, 1, 1e-3 / 2]]
    assert merged.steadiness == {"read": 1.0}
    assert merged.created_at == "t2.0"  # the last probe's
    assert merged.matmul_best["fp32"].m == 1024
    assert merged.matmul_best["fp32"].flops_per_s == 2 * 1024**3 * 2.0
    assert {"note 1.0", "note 3.0", "note 2.0"} <= set(merged.notes)
    assert "the median of 3 probes" in merged.notes[-1] and "up to 200%" in merged.notes[-1]
    assert Profile.from_json(merged.to_json()) == merged


def test_a_reading_only_some_probes_have_is_the_median_of_those() -> None:
    merged = median_profile([_profile(1.0, skip_big=True), _profile(2.0), _profile(4.0)])
    big = [p for p in merged.matmul_points if p.m == 1024]
    assert len(merged.matmul_points) == 2 and big[0].flops_per_s == 2 * 1024**3 * 3.0
    assert merged.kernels["linear"]["fp32"]["forward"][1] == [1024, 512, 512, 1e-2 * 0.375]


def test_one_probe_is_itself_and_a_steady_machine_has_no_spread() -> None:
    one = _profile(1.0)
    assert median_profile([one]) is one
    assert probe_spread([one, _profile(1.0)]) == 0.0
    assert probe_spread([_profile(1.0), _profile(1.5)]) == 0.5


def test_repeat_out_of_range_is_one_line_and_exit_2(capsys) -> None:
    try:
        main(["probe", "--repeat", "0"])
    except SystemExit as exc:
        assert exc.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --repeat 0") and "hint:" in err


def _quick(speed: float) -> Profile:
    """A quick probe's profile: headline rates only, kernels and runtime missing."""
    missing = {"kernels": "quick probe", "runtime": "quick probe"}
    return replace(_profile(speed), quick=True, kernels=None, runtime=None, missing=missing)


def test_a_quick_probe_keeps_the_full_probes_kernels_and_runtime() -> None:
    full = replace(_profile(1.0), missing={"kernels.sdpa": "no bf16 here", "h2d": "CPU"})
    kept = keep_full_parts(_quick(2.0), full)
    assert kept.bandwidth_gbs("read") == 20.0  # the quick probe's own headline rates
    assert kept.kernels == full.kernels and kept.runtime == full.runtime
    assert kept.missing == {"kernels.sdpa": "no bf16 here"}
    assert any("kept from the full probe of t1.0" in n for n in kept.notes)


def test_a_quick_probe_keeps_nothing_from_another_machine_or_quick_probe() -> None:
    quick = _quick(2.0)
    assert keep_full_parts(quick, None) is quick
    assert keep_full_parts(quick, replace(_profile(1.0), fingerprint="other")) is quick
    assert keep_full_parts(quick, _quick(1.0)) is quick
    full = _profile(2.0)
    assert keep_full_parts(full, _profile(1.0)) is full  # a full probe replaces everything


def test_probe_quick_saves_over_a_full_profile_without_losing_its_kernels(
    tmp_path, monkeypatch, capsys
) -> None:
    from gpuwise.app import probe as probe_command
    from gpuwise.measure.probe.store import load_profile, save_profile

    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    full = _profile(1.0)
    save_profile(full)
    monkeypatch.setattr(probe_command, "probe_machine", lambda quick, progress=None: _quick(2.0))
    main(["probe", "--quick", "--json"])
    saved = load_profile(full.backend, full.fingerprint)
    assert saved is not None and saved.kernels == full.kernels and saved.quick
    assert saved.bandwidth_gbs("read") == 20.0
    assert "kept from the full probe" in capsys.readouterr().out


def test_a_second_quick_probe_keeps_what_the_first_kept() -> None:
    first = keep_full_parts(_quick(2.0), _profile(1.0))
    second = keep_full_parts(replace(_quick(3.0), created_at="t3.0"), first)
    assert second.kernels == first.kernels and second.runtime == first.runtime
    assert [n for n in second.notes if "kept from the full probe of t1.0" in n]


def test_the_first_touch_note_is_the_merged_readings_not_one_per_probe() -> None:
    from gpuwise.measure.probe.kernels import first_touch_note

    def slow_touch(speed: float) -> Profile:
        p = _profile(speed)
        fresh = {"bytes_per_s": 5e9, "by_held": [[0, 5e9], [2**30, 0.7e9 * speed]]}
        return replace(p, kernels={**p.kernels, "fresh": fresh},
                       notes=(*p.notes, *first_touch_note(fresh)))

    merged = median_profile([slow_touch(1.0), slow_touch(1.05), slow_touch(1.1)])
    touch = [n for n in merged.notes if n.startswith("fresh memory")]
    assert len(touch) == 1 and "0.73 GB/s with 1 GiB in use" in touch[0]  # the median's


def test_the_steadiness_note_is_one_for_the_merged_probes() -> None:
    from gpuwise.measure.probe.steadiness import steadiness_note

    def moved(speed: float, read: float) -> Profile:
        p = _profile(speed)
        return replace(p, steadiness={"read": read}, notes=(*p.notes, *steadiness_note({"read": read})))

    merged = median_profile([moved(1.0, 0.58), moved(1.05, 1.02), moved(1.1, 1.38)])
    steady = [n for n in merged.notes if "changed speed" in n]
    assert len(steady) == 1
    assert steady[0].startswith("2 of the 3 probes changed speed") and "read x0.58" in steady[0]
    calm = median_profile([moved(1.0, 1.01), moved(1.05, 0.99)])
    assert not [n for n in calm.notes if "changed speed" in n]
