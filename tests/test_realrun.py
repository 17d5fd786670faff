"""Real runs of a tiny model: the measured peak must be the weights plus a little, and move
with the plan. Each real measurement starts a fresh Python process (a few seconds here). The
tight checks run glibc pinned (the live tensors: a default process differs from one run to
the next by a few MiB, a tiny model's whole size); one checks the default process."""

from __future__ import annotations

import importlib.util

import pytest

from gpuwise.measure.runs.child_process import last_json_line
from gpuwise.measure.runs.memory_run import MeasuredMemory, measure_inference, measure_training

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
# hidden*vocab*2 (embedding, head) + layers * (4 attn + 3 mlp matrices + 2 norms) + final norm
TINY_PARAMS = 256 * 1000 * 2 + 4 * (4 * 256 * 256 + 3 * 256 * 1024 + 2 * 256) + 256
SMALL_PLAN = {"batch": 1, "prompt_tokens": 128, "new_tokens": 8}
PINNED = "glibc-mmap64k"  # every tensor of 64 KiB or more mapped on its own


def _needs_torch() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def small_inference() -> MeasuredMemory:
    _needs_torch()
    return measure_inference(TINY_LLAMA, **SMALL_PLAN, dtype="bf16", allocator=PINNED)


@pytest.mark.torch
@pytest.mark.slow
def test_inference_peak_is_the_weights_plus_a_little(small_inference: MeasuredMemory) -> None:
    param_bytes = TINY_PARAMS * 2  # bf16
    assert small_inference.tensors_at_rest["params"] == param_bytes
    assert small_inference.tensors_at_rest["grads"] == 0
    assert small_inference.tensors_at_rest["optimizer"] == 0
    # plus the first run's own buffers that the tiny warm-up does not make: a few MiB
    assert 1.01 * param_bytes < small_inference.model_bytes < 1.05 * param_bytes + 8 * 2**20
    assert (
        small_inference.model_bytes == small_inference.peak_bytes - small_inference.baseline_bytes
    )
    assert small_inference.baseline_bytes > 50 * 2**20  # interpreter + torch libraries
    assert small_inference.device == "cpu"
    assert small_inference.seconds > 0


@pytest.mark.torch
@pytest.mark.slow
def test_inference_with_4x_the_tokens_needs_more(small_inference: MeasuredMemory) -> None:
    bigger = measure_inference(TINY_LLAMA, **{**SMALL_PLAN, "batch": 4}, dtype="bf16",
                               allocator=PINNED)
    assert bigger.model_bytes > small_inference.model_bytes


TRAINING_PLAN = {"batch": 2, "seq": 64, "dtype": "fp32", "optimizer": "adamw", "steps": 1}


@pytest.fixture(scope="module")
def adamw_training() -> MeasuredMemory:
    _needs_torch()
    return measure_training(TINY_LLAMA, **TRAINING_PLAN, allocator=PINNED)


@pytest.mark.torch
@pytest.mark.slow
def test_training_adamw_holds_weights_grads_and_two_states(
    adamw_training: MeasuredMemory,
) -> None:
    param_bytes = TINY_PARAMS * 4
    assert adamw_training.tensors_at_rest["params"] == param_bytes
    assert adamw_training.tensors_at_rest["grads"] == 0  # zero_grad(set_to_none=True)
    # exp_avg and exp_avg_sq, plus one 4-byte step counter per parameter tensor
    assert 2 * param_bytes <= adamw_training.tensors_at_rest["optimizer"] < 2 * param_bytes + 4096
    assert adamw_training.model_bytes > 4 * param_bytes


@pytest.mark.torch
@pytest.mark.slow
def test_repeated_measurements_agree_within_2_percent(adamw_training: MeasuredMemory) -> None:
    # Repeats differ by up to ~1 MB whatever the model (Python and malloc heap pages), so the
    # check uses the ~78 MB training run: on the ~10 MB inference run 1 MB would be 10%.
    again = measure_training(TINY_LLAMA, **TRAINING_PLAN, allocator=PINNED)
    assert again.model_bytes == pytest.approx(adamw_training.model_bytes, rel=0.02)
    assert again.tensors_at_rest == adamw_training.tensors_at_rest


@pytest.mark.torch
@pytest.mark.slow
def test_a_default_process_holds_at_least_the_live_tensors(adamw_training: MeasuredMemory) -> None:
    default = measure_training(TINY_LLAMA, **TRAINING_PLAN)  # glibc, nothing set
    assert default.allocator == "glibc" and adamw_training.allocator == PINNED
    assert "warm-up on a tiny model" in default.method
    assert default.tensors_at_rest == adamw_training.tensors_at_rest
    assert default.model_bytes > 0.9 * adamw_training.model_bytes
    assert default.malloc["heap_bytes"] > 0 and default.malloc["mapped_bytes"] > 0


@pytest.mark.torch
@pytest.mark.slow
def test_bad_config_fails_with_the_reason() -> None:
    _needs_torch()
    with pytest.raises(RuntimeError, match="failed: .*unknown model_type 'no-such-model'"):
        measure_inference({"model_type": "no-such-model"}, batch=1, prompt_tokens=8, new_tokens=2)


def test_config_without_model_type_is_refused_before_any_run() -> None:
    with pytest.raises(RuntimeError, match="model_type"):
        measure_inference({"hidden_size": 8}, batch=1, prompt_tokens=8, new_tokens=2)


def test_bad_arguments_are_refused_before_any_run() -> None:
    with pytest.raises(ValueError, match="dtype"):
        measure_inference(TINY_LLAMA, batch=1, prompt_tokens=8, new_tokens=2, dtype="mixed-bf16")
    with pytest.raises(ValueError, match="optimizer"):
        measure_training(TINY_LLAMA, batch=1, seq=8, optimizer="lion")
    with pytest.raises(ValueError, match="batch"):
        measure_training(TINY_LLAMA, batch=0, seq=8)


def test_qlora_on_cpu_is_refused() -> None:
    with pytest.raises(RuntimeError, match="CUDA"):
        measure_training(TINY_LLAMA, batch=1, seq=8, finetune="qlora")


@pytest.mark.skipif(importlib.util.find_spec("peft") is not None, reason="peft is installed")
def test_lora_without_peft_says_so() -> None:
    with pytest.raises(RuntimeError, match="LoRA validation needs peft"):
        measure_training(TINY_LLAMA, batch=1, seq=8, finetune="lora")


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bnb installed")
def test_adamw8bit_without_bitsandbytes_says_so() -> None:
    with pytest.raises(RuntimeError, match="bitsandbytes and a CUDA GPU"):
        measure_training(TINY_LLAMA, batch=1, seq=8, optimizer="adamw8bit")


def test_the_module_imports_no_torch(heavy_imports) -> None:
    assert heavy_imports("import gpuwise.measure.runs.memory_run", ("torch",)) == []


def test_the_result_is_the_last_json_line_of_stdout() -> None:
    stdout = 'some library noise\n{"peak_bytes": 3}\nnot json\n'
    assert last_json_line(stdout) == {"peak_bytes": 3}
    assert last_json_line("nothing here") is None
