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
        InferencePlan(batch=2, prompt_tokens=256, new_tokens=4, weights="fp32"),
        TrainingPlan(batch=2, seq=128, dtype="fp32", optimizer="adamw"),
    ],
    ids=["infer", "train"],
)
def test_validate_tiny_llama_within_target(plan):
    from gpuwise.app.validate import validate

    result = validate(TINY, from_config(TINY, "tiny"), plan, quiet=True)
    assert result["measured_model_bytes"] > 0
    assert abs(result["error"]) < 0.08, result
