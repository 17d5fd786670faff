"""`gpuwise validate` end to end on a tiny model: a real run in a fresh process on this CPU."""

import pytest

from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.workload import from_config

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

TINY = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=704,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_hidden_layers=4,
    vocab_size=4000,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)


@pytest.mark.parametrize(
    "plan",
    [
        InferencePlan(batch=2, prompt_tokens=256, new_tokens=4, weights="fp32",
                      allocator="glibc-mmap64k"),
        TrainingPlan(batch=2, seq=128, dtype="fp32", optimizer="adamw",
                     allocator="glibc-mmap64k"),
    ],
    ids=["infer", "train"],
)
def test_validate_tiny_llama_within_target(plan):
    """glibc pinned (the live tensors): a default process moves by a few MiB from one run to
    the next, a large share of this model; the median of three processes is taken all the same."""
    from gpuwise.app.validate import validate

    result = validate(TINY, from_config(TINY, "tiny"), plan, quiet=True, timing=False)
    assert result["measured_model_bytes"] > 0 and result["allocator"] == "glibc-mmap64k"
    assert len(result["measured_passes_model_bytes"]) == 3 and "live" not in result
    # a few MiB of the first run's own buffers (not made by the tiny warm-up) weigh up to 8%
    # on this 20-30 MiB model; the suite's models are 10-200 times larger
    assert abs(result["error"]) < 0.12, result
