"""The last-level cache in llama.cpp's time model: the probe's sweep finds the span over which
streams leave the cache, the fit finds the cache's rate from a small model, and a decode
that reads less than the cache holds streams at that rate (issue 37 item 7: models that fit
in the cache decoded 1.5-2.7x faster than predicted)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.speed.cache_share import CacheSpan
from gpuwise.estimate.speed.ggml_time import GgmlRates, cache_share, stream_seconds
from gpuwise.measure.llama_cpp.cache_sweep import cache_span
from gpuwise.measure.llama_cpp.fit import (
    ModelTiming,
    _tg_equation,
    fit_cache,
    fit_rates,
    llama_arch,
    timing_plans,
)
from gpuwise.workload import count_params

MIB = 2**20
SIZES = (8, 10, 13, 16, 23, 32, 45, 54, 64, 76, 91, 108, 128, 181, 256, 512, 1024)


def _sweep(cliff_mib: float, cached: float = 30e9, memory: float = 14e9) -> dict[str, float]:
    return {str(s): cached if s <= cliff_mib else memory for s in SIZES}


def test_the_sweep_finds_where_reads_leave_the_cache():
    span = cache_span(_sweep(64))
    assert (span.full, span.none) == (64 * MIB, 76 * MIB)


def test_one_stalled_size_is_not_the_cliff_and_a_flat_sweep_has_no_cache():
    stalled = {**_sweep(91), "23": 14e9}
    assert cache_span(stalled).full == 91 * MIB
    assert cache_span(_sweep(0, 20e9, 19e9)) == CacheSpan(0.0, 0.0)  # within STEP: no cache seen


def test_the_cache_share_falls_from_all_to_none_across_the_span():
    span = CacheSpan(64 * MIB, 128 * MIB)
    shares = [span.share(s * MIB) for s in (32, 64, 80, 100, 128, 512)]
    assert shares[:2] == [1.0, 1.0] and shares[-2:] == [0.0, 0.0]
    assert 1.0 > shares[2] > shares[3] > 0.0
    assert CacheSpan(0.0, 0.0).share(1.0) == 0.0  # no span: everything from memory


def _rates(**fields: float) -> GgmlRates:
    return replace(GgmlRates(10e9, 10e9, 1e11, 1e11, 1e-5, 0.0, 1e-6, "measured"), **fields)


def test_a_step_within_the_cache_streams_at_the_caches_rate():
    g = _rates(cache_bytes_per_s=30e9, cache_full_bytes=64 * MIB, cache_none_bytes=128 * MIB)
    small, big = 40 * MIB, 400 * MIB
    assert stream_seconds(g, small, small, g.weight_bytes_per_s) == pytest.approx(small / 30e9)
    assert stream_seconds(g, big, big, g.weight_bytes_per_s) == pytest.approx(big / 10e9)
    assert cache_share(_rates(), small) == 0.0  # a probe without the cache's rate: memory's


def _timing_at(hidden: int, layers: int, vocab: int, d: float, c: float, layer_s: float,
               span: CacheSpan) -> ModelTiming:
    """A q8_0 model's tg as fit_cache's model makes it from these rates."""
    arch = llama_arch(hidden, layers, hidden // 64, 2, 3 * hidden, vocab)
    total = int(weight_bytes(arch, "q8_0"))
    embedding = total * vocab * hidden // count_params(arch).total
    pp, tg = timing_plans("q8_0", total, embedding, 256, 32, 2)
    m = ModelTiming(arch, pp, tg, 1.0, 0.0)
    w, n, _ = _tg_equation(m)
    share = span.share(w)
    return replace(m, tg_s=w * ((1 - share) / d + share / c) + n * layer_s)


def test_the_fit_recovers_memorys_and_the_caches_rates_from_three_models():
    span = CacheSpan(64 * MIB, 96 * MIB)
    truth = dict(d=14e9, c=35e9, layer_s=40e-6, span=span)
    big = (_timing_at(768, 24, 32000, **truth), _timing_at(2048, 4, 32000, **truth))
    small = _timing_at(768, 3, 8000, **truth)
    fitted = fit_cache((*big, small), span)
    assert fitted["weight_bytes_per_s"] == pytest.approx(14e9, rel=1e-6)
    assert fitted["cache_bytes_per_s"] == pytest.approx(35e9, rel=1e-6)
    assert fitted["layer_s"] == pytest.approx(40e-6, rel=1e-6)
    rates = fit_rates(*big, small=small, span=span)
    assert rates["cache_full_bytes"] == span.full and rates["cache_bytes_per_s"] > 0


def test_a_small_model_no_faster_than_memory_gives_no_cache_rate():
    span = CacheSpan(64 * MIB, 96 * MIB)
    slow = dict(d=14e9, c=10e9, layer_s=40e-6, span=span)  # "cache" slower than memory
    models = (_timing_at(768, 24, 32000, **slow), _timing_at(2048, 4, 32000, **slow),
              _timing_at(768, 3, 8000, **slow))
    assert fit_cache(models, span) == {}
    assert fit_rates(*models[:2], small=models[2], span=span)["cache_bytes_per_s"] == 0.0
    assert fit_cache(models, CacheSpan(0.0, 0.0)) == {}  # no cache seen: nothing to fit
