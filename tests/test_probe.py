"""The probe: null and faulty backends, a tiny real CPU probe, JSON and the profile store.

Real probes here use tiny plans (arrays of a few MiB, matmuls up to 512), so they measure
caches, not DRAM: they check the plumbing and sanity, not the numbers (docs/speed.md has those).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.measure import probe
from gpuwise.measure.probe import (
    Backend,
    NullBackend,
    ProbePlan,
    Profile,
    Unsupported,
    backends,
    measurements,
    probe_with,
    run_probe,
)
from gpuwise.measure.probe.store import cache_dir, load_profile, profile_path, save_profile

TINY_PLAN = ProbePlan(
    array_bytes=4 * 2**20,
    stream_repeats=5,
    matmul_shapes=((16, 16, 16), (128, 128, 128), (512, 512, 512)),
    matmul_target_s=0.01,
    matmul_max_call_s=0.2,
    matmul_dtype_budget_s=0.5,
    matmul_repeats=(3, 20),
    overhead_samples=20,
    link_bytes=2**20,
    link_repeats=3,
)
# A busy core makes every multithreaded op wait for the scheduler (milliseconds): the real CPU
# probe gets room enough to reach 512^3 even then.
CPU_PLAN = replace(TINY_PLAN, matmul_max_call_s=2.0, matmul_dtype_budget_s=3.0)
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_NUMPY = importlib.util.find_spec("numpy") is not None


def _all_readings_none(profile: Profile) -> None:
    assert all(r.gbs is None for r in profile.bandwidth)
    assert [r.kind for r in profile.bandwidth] == ["read", "copy", "triad"]
    assert profile.links == () and profile.matmul_points == ()
    assert profile.matmul_best and all(v is None for v in profile.matmul_best.values())
    assert profile.overhead_s == {"add": None, "matmul_1x1": None}
    assert profile.threads is None
    for key in ("bandwidth.read", "bandwidth.copy", "bandwidth.triad", "matmul.fp32",
                "matmul.bf16", "overhead.add", "overhead.matmul_1x1", "links", "threads"):
        assert profile.missing[key], key


def test_null_backend_gives_none_with_reasons() -> None:
    profile = probe_with(NullBackend(), TINY_PLAN, fingerprint="test machine")
    _all_readings_none(profile)
    assert "null backend" in profile.missing["bandwidth.triad"]
    assert profile.backend == "null" and profile.fingerprint == "test machine"


def test_run_probe_null_and_unknown_backend() -> None:
    fractions: list[float] = []
    profile = run_probe(quick=True, progress=lambda _, f: fractions.append(f), backend="null")
    _all_readings_none(profile)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    with pytest.raises(GpuwiseError):
        run_probe(quick=True, backend="tpu")


def test_quick_plan_is_bigger_than_the_cache() -> None:
    plan = ProbePlan.for_mode(quick=True, cache_bytes=32 * 2**20)
    assert plan.array_bytes >= 4 * 32 * 2**20 and plan.stream_repeats >= 5
    flops = [2 * m * n * k for m, n, k in plan.matmul_shapes]
    assert flops == sorted(flops) and min(plan.matmul_shapes)[0] == 1  # decode-shaped included
    assert backends._size_bytes("32768K") == 32 * 2**20 and backends._size_bytes("2 MiB") == 2 * 2**20


class _Faulty(Backend):
    """Works for some readings and raises in the middle of others."""

    name = "faulty"

    def threads(self) -> int | None:
        return 1

    def spec(self) -> None:
        return None

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32", "bf16")

    def stream_ops(self, n: int) -> dict[str, Callable[[], object]]:
        data = [1.0] * 1000

        def triad() -> object:
            raise RuntimeError("triad exploded")

        return {"read": lambda: sum(data), "copy": lambda: list(data), "triad": triad}

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Callable[[], object]:
        if dtype == "bf16":
            raise RuntimeError("no bf16 kernel")
        if m >= 512:
            raise MemoryError("out of memory at 512")
        return lambda: None  # instant: no size is skipped for time on a busy machine

    def tiny_ops(self) -> dict[str, Callable[[], object]]:
        return {"add": lambda: None, "matmul_1x1": lambda: 1 / 0}

    def link_ops(self, nbytes: int) -> dict[str, Callable[[], object]]:
        raise RuntimeError("driver went away")


def test_backend_raising_mid_measurement_gives_none_with_reason() -> None:
    def progress(label: str, fraction: float) -> None:
        raise ValueError("a broken progress bar must not stop the probe")

    profile = probe_with(_Faulty(), CPU_PLAN, progress, fingerprint="x")
    assert profile.bandwidth_gbs("read") and profile.bandwidth_gbs("copy")
    assert profile.bandwidth_gbs("triad") is None
    assert "triad exploded" in profile.missing["bandwidth.triad"]
    assert [p.m for p in profile.matmul_points] == [16, 128]
    assert "MemoryError" in profile.missing["matmul.fp32.512x512x512"]
    assert profile.matmul_best["bf16"] is None and "no bf16" in profile.missing["matmul.bf16"]
    assert profile.overhead_s["add"] and profile.overhead_s["matmul_1x1"] is None
    assert "ZeroDivisionError" in profile.missing["overhead.matmul_1x1"]
    assert profile.links == () and "driver went away" in profile.missing["links"]


class _Fp32Only(probe.TorchBackend):
    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32",)  # fp16 matmul on a CPU takes seconds at 512^3


class _FakeGpu(Backend):
    """A GPU-shaped backend in pure Python: exercises the link path without a GPU."""

    name = "fake-gpu"

    def spec(self) -> Hardware:
        return Hardware("fake", "Fake GPU", "gpu", "x", 2**30, 1000.0, host_link_gbs=64.0)

    def link_ops(self, nbytes: int) -> dict[str, Callable[[], object]]:
        return {"h2d": lambda: time.sleep(1e-3), "d2h": lambda: time.sleep(1e-3)}


def test_links_and_fraction_of_spec() -> None:
    profile = probe_with(_FakeGpu(), TINY_PLAN, fingerprint="g")
    assert [r.kind for r in profile.links] == ["h2d", "d2h"]
    h2d = profile.links[0]
    assert h2d.gbs and h2d.fraction_of_spec == pytest.approx(h2d.gbs / 64.0)
    assert h2d.gbs < 2**20 / 1e-3 / 1e9  # a 1 MiB copy that takes at least 1 ms
    assert "one GPU" in profile.missing["link.d2d"] and profile.spec_id == "fake"


@pytest.fixture(scope="module")
def cpu_profile() -> Profile:
    if not HAS_TORCH:
        pytest.skip("torch not installed")
    backend = _Fp32Only()
    try:
        return probe_with(backend, CPU_PLAN)
    finally:
        backend.close()


@pytest.mark.torch
def test_cpu_probe_is_sane(cpu_profile: Profile) -> None:
    assert cpu_profile.backend == "torch-cpu" and (cpu_profile.threads or 0) >= 1
    for kind in ("read", "copy", "triad"):
        assert (cpu_profile.bandwidth_gbs(kind) or 0) > 0, cpu_profile.missing
    assert 1 < (cpu_profile.bandwidth_gbs("triad") or 0) < 1000
    fp32 = {p.m: p for p in cpu_profile.matmul_points if p.dtype == "fp32"}
    assert fp32[512].flops_per_s > fp32[16].flops_per_s  # fixed costs dominate tiny matmuls
    assert cpu_profile.matmul_best["fp32"] is not None
    assert 0 < (cpu_profile.overhead_s["add"] or 0) < 1e-3
    assert "links" in cpu_profile.missing  # no GPU: no host-device link


@pytest.mark.torch
def test_profile_round_trips_through_json_and_store(
    cpu_profile: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Profile.from_json(cpu_profile.to_json()) == cpu_profile
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    assert load_profile() is None
    path = save_profile(cpu_profile)
    assert path.parent == tmp_path and path == profile_path(cpu_profile.fingerprint, "torch-cpu")
    assert load_profile() == cpu_profile  # this machine, preferred backend
    assert load_profile(backend="numpy-cpu") is None
    assert load_profile(fingerprint="another machine") is None
    path.write_text("{not json")
    assert load_profile() is None


def test_store_keeps_null_profiles_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    profile = probe_with(NullBackend(), TINY_PLAN, fingerprint="m")
    save_profile(profile)
    assert load_profile(fingerprint="m") is None  # not a usable backend
    assert load_profile(backend="null", fingerprint="m") == profile
    monkeypatch.delenv("GPUWISE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gpuwise"


@pytest.mark.skipif(not HAS_NUMPY, reason="numpy not installed")
def test_numpy_backend() -> None:
    profile = probe_with(probe.NumpyBackend(), TINY_PLAN, fingerprint="m")
    assert (profile.bandwidth_gbs("triad") or 0) > 0 and profile.matmul_best["fp32"]
    assert "numpy has no bf16" in profile.missing["matmul.bf16"]
    assert profile.threads == 1 and any("one thread" in n for n in profile.notes)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_missing_cuda_gives_reasons_not_errors() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    profile = run_probe(quick=True, backend="torch-cuda")
    _all_readings_none(profile)
    assert "no CUDA device" in profile.missing["bandwidth.triad"]


@pytest.mark.gpu
def test_cuda_quick_probe() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    profile = run_probe(quick=True, backend="torch-cuda")
    assert (profile.bandwidth_gbs("triad") or 0) > 50
    assert (profile.bandwidth_gbs("h2d") or 0) > 1 and (profile.bandwidth_gbs("d2h") or 0) > 1
    assert (profile.best_flops_per_s("bf16") or 0) > 1e12


def test_import_does_not_load_torch_or_numpy(heavy_imports) -> None:
    assert heavy_imports("import gpuwise.measure.probe, gpuwise.measure.probe.store") == []


def test_unsupported_is_a_reason() -> None:
    missing: dict[str, str] = {}
    assert measurements.attempt(missing, "x", lambda: (_ for _ in ()).throw(Unsupported("why"))) is None
    assert missing == {"x": "why"}


@pytest.mark.torch
def test_decode_caches_are_read_cold_and_grown_in_place_of_the_old() -> None:
    torch = pytest.importorskip("torch")
    from gpuwise.measure.probe.kernel_plan import KernelPlan
    from gpuwise.measure.probe.kernel_timer import Cycle
    from gpuwise.measure.probe.kernels_elementwise import ElementwiseKernels

    plan = KernelPlan(cold_set_bytes=8 * 2**20)
    kernels = ElementwiseKernels(torch, torch.device("cpu"), plan, None)
    keys = torch.zeros(16, 256, 64)  # 1 MiB
    copies = kernels.cold_copies(keys)
    assert len(copies) == 8 and sum(c.numel() * 4 for c in copies) == plan.cold_set_bytes
    assert len(kernels.cold_copies(keys, 2)) == 4  # keys and values per call
    caches = Cycle(copies)
    grown = kernels._append(torch.ones(16, 1, 64), caches)
    assert grown.shape == (16, 257, 64) and caches.items[caches.i] is grown
    assert torch.equal(grown[:, -1], torch.ones(16, 64))


@pytest.mark.torch
def test_the_logits_step_costs_a_plausible_time_per_vocabulary_entry() -> None:
    pytest.importorskip("transformers")
    from gpuwise.measure.probe.runtime_costs import measure_logits_step

    per_entry = measure_logits_step(repeats=3)
    assert 0 <= per_entry < 1e-6  # 1 us per entry would be 50 ms a step at GPT-2's vocabulary


def test_runtime_calls_take_turns_so_a_drifting_machine_moves_them_together() -> None:
    from gpuwise.measure.probe.runtime_costs import _over_rounds, _rounds

    order: list[str] = []
    rounds = _rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 4  # a warm-up round, then three
    assert len(rounds) == 3 and all(set(r) == {"a", "b"} for r in rounds)
    drifting = [{"a": 1.0 * k, "b": 1.0 * k + 0.5} for k in (1, 2, 10)]
    assert _over_rounds(drifting, lambda r: r["b"] - r["a"]) == 0.5


@pytest.mark.torch
def test_the_runtime_costs_are_plausible() -> None:
    pytest.importorskip("transformers")
    from gpuwise.measure.probe.runtime_costs import measure_runtime_overhead

    costs = measure_runtime_overhead(repeats=5)
    for phase in ("inference", "decode", "training"):
        assert 0 < costs[f"{phase}_op_s"] < 1e-3 and 0 <= costs[f"{phase}_step_s"] < 1.0


@pytest.mark.torch
def test_cold_caches_make_each_op_of_the_runtime_dearer() -> None:
    pytest.importorskip("transformers")
    from gpuwise.measure.probe.runtime_costs import measure_cold_factor

    assert 1.0 <= measure_cold_factor(repeats=5) <= 3.0  # 1.43-1.48 on the 2-core dev guest
