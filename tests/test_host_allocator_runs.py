"""Real runs under a chosen host allocator (measure/runs): the tiny warm-up model that loads
the runtime without moving glibc's mmap threshold, the environment each allocator gets, and a
default process against a pinned one."""

from __future__ import annotations

import pytest

from gpuwise.catalog import resolve_model
from gpuwise.catalog.allocators import host_allocator
from gpuwise.measure.runs.allocator_env import allocator_env, find_library
from gpuwise.measure.runs.child_process import LIVE_TENSORS_ENV

THRESHOLD = host_allocator().mmap_threshold_min
FAMILIES = ("smollm2-135m", "qwen2.5-0.5b", "gpt2", "pythia-160m", "phi-2", "gemma-2-2b",
            "mistral-7b", "falcon-7b", "starcoderbase-1b", "mixtral-8x7b")


def test_each_allocator_gets_its_environment_and_a_missing_library_is_named():
    assert allocator_env("glibc") == {}
    assert allocator_env("glibc-mmap64k") == LIVE_TENSORS_ENV == {
        "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    for name, lib in (("jemalloc", "libjemalloc.so.2"), ("tcmalloc", "libtcmalloc_minimal.so.4")):
        if find_library(lib):
            assert allocator_env(name)["LD_PRELOAD"].startswith("/")
        else:
            with pytest.raises(RuntimeError, match=lib):
                allocator_env(name)


@pytest.mark.torch
@pytest.mark.parametrize("name", FAMILIES)
def test_the_tiny_warm_up_model_keeps_every_tensor_under_the_initial_mmap_threshold(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpuwise.measure.runs.model_build import _model_config, _shrink

    cfg = _model_config(resolve_model(name).config)
    _shrink(cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    biggest = max(p.numel() * 4 for p in model.parameters())
    assert biggest + 4096 < THRESHOLD  # fp32, with glibc's header and alignment slack
    assert cfg.vocab_size * 8 * 4 < THRESHOLD  # the warm-up's logits: 8 tokens, fp32
