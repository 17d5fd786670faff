"""The stored activation profiles still describe the installed transformers, and they
generalise: bytes saved for backward by a real model of other dimensions match the estimate."""

import contextlib
import json
from importlib import resources

import pytest

from gpuwise.estimate.memory.activations import saved_for_backward
from gpuwise.workload import from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from gpuwise.measure.profiles import activations as ap  # noqa: E402


def stored():
    path = resources.files("gpuwise.catalog").joinpath("data/activation_profiles.json")
    return json.loads(path.read_text())["profiles"]


@pytest.mark.parametrize(
    "key",
    [
        "llama/fp32/sdpa/full/nodropout",
        "gpt2/bf16/eager/full/dropout",
        "qwen2/mixed-bf16/sdpa/ckpt/nodropout",
        "phi/fp32/sdpa/full/dropout",
    ],
)
def test_stored_profile_matches_a_fresh_measurement(key):
    family, mode, attention, ckpt, dropout = key.split("/")
    fresh = ap.profile_one(
        family, mode, attention, ckpt == "ckpt", 0.1 if dropout == "dropout" else 0.0
    )
    assert fresh == stored()[key], "re-run: python tools/write_activation_profiles.py"


CONFIGS = {
    "llama": dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=704,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_hidden_layers=3,
        vocab_size=1000,
        max_position_embeddings=256,
    ),
    "gpt2": dict(
        model_type="gpt2", n_embd=192, n_layer=3, n_head=6, vocab_size=900, n_positions=256
    ),
    "gpt_neox": dict(
        model_type="gpt_neox",
        hidden_size=192,
        intermediate_size=768,
        num_attention_heads=6,
        num_hidden_layers=3,
        vocab_size=900,
        max_position_embeddings=256,
        rotary_pct=0.25,
    ),
}


@pytest.mark.parametrize("family", CONFIGS)
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_saved_bytes_of_a_real_model_match_the_estimate(family, mode):
    config = transformers.AutoConfig.for_model(**CONFIGS[family])
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=dtype, attn_implementation="sdpa"
    )
    model.train()
    batch, seq = 3, 96
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    saved = ap._saved_storages(model, ids, contextlib.nullcontext())
    measured = sum(nbytes for nbytes, _ in saved.values())
    arch = from_config(config.to_dict())
    est = saved_for_backward(arch, batch, seq, mode, "sdpa", False)
    estimated = est["layers"] + est["other"] + est["logits"]
    assert estimated == pytest.approx(measured, rel=0.01)
