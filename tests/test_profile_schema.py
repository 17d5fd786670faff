"""The saved profile has one definition: what the probe writes and what the loader accepts are
derived from the same dataclasses, the llama.cpp part included (issue 37: the llama.cpp
probe's fit wrote fields its loader refused, and every llama.cpp probe was set aside). The
round trip goes through the real save and load paths, as a user's profile does."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from test_probe_trust import _good

from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate.speed.ggml_time import GgmlRates
from gpuwise.estimate.speed.probe_record import record_of
from gpuwise.measure.llama_cpp import fit
from gpuwise.measure.llama_cpp import probe as llama_probe
from gpuwise.measure.llama_cpp.record import CacheSweep, LlamaCppPart, LlamaCppTiming
from gpuwise.measure.probe.llama_cpp_part import keep_llama_cpp
from gpuwise.measure.probe.profile import Profile
from gpuwise.measure.probe.profile_schema import LLAMA_CPP
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.measure.probe.store import load_profile, save_profile

ROOT = Path(__file__).resolve().parents[1]
# A full llama.cpp probe of a 2-core Xeon, as `gpuwise probe --runtime llama.cpp` took it.
TIMINGS = json.loads((ROOT / "benchmarks/results/llama_cpp_time.json").read_text())["probe"]["timings"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _part(timings: list[dict[str, Any]] = TIMINGS, quick: bool = False) -> dict[str, Any]:
    """The llama.cpp part the probe writes for these timings (probe_llama_cpp's last step)."""
    rates = llama_probe.rates_from_timings(timings)
    part = LlamaCppPart(version="0.3.36", system_info="CPU : AVX2 = 1", n_prompt=512, n_gen=32,
                        models=("h768-l24", "h2048-l4"), rates=rates,
                        timings=tuple(LlamaCppTiming(**t) for t in timings), quick=quick,
                        cache_sweep=CacheSweep({"8": 3e10, "64": 3e10, "128": 1.5e10}, 64 * 2**20,
                                               128 * 2**20))
    return llama_probe.saved_form(part)


def _local_profile(**fields: Any) -> Profile:
    """A plausible profile of this machine (torch-cpu) with these fields."""
    return replace(_good(), **fields)


def test_a_llama_cpp_probe_round_trips_through_the_real_save_and_load(cache: Path) -> None:
    written = _local_profile(llama_cpp=_part())
    save_profile(written)
    read = load_profile()
    assert read is not None and read.trusted and read.parts_set_aside() == {}
    assert read == written  # every field, the llama.cpp part's decode and half-ubatch rates too
    assert set(read.llama_cpp["rates"]) == {f"{t}/{n}" for t in ("f16", "q8_0", "q4_0", "q4_k") for n in (1, 2)}


def test_an_estimate_reads_the_saved_llama_cpp_rates(cache: Path) -> None:
    save_profile(_local_profile(llama_cpp=_part()))
    rates, how = rates_for(replace(find_hardware("cpu-cloud-32vcpu"), source="detected"))
    assert rates is not None and rates.source == "measured" and "set aside" not in how
    saved = rates.ggml_measured["q4_0/2"]
    assert GgmlRates(**saved).decode_attention_flops > 0  # the fields the fit writes are read


def test_the_fit_writes_exactly_the_fields_the_rates_define() -> None:
    """Adding a field to the fit only, or taking one from GgmlRates only, fails here."""
    fits = [fit.fit_rates(*pair, llama_probe.DEPTH, llama_probe.SEQS, llama_probe.CHUNK)
            for pair in _pairs()]
    defined = {f.name for f in dataclasses.fields(GgmlRates)} - {"source"}
    assert all(set(f) == defined for f in fits)


def _pairs() -> list[tuple[fit.ModelTiming, fit.ModelTiming]]:
    models = {cfg.name: cfg for cfg in llama_probe.PROBE_MODELS}
    found: dict[tuple[str, int], list[fit.ModelTiming]] = {}
    for t in TIMINGS:
        cfg = models.get(t["model"])
        if cfg is None:  # the small model's: the cache's rate, fitted beside a pair
            continue
        arch = fit.llama_arch(cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab)
        pp, tg = fit.timing_plans(t["type"], t["bytes"], t["embedding_bytes"], 512, 32, t["threads"])
        found.setdefault((t["type"], t["threads"]), []).append(
            fit.ModelTiming(arch, pp, tg, t["pp_s"], t["tg_s"], t.get("decode_steps") or {},
                            t.get("pp_half_s", 0.0)))
    return [(a, b) for a, b in found.values()]


def test_a_field_written_by_the_fit_only_stops_the_probe_not_the_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = fit.fit_rates
    monkeypatch.setattr(llama_probe, "fit_rates", lambda *a: {**real(*a), "new_rate": 1.0})
    with pytest.raises(TypeError, match="new_rate"):
        llama_probe.rates_from_timings(TIMINGS)


@pytest.mark.parametrize(("change", "named"), [
    (lambda p: {**p, "rates": {"q4_0/2": {**p["rates"]["q4_0/2"], "retired_rate": 1.0}}}, "unknown field 'retired_rate'"),
    (lambda p: {**p, "rates": {"q4_0/2": {k: v for k, v in p["rates"]["q4_0/2"].items() if k != "layer_s"}}}, "no field 'layer_s'"),
    (lambda p: {**p, "timings": [{**p["timings"][0], "decode_steps": {"d0/s1": "fast"}}]}, "decode_steps.d0/s1"),
    (lambda p: {**p, "extra": 1}, "unknown field 'extra'"),
])
def test_the_reader_refuses_what_the_definition_does_not_hold(change, named) -> None:
    with pytest.raises(ValueError, match=named):
        LLAMA_CPP(change(_part()), "llama_cpp")


def test_a_dataclass_field_with_no_check_is_refused_when_the_schema_is_made() -> None:
    @dataclass
    class Loose:
        anything: Any

    with pytest.raises(TypeError, match="Loose.anything"):
        record_of(Loose)


def test_a_quick_llama_cpp_probe_keeps_the_full_probes_rates_it_did_not_take() -> None:
    full = _local_profile(llama_cpp=_part())
    quick_timings = [t for t in TIMINGS if t["threads"] == 2]
    quick = _local_profile(llama_cpp=_part(quick_timings, quick=True), created_at="later")
    kept = keep_llama_cpp(quick, full)
    assert kept.llama_cpp is not None
    assert set(kept.llama_cpp["rates"]) == set(full.llama_cpp["rates"])  # the 1-thread rates kept
    assert kept.llama_cpp["rates"]["q4_0/2"] == quick.llama_cpp["rates"]["q4_0/2"]  # its own fresher
    assert any("did not time" in n for n in kept.notes)


def test_a_llama_cpp_part_set_aside_at_the_probe_keeps_the_previous_good_one() -> None:
    good = _local_profile(llama_cpp=_part())
    bad = _local_profile(llama_cpp=None).without_part("llama_cpp", "llama.cpp q4_0/2 weight streaming read 0 GB/s")
    kept = keep_llama_cpp(bad, good)
    assert kept.llama_cpp == good.llama_cpp and "llama_cpp" not in kept.missing
    assert any("set aside" in n and "previous probe's are kept" in n for n in kept.notes)
