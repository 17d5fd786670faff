"""Did the machine hold still while it was probed: the headline rates measured again at the
end, the warning note, and what `--on local` estimates then say about their rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest
from test_probe import TINY_PLAN

from gpuwise.catalog.hardware import Hardware
from gpuwise.measure.probe import Backend, NullBackend, probe_with, rates_source
from gpuwise.measure.probe.machine import _with_steadiness
from gpuwise.measure.probe.steadiness import (
    figures_now,
    probe_figures,
    steadiness,
    steadiness_note,
)

# One 1024^3 matmul (the one the check repeats), on the tiny plan's small arrays.
PLAN = replace(TINY_PLAN, matmul_shapes=((1024, 1024, 1024),), matmul_max_call_s=1.0)


class _Slowing(Backend):
    """A pure-Python machine whose fp32 matmul takes `slow` times longer once slowed."""

    name = "slowing"

    def __init__(self) -> None:
        super().__init__()
        self.slow = 1.0

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32",)

    def stream_ops(self, n: int) -> dict[str, Callable[[], object]]:
        data = [1.0] * 20_000
        return {"read": lambda: sum(data), "copy": lambda: list(data), "triad": lambda: sum(data)}

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Callable[[], object]:
        return lambda: time.sleep(1e-2 * self.slow)  # long enough that sleep jitter is small

    def tiny_ops(self) -> dict[str, Callable[[], object]]:
        return {"add": lambda: None}


def test_a_machine_that_slowed_down_during_the_probe_is_named() -> None:
    backend = _Slowing()
    profile = probe_with(backend, PLAN, fingerprint="x")
    at_probe = probe_figures(profile)
    assert set(at_probe) == {"read", "matmul_fp32"}
    backend.slow = 5.0
    ratios = steadiness(at_probe, figures_now(backend, profile, at_probe))
    # 1/5 on a quiet host; a busy one wakes each sleep late by the same few ms, which
    # lifts the ratio (10 ms late: 0.33), never to 1
    assert 0.15 < ratios["matmul_fp32"] < 0.6, ratios
    (note,) = steadiness_note(ratios)
    assert f"matmul fp32 x{ratios['matmul_fp32']:.2f}" in note and "probe again" in note


def test_a_machine_that_held_still_gives_no_note() -> None:
    assert steadiness_note({"read": 0.95, "matmul_fp32": 1.08}) == ()
    assert steadiness({"read": 10.0, "matmul_bf16": 0.0}, {"read": 9.0, "matmul_bf16": 5.0}) == {
        "read": 0.9
    }  # a rate the probe did not have is no ratio


def test_nothing_to_measure_again_is_missing_with_a_reason() -> None:
    profile = probe_with(NullBackend(), PLAN, fingerprint="n")
    assert probe_figures(profile) == {}
    checked = _with_steadiness(profile)
    assert checked.steadiness is None and "no headline rate" in checked.missing["steadiness"]


def test_local_estimates_say_their_profile_was_unsteady(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = replace(probe_with(_Slowing(), PLAN, fingerprint="x"),
                      steadiness={"read": 0.98, "matmul_bf16": 0.6})
    monkeypatch.setattr("gpuwise.measure.probe.store.load_profile", lambda: profile)
    monkeypatch.setattr(rates_source, "profile_rates", lambda p, hw: "rates")
    hw = Hardware("local", "This CPU", "cpu", "x", 2**30, 10.0, source="detected")
    rates, said = rates_source.rates_for(hw)
    assert rates == "rates" and "changed speed by 40% while it was probed" in said
    steady = replace(profile, steadiness={"read": 1.02}, notes=())  # no note of a busy machine
    monkeypatch.setattr("gpuwise.measure.probe.store.load_profile", lambda: steady)
    assert rates_source.rates_for(hw)[1] == "measured by `gpuwise probe` on this machine"


def test_validate_says_when_the_machine_moved_since_its_probe() -> None:
    from gpuwise.report.validate_view import _drift_note

    assert _drift_note({}) == ""
    held = _drift_note({"read": 0.97, "matmul_fp32": 1.04})
    assert "read x0.97, matmul fp32 x1.04" in held and "moved by more than" not in held
    moved = _drift_note({"read": 0.97, "matmul_bf16": 0.31})
    assert "matmul bf16 x0.31" in moved and "more than 10% since it was probed" in moved
