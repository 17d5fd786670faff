"""Every tuned value in the catalogue's data files names its source, and the loaders read them
(gpuwise/catalog/data: efficiency, optimizers, allocators, thresholds)."""

from __future__ import annotations

import pytest

from gpuwise.catalog import sourced
from gpuwise.catalog.allocators import host_allocator
from gpuwise.catalog.efficiency import device_efficiency, time_model_rules
from gpuwise.catalog.optimizers import optimizers
from gpuwise.catalog.thresholds import (
    advise_thresholds,
    precision_thresholds,
    probe_thresholds,
    watch_thresholds,
)
from gpuwise.workload.plans import OPTIMIZERS

FILES = ("efficiency.toml", "optimizers.toml", "allocators.toml", "thresholds.toml")


@pytest.mark.parametrize("file", FILES)
def test_every_value_of_every_section_has_a_source(file):
    for section in sourced.data_file(file):
        values, sources = sourced.sourced_section(file, section)
        assert values and set(sources) == set(values)
        assert all(len(source) > 20 for source in sources.values()), section


def test_a_value_without_a_source_is_refused(monkeypatch):
    data = {"x": {"a": 1.0, "b": 2, "sources": {"a": "a datasheet, 2026"}}}
    monkeypatch.setattr(sourced, "data_file", lambda file: data)
    with pytest.raises(ValueError, match="no source for b"):
        sourced.sourced_section("made-up.toml", "x")
    data["x"]["sources"] = {"*": "an assumption", "c": "a value it lacks"}
    with pytest.raises(ValueError, match="sources for values it lacks: c"):
        sourced.sourced_section("made-up.toml", "x")


def test_the_loaders_read_typed_records_with_their_sources():
    for kind in ("gpu", "cpu", "tpu", "apple"):
        d = device_efficiency(kind)
        assert d.kind == kind and 0 < d.matmul_max <= 1 and 0 < d.memory <= 1
        assert set(d.sources) >= {"matmul_max", "memory", "vector", "op_overhead_s"}
    assert device_efficiency("a-kind-not-listed").kind == "gpu"
    assert device_efficiency("gpu").runtime_op_s and not device_efficiency("cpu").runtime_op_s
    assert time_model_rules().backward_scale == 2.0
    assert set(optimizers()) == set(OPTIMIZERS)  # every optimizer a plan accepts
    assert optimizers()["adamw"].passes("cpu") != optimizers()["adamw"].passes("gpu")
    glibc = host_allocator()
    assert glibc.mmap_threshold_min < glibc.mmap_threshold_max == 32 * 2**20
    for t in (watch_thresholds(), advise_thresholds(), precision_thresholds(),
              probe_thresholds()):
        assert t.sources
