"""`gpuwise claims` judges each claim on the runtime people use for it here and says so beside
the verdict (issue 39, item 5): on a CPU, decode and prefill on llama.cpp (not transformers'
eager dispatch), training on transformers; each result names its runtimes and the probe or
rates it rests on, in the terminal and the JSON; a probe without the runtime's own costs is
said, with the probe that would make the verdict firmer.

Every case runs in its own cache (GPUWISE_CACHE_DIR=tmp_path) with a fixture profile of this
machine (tests/test_probe_trust.py, tests/test_profile_schema.py): no probe runs."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_cli
from rich.console import Console
from test_profile_schema import _local_profile, _part

from gpuwise.app.claims import (
    ClaimResult,
    ClaimsAnswer,
    JudgedOn,
    RatesUsed,
    RuntimeUse,
    machine_rates,
    memory_bound,
    memory_fits,
)
from gpuwise.app.claims import bandwidth_decode as bandwidth
from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import firmer_probe, runtime_for
from gpuwise.app.claims.machine_rates import Bandwidth
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer
from gpuwise.app.local import this_machine
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.estimate.speed.roofline import OpTime
from gpuwise.measure.probe.store import save_profile
from gpuwise.report.claims_view import claims_view
from gpuwise.workload.ops import Op


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def on_cpu() -> str:
    kind = hardware_named("local").kind
    if kind != "cpu":
        pytest.skip(f"this machine's best device is a {kind}: the cases are a CPU's")
    return kind


def _with_llama_cpp() -> Any:
    """This machine's profile with the llama.cpp part of a full `gpuwise probe --runtime
    llama.cpp` (a 2-core Xeon's timings), its every-core rates keyed by this machine's cores."""
    part = _part()
    cores = hardware_named("local").compute_units
    rates = {f"{key.split('/')[0]}/{cores}": value for key, value in part["rates"].items()
             if key.endswith("/2")}
    return _local_profile(llama_cpp={**part, "rates": rates})


def _no_probe(*args: object, **kwargs: object) -> None:
    pytest.fail("a probe ran: the claims use the saved profile")


def _data_movement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClaimResult:
    monkeypatch.setattr(machine_rates, "probe", _no_probe)
    return memory_bound.run(Context(True, tmp_path))


def _decode_on_eager(results: tuple[ClaimResult, ...] | list[ClaimResult]) -> list[str]:
    """The claims that judge decode on transformers' eager generate() without saying it is not
    the runtime people use here."""
    return [r.id for r in results if r.judged_on is not None
            for u in r.judged_on.runtimes
            if u.runtime == "transformers" and "decode" in u.phases and not u.instead_of]


# ------------------------------------------------------------------ the runtime, in one place


def test_the_runtime_people_use_is_llama_cpp_on_a_cpu_or_mac_vllm_on_a_gpu_transformers_to_train():
    for kind in ("cpu", "apple"):
        for phase in ("prefill", "decode"):
            people = runtime_for(phase, kind)
            assert (people.runtime, people.weights) == ("llama.cpp", "q4_k_m")
    assert "Q4_K_M" in runtime_for("decode", "cpu").source
    assert (runtime_for("decode", "gpu").runtime, runtime_for("decode", "gpu").weights) == ("vllm", "bf16")
    for kind in ("cpu", "apple", "gpu", "tpu"):
        assert runtime_for("training step", kind).runtime == "transformers"
    tpu = runtime_for("decode", "tpu")  # the catalogue names none: transformers, said so
    assert tpu.runtime == "transformers" and "no runtime for this kind" in tpu.source


def test_the_probe_that_makes_a_verdict_firmer_is_the_runtimes_own():
    assert firmer_probe(("llama.cpp", "transformers")) == "gpuwise probe --runtime llama.cpp"
    assert firmer_probe(("transformers",)) == "gpuwise probe"
    assert firmer_probe(("vllm",)) == ""  # no probe measures vLLM's own costs
    with pytest.raises(ValueError, match="rates"):
        RatesUsed("a guess", "x")


# --------------------------------------------------------------- data movement, on llama.cpp


def test_data_movement_splits_decode_on_llama_cpp_as_infer_ops_gives_it(cache, on_cpu, tmp_path,
                                                                         monkeypatch, capsys):
    save_profile(_with_llama_cpp())
    result = _data_movement(tmp_path, monkeypatch)
    judged = result.judged_on
    assert judged is not None
    serving, training = judged.runtimes
    assert (serving.runtime, serving.weights, serving.phases) == ("llama.cpp", "q4_k_m",
                                                                  ("prefill", "decode"))
    assert (training.runtime, training.phases) == ("transformers", ("training step",))
    assert not serving.instead_of and not training.instead_of
    assert judged.rates.kind == "probe with runtime costs" and judged.rates.firmer == ""
    assert judged.rates.text == "probe of 2026-12-04 with llama.cpp's and transformers' costs"
    shares = {m.name: m.value for m in result.measurements}
    hw = hardware_named("local")
    for name in memory_bound.MODELS:
        # what `gpuwise infer NAME --runtime llama.cpp --weights q4_k_m --on local --ops` gives
        model, arch = model_named(name)
        planned = build_plan(model, Deployment(runtime="llama.cpp", weights="q4_k_m"),
                             Workload(), hw)
        answer = infer(model, arch, hw, planned.plan, planned.weights_source)
        assert answer.time is not None and answer.time.runtime_id == "llama.cpp"
        assert answer.time.missing == ()  # the probe holds llama.cpp's rates for q4_k here
        decode = answer.time.decode
        memory = sum(t.seconds for t in decode.ops if t.bound == "memory")
        assert shares[f"{name} decode memory-bound share"] == round(memory / decode.seconds, 4)
        assert memory / decode.seconds > 0.5  # a token streams the weights
        i = result.series["labels"].index(f"{name} decode")
        assert result.series["seconds"][i] == decode.seconds
        assert result.series["runtimes"][i] == "llama.cpp q4_k_m"
        # and the command prints those very rows
        code, out, err = run_cli(["infer", name, "--runtime", "llama.cpp", "--weights", "q4_k_m",
                                  "--on", "local", "--ops", "--json"], capsys)
        assert code == 0, err
        rows = json.loads(out)["ops"]["decode"]
        assert [r["seconds"] for r in rows] == [t.seconds for t in decode.ops]
        assert rows[0]["op"] == "weights (q4_k)"


def test_the_two_claims_say_why_they_differ_on_the_same_runtime(cache, on_cpu, tmp_path,
                                                                monkeypatch):
    save_profile(_with_llama_cpp())
    result = _data_movement(tmp_path, monkeypatch)
    s = result.series
    shares = {label: m / t for label, m, t in zip(s["labels"], s["memory_s"], s["seconds"],
                                                  strict=True)}
    assert all(share > 0.5 for label, share in shares.items() if label.endswith(" decode"))
    assert all(share < 0.5 for label, share in shares.items() if not label.endswith(" decode"))
    verdict = result.verdict
    assert verdict.holds is False  # prefill and the training step are arithmetic on this CPU
    assert "only 3 of 9 phases are memory-bound" in verdict.reason
    assert "(llama.cpp q4_k_m)" in verdict.reason and "(transformers " in verdict.reason
    assert "prefill and training step spend most of their time in arithmetic" in verdict.reason
    assert "the phase the bandwidth claim times, is memory-bound for 3 of 3 models" in verdict.reason
    assert "different phases" in verdict.reason


def test_a_probe_without_llama_cpps_costs_still_judges_and_says_which_probe_is_firmer(
        cache, on_cpu, tmp_path, monkeypatch):
    save_profile(_local_profile())  # a probe without `--runtime llama.cpp`
    result = _data_movement(tmp_path, monkeypatch)
    judged = result.judged_on
    assert judged is not None and judged.runtimes[0].runtime == "llama.cpp"
    assert judged.rates.kind == "probe without runtime costs"
    assert "without llama.cpp's costs" in judged.rates.text
    assert judged.rates.firmer == "gpuwise probe --runtime llama.cpp"
    assert "(firmer: `gpuwise probe --runtime llama.cpp`)" in judged.text
    assert any("`gpuwise probe --runtime llama.cpp` measures them" in n for n in result.notes)
    assert result.verdict.holds in (True, False)


def test_a_claim_judging_decode_on_eager_transformers_on_a_cpu_is_caught(cache, on_cpu, tmp_path,
                                                                         monkeypatch):
    """The check the next test applies fails on data movement judged as before (transformers'
    generate() for prefill and decode): it can fail."""
    save_profile(_with_llama_cpp())
    eager = replace(runtime_for("training step", "cpu"), weights="bf16")
    monkeypatch.setattr(memory_bound, "runtime_for",
                        lambda phase, kind: eager if phase != "training step" else
                        runtime_for(phase, kind))
    result = _data_movement(tmp_path, monkeypatch)
    assert result.judged_on is not None and result.judged_on.runtimes[0].runtime == "transformers"
    assert _decode_on_eager([result]) == ["data-movement"]


def _fake_bandwidth(monkeypatch: pytest.MonkeyPatch, llama_cpp: str | None) -> None:
    monkeypatch.setattr(bandwidth, "measure_bandwidth", lambda: Bandwidth(50.0, 48.0, "a CPU", 2**28))
    monkeypatch.setattr(bandwidth, "llama_cpp_missing", lambda: llama_cpp)
    point = [bandwidth.DecodePoint("0.06B f16", 100_000_000, 0.0024)]
    monkeypatch.setattr(bandwidth, "_llama_points", lambda ctx, now: (now(), point)[1])
    monkeypatch.setattr(bandwidth, "_torch_points", lambda ctx, sizes, dtype, now: (now(), point)[1])


def test_no_claim_judges_decode_on_eager_transformers_on_a_cpu_unsaid(cache, on_cpu, tmp_path,
                                                                      monkeypatch):
    save_profile(_with_llama_cpp())
    _fake_bandwidth(monkeypatch, None)
    ctx = Context(True, tmp_path)
    monkeypatch.setattr(Context, "device", "cpu")
    results = [_data_movement(tmp_path, monkeypatch), bandwidth.run(ctx), memory_fits.run(ctx)]
    assert _decode_on_eager(results) == []
    by_id = {r.id: r.judged_on for r in results}
    assert by_id["bandwidth"] is not None and by_id["data-movement"] is not None
    assert by_id["bandwidth"].runtimes[0].runtime == "llama.cpp"
    assert by_id["bandwidth"].rates.kind == "timed here"
    assert by_id["data-movement"].runtimes[0].runtime == by_id["bandwidth"].runtimes[0].runtime
    memory = by_id["memory"]
    assert memory is not None and memory.rates.kind == "detected"
    estimated_under = this_machine().plan.runtime  # the estimate `gpuwise` prints
    assert memory.runtimes[0].runtime == estimated_under
    assert memory.runtimes[0].instead_of == ("" if estimated_under == "llama.cpp" else "llama.cpp")
    # without llama.cpp, bandwidth times transformers and says so beside the verdict
    _fake_bandwidth(monkeypatch, "llama_cpp not installed")
    fallback = bandwidth.run(Context(True, tmp_path))
    assert fallback.judged_on is not None
    used = fallback.judged_on.runtimes[0]
    assert (used.runtime, used.instead_of) == ("transformers", "llama.cpp")
    assert "not available here (llama_cpp not installed)" in fallback.judged_on.text
    assert _decode_on_eager([fallback]) == []


# ------------------------------------------------------------------ beside the verdict


def test_an_op_whose_time_is_its_reads_is_memory_bound():
    """llama.cpp's decode rows give both times the streaming time: memory-bound, everywhere
    the roofline labels an op (infer --ops, the phase's bound, this claim)."""
    op = Op("weights (q4_k)", "matmul", 2e9, 8e8)
    assert OpTime(op, 0.06, 0.06).bound == "memory"  # llama.cpp's decode row: a tie
    assert OpTime(op, 0.5, 0.06).bound == "compute"
    assert OpTime(op, 0.01, 0.06).bound == "memory"


def _result(judged: JudgedOn | None) -> ClaimResult:
    from gpuwise.app.claims.result import Verdict

    return ClaimResult("data-movement", "The usual bottleneck is moving data", "a claim",
                       "an experiment", Verdict(False, "only decode", "a rule"), "a summary",
                       judged_on=judged)


def test_the_runtime_and_probe_are_beside_each_verdict_in_the_terminal_and_the_json():
    judged = JudgedOn((RuntimeUse("llama.cpp", "q4_k_m", ("prefill", "decode")),
                       RuntimeUse("transformers", "mixed-bf16", ("training step",))),
                      RatesUsed("probe without runtime costs",
                                "quick probe of 2026-12-06 without llama.cpp's costs",
                                "gpuwise probe --runtime llama.cpp"))
    assert judged.text == ("llama.cpp q4_k_m prefill and decode, transformers mixed-bf16 "
                           "training step; quick probe of 2026-12-06 without llama.cpp's costs "
                           "(firmer: `gpuwise probe --runtime llama.cpp`)")
    answer = ClaimsAnswer({"cpu": "Test CPU", "cores": 2, "ram": "16 GiB", "gpus": []}, True,
                          (_result(judged), _result(None)), 1.0)
    record, view = claims_view(answer)
    first, unmeasured = record["claims"]
    assert first["judged_on"]["text"] == judged.text
    assert first["judged_on"]["rates"] == {"kind": "probe without runtime costs",
                                           "text": "quick probe of 2026-12-06 without llama.cpp's costs",
                                           "firmer": "gpuwise probe --runtime llama.cpp"}
    assert [u["runtime"] for u in first["judged_on"]["runtimes"]] == ["llama.cpp", "transformers"]
    assert first["judged_on"]["runtimes"][0]["phases"] == ["prefill", "decode"]
    assert unmeasured["judged_on"] is None
    json.dumps(record, allow_nan=False)
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(view)
    lines = out.getvalue().splitlines()
    verdict_at = next(i for i, line in enumerate(lines) if "does not hold here" in line)
    assert f"on: {judged.text}" in lines[verdict_at + 1]  # beneath the verdict, in its cell
