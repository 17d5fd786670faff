"""Never trust a bad measurement: a probe with implausible readings is saved aside, never over a
good profile, which stays in use; a saved profile of the wrong shape is reported in one line
and ignored (spec rates, said so), never a traceback (issue 21).

Every case runs in its own cache (GPUWISE_CACHE_DIR=tmp_path): this machine's profile in
~/.cache/gpuwise is never read or touched."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
from test_probe_merge import _profile

from gpuwise.catalog.hardware import find_hardware, load_hardware
from gpuwise.catalog.thresholds import probe_bounds, probe_thresholds
from gpuwise.cli import main
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.measure.probe import BandwidthReading, MatmulPoint, Profile
from gpuwise.measure.probe.plausible import implausible, implausible_parts
from gpuwise.measure.probe.profile_schema import PARTS
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.measure.probe.run import machine_fingerprint
from gpuwise.measure.probe.store import load_profile, profile_path, save_profile

ROOT = Path(__file__).resolve().parent.parent
GOOD_AT, BAD_AT = "2026-12-04T10:00:00+00:00", "2026-12-04T11:00:00+00:00"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _good() -> Profile:
    """A plausible full profile of this machine (torch-cpu): what `--on local` reads."""
    base = _profile(1.0)
    memory = tuple(BandwidthReading(kind, 20.0, 2**26, n * 2**26, n * 2**26 / 20e9)
                   for kind, n in (("read", 1), ("copy", 2), ("triad", 3)))
    return replace(base, fingerprint=machine_fingerprint(), backend="torch-cpu", bandwidth=memory,
                   steadiness={"read": 1.02}, notes=(), created_at=GOOD_AT)


def _stalled() -> Profile:
    """The tester's quick probe on a busy machine: fp32 matmul at 0.0 GFLOP/s (a 64^3 matmul
    that took a second), every larger size skipped."""
    point = MatmulPoint(64, 64, 64, "fp32", 1.0, 1.0, 2 * 64**3 / 1.0, 3)
    return replace(_good(), matmul_points=(point,), matmul_best={"fp32": point}, quick=True,
                   kernels=None, runtime=None, created_at=BAD_AT,
                   missing={"matmul.fp32.1024x1024x1024": "skipped: over the time budget"})


def _local_with_spec():
    """This machine as `--on local` sees it, with a catalogue CPU's datasheet figures, so that
    spec rates exist whatever CPU runs the tests."""
    return replace(find_hardware("cpu-cloud-32vcpu"), source="detected")


def _named(path: Path, text: str) -> bool:
    """Whether `text` names the file (a long path is cut in its middle, never its end)."""
    return str(path)[-24:] in text


def _infer_json(capsys: pytest.CaptureFixture[str]) -> dict:
    main(["infer", "smollm2-135m", "--on", "local", "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return json.loads(out)


# The bounds


def test_every_catalogue_device_lies_within_the_bounds_of_its_kind() -> None:
    """The bounds hold every real device in the catalogue: spec bandwidth, dense peaks by
    dtype and host links (a datasheet peak is above anything a probe can measure)."""
    for hw in load_hardware():
        if hw.kind not in ("cpu", "gpu"):
            continue
        bounds = probe_bounds(hw.kind)
        low, high = bounds.memory_gbs
        assert low < hw.memory_bandwidth_gbs < high, hw.id
        for dtype, tflops in hw.peak_tflops.items():
            if dtype in bounds.matmul_tflops:
                assert tflops < bounds.matmul_tflops[dtype][1], (hw.id, dtype)
        if bounds.link_gbs:
            assert bounds.link_gbs[0] < hw.host_link_gbs < bounds.link_gbs[1], hw.id
    assert probe_bounds("cpu").sources["matmul_tflops.fp32"] and probe_bounds("gpu").link_gbs
    assert probe_thresholds().steadiness_ratio == [0.5, 2.0]


def test_real_probes_are_plausible() -> None:
    """A full probe of an H200 and the good profile these tests use pass."""
    h200 = Profile.from_json((ROOT / "benchmarks/results/gpu_h200/probe.json").read_text())
    assert implausible(h200) == ()
    assert implausible(_good()) == ()


def test_a_stalled_matmul_is_implausible() -> None:
    (line,) = implausible(_stalled())
    assert line.startswith("matmul fp32 (best, 64x64x64) read 0.000524 GFLOP/s")
    assert "a real CPU gives 0.5-100,000" in line


@pytest.mark.parametrize(("change", "named"), [
    (lambda p: replace(p, overhead_s={"add": 0.0, "matmul_1x1": None}), "per-op overhead (add) read 0 us"),
    (lambda p: replace(p, overhead_s={"add": 0.5}), "per-op overhead (add) read 500,000 us"),
    (lambda p: replace(p, bandwidth=(BandwidthReading("triad", math.nan, 1, 1, 1.0),)), "triad bandwidth read nan"),
    (lambda p: replace(p, bandwidth=(BandwidthReading("read", 1e6, 1, 1, 1.0),)), "read bandwidth read 1,000,000 GB/s"),
    (lambda p: replace(p, steadiness={"read": 0.3}), "read bandwidth measured again at the probe's end ran at x0.30"),
    (lambda p: replace(p, kernels={"linear": {"fp32": {"forward": [[1, 512, 512, 0.0]]}}}), "linear fp32 forward 1x512x512 read inf"),
    (lambda p: replace(p, kernels={"elementwise": {"fp32": {"silu": 0.0}}}), "elementwise silu fp32 read 0 GB/s"),
    (lambda p: replace(p, kernels={"sdpa": {"fp32": {"decode": [[128, 0.0]]}}}), "sdpa fp32 decode at 128 read 0 s"),
    (lambda p: replace(p, runtime={"decode_op_s": 0.0}), "the runtime's cost per op (decode) read 0 us"),
    (lambda p: replace(p, backend="torch-cuda"), "fp32 (best, 1024x1024x1024) read 2.15 GFLOP/s: a real GPU gives 10-500,000"),
])
def test_each_kind_of_implausible_reading_is_named(change, named) -> None:
    profile = change(_good())
    found = (*implausible(profile), *(line for lines in implausible_parts(profile).values() for line in lines))
    assert any(named in line for line in found), found


def test_a_dtype_other_than_fp32_that_moved_is_set_aside_alone() -> None:
    from gpuwise.measure.probe.plausible import unsteady_dtypes

    bf16 = MatmulPoint(1024, 1024, 1024, "bf16", 0.001, 0.001, 2 * 1024**3 / 0.001, 3)
    base = _good()
    moved = replace(base, matmul_points=(*base.matmul_points, bf16),
                    matmul_best={**base.matmul_best, "bf16": bf16},
                    steadiness={"read": 1.0, "matmul_fp32": 1.01, "matmul_bf16": 0.34})
    assert implausible(moved) == ()  # the core stays trusted
    (line,) = unsteady_dtypes(moved).values()
    assert "matmul bf16 measured again at the probe's end ran at x0.34" in line
    aside = moved.without_dtype("bf16", line)
    assert all(p.dtype != "bf16" for p in aside.matmul_points) and aside.matmul_best["bf16"] is None
    assert aside.missing["matmul.bf16"].startswith("set aside, not trusted (matmul bf16")
    assert unsteady_dtypes(aside) == {} and implausible(replace(moved, steadiness={"matmul_fp32": 0.34}))


def test_a_machine_that_moved_less_than_the_bound_is_trusted_but_noted() -> None:
    assert implausible(replace(_good(), steadiness={"read": 0.6, "matmul_fp32": 1.9})) == ()


# A probe with implausible readings


def test_a_stalled_probe_is_saved_aside_and_the_good_profile_stays_in_use(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwise.app import probe as probe_command

    good = _good()
    main_path = save_profile(good)
    before = main_path.read_bytes()
    estimate = _infer_json(capsys)["time"]
    assert estimate["rates"].startswith("measured by `gpuwise probe`")

    monkeypatch.setattr(probe_command, "probe_machine", lambda quick, progress=None: _stalled())
    main(["probe", "--quick", "--json"])
    record = json.loads(capsys.readouterr().out)
    aside = profile_path(good.fingerprint, good.backend, rejected=True)
    assert record["trusted"] is False and record["saved_to"] == str(aside)
    assert record["in_use"] == str(main_path) and "matmul fp32" in record["warnings"][0]
    assert main_path.read_bytes() == before  # not saved over the good one
    assert Profile.from_json(aside.read_text()).warnings == tuple(record["warnings"])
    assert load_profile() == good

    after = _infer_json(capsys)["time"]
    assert after["prefill_s"] == estimate["prefill_s"]  # the good profile's rates
    assert after["rates"].startswith("measured by `gpuwise probe`")
    assert f"the probe of {BAD_AT} was set aside, not trusted (matmul fp32" in after["rates"]

    monkeypatch.setenv("COLUMNS", "1000")
    main(["probe", "--quick"])  # the terminal says so in one line, the warnings above it
    out = capsys.readouterr().out
    assert "warning: matmul fp32 (best, 64x64x64)" in out
    assert f"keep the profile of {GOOD_AT}" in out and "not trusted (1 warning above)" in out


def test_without_a_good_profile_a_stalled_probe_leaves_spec_rates_saying_why(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwise.app import probe as probe_command

    monkeypatch.setattr(probe_command, "probe_machine", lambda quick, progress=None: _stalled())
    main(["probe", "--quick", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert record["trusted"] is False and record["in_use"] is None
    profiles = [p.name for p in cache.iterdir() if p.name != "catalogue"]  # its parsed copies
    assert profiles == [Path(record["saved_to"]).name]  # aside only
    assert load_profile() is None

    rates, how = rates_for(_local_with_spec())
    assert rates is not None and rates.source == "spec"
    assert how.startswith("datasheet values with default efficiencies (the probe of")
    assert "set aside, not trusted (matmul fp32 (best, 64x64x64) read 0.000524" in how
    time = _infer_json(capsys)["time"]  # this CPU may have no datasheet: then it says both
    assert "set aside, not trusted" in (time.get("rates") or time.get("unavailable"))


def test_a_profile_saved_before_the_check_is_judged_when_read(cache: Path) -> None:
    """A stalled profile already in the main file (saved by an older gpuwise) is not used."""
    bad = _stalled()
    path = profile_path(bad.fingerprint, bad.backend)
    path.write_text(bad.to_json())
    rates, how = rates_for(_local_with_spec())
    assert rates is not None and rates.source == "spec"
    assert f"the saved probe profile {path} was not used: matmul fp32 (best" in how


def test_a_trusted_probe_is_saved_as_before(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwise.app import probe as probe_command

    monkeypatch.setattr(probe_command, "probe_machine", lambda quick, progress=None: _good())
    main(["probe", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert record["trusted"] is True and record["warnings"] == [] and "in_use" not in record
    assert record["saved_to"] == str(profile_path(machine_fingerprint(), "torch-cpu"))


# Saved profiles of the wrong shape


def _bad_files() -> dict[str, object]:
    good = json.loads(_good().to_json())

    def changed(**fields: object) -> str:
        return json.dumps({**good, **fields})

    bandwidth = [{**good["bandwidth"][0], "gbs": "44"}, *good["bandwidth"][1:]]
    return {
        "a string bandwidth": changed(bandwidth=bandwidth),
        "a missing field": json.dumps({k: v for k, v in good.items() if k != "overhead_s"}),
        "an unknown field": changed(extra=1),
        "wrong nesting": changed(matmul_best=[good["matmul_best"]]),
        "NaN": changed(overhead_s={"add": math.nan}),
        "infinity": changed(steadiness={"read": math.inf}),
        "a negative number": changed(overhead_s={"add": -1e-6}),
        "a bool for a number": changed(threads=True),
        "truncated JSON": changed()[:1000],
        "binary garbage": bytes(range(256)) * 40,
        "JSON nested too deep": "[" * 100_000,
        "a list": "[]",
        "another schema": changed(schema=2),
        "empty": "",
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_a_malformed_profile_is_ignored_in_one_line_with_spec_rates(
    case: str, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content = _bad_files()[case]
    path = profile_path(machine_fingerprint(), "torch-cpu")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert load_profile() is None
    rates, how = rates_for(_local_with_spec())
    assert rates is not None and rates.source == "spec"
    assert how.startswith("datasheet values with default efficiencies (") and _named(path, how)
    assert "\n" not in how and how.endswith("ignored)")
    time = _infer_json(capsys)["time"]  # exit 0, JSON, the reason named: never a traceback
    assert _named(path, time.get("rates") or time.get("unavailable"))
    assert path.read_bytes() == (content if isinstance(content, bytes) else content.encode())


def _bad_parts() -> dict[str, tuple[str, dict[str, object]]]:
    """A profile's parts malformed one at a time: (the part, what it holds instead)."""
    rates = {"weight_bytes_per_s": 1e10, "kv_bytes_per_s": 1e10, "matmul_flops": 1e11,
             "attention_flops": 1e11, "layer_s": 1e-5, "token_s": 0.0, "layer_token_s": 1e-7,
             "source": "measured"}
    part = {"version": "0.3.36", "system_info": "AVX2 = 1", "n_prompt": 512, "n_gen": 32,
            "models": ["a", "b"], "rates": {"q4_0/2": rates}, "timings": []}
    return {
        "kernels linear x": ("kernels", {"linear": "x"}),
        "a kernel grid point of three numbers": ("kernels", {"linear": {"fp32": {"forward": [[1, 2, 3]]}}}),
        "a runtime of text": ("runtime", {"decode_op_s": "fast"}),
        "a llama.cpp rate the reader does not know": (
            "llama_cpp", {**part, "rates": {"q4_0/2": {**rates, "decode_attention_flopz": 1.0}}}),
        "a llama.cpp rate left out": (
            "llama_cpp", {**part, "rates": {"q4_0/2": {k: v for k, v in rates.items() if k != "layer_s"}}}),
        "a llama.cpp timing of text": ("llama_cpp", {**part, "timings": ["fast"]}),
    }


@pytest.mark.parametrize("case", list(_bad_parts()))
def test_a_malformed_part_is_set_aside_alone_and_the_rest_is_used(
    case: str, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    part, content = _bad_parts()[case]
    path = profile_path(machine_fingerprint(), "torch-cpu")
    path.write_text(json.dumps({**json.loads(_good().to_json()), part: content}))
    profile = load_profile()
    assert profile is not None and getattr(profile, part) is None
    assert profile.parts_set_aside()[part].startswith("set aside, not trusted (profile.")
    rates, how = rates_for(_local_with_spec())
    assert rates is not None and rates.source == "measured"  # the core readings stay in use
    assert f"the {PARTS[part]} of the saved probe profile" in how and "estimates go without them" in how
    time = _infer_json(capsys)["time"]
    assert PARTS[part] in time["rates"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_a_profile_is_ignored_not_waited_on(cache: Path) -> None:
    path = profile_path(machine_fingerprint(), "torch-cpu")
    os.mkfifo(path)
    rates, how = rates_for(_local_with_spec())
    assert rates is not None and rates.source == "spec" and _named(path, how)
    assert "named pipe" in how


@pytest.mark.parametrize("record", [
    {"linear": "x"}, {"linear": {"fp32": {"forward": [["1", 2, 3, 4]]}}}, {"sdpa": {"fp32": [1]}},
    {"elementwise": {"fp32": {"silu": None}}}, {"fresh": {"by_held": [[0]]}}, {"attention": {}},
])
def test_the_kernel_record_reader_refuses_a_malformed_record(record: dict) -> None:
    with pytest.raises(ValueError, match=r"^kernels"):
        KernelRates.from_record(record)
