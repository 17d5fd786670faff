"""The random-weight GGUF writer (needs gguf and numpy), the errors of the llama.cpp helpers,
and one real tiny llama.cpp timing (`--slow`, needs llama-cpp-python)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, qtype_key, tensor_shapes

TINY = GgufConfig(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=300, ctx=512)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    pytest.importorskip("numpy")
    from gpuwise.measure.llama_cpp.gguf_model import write_random_gguf

    return write_random_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", TINY, seed=3)


def test_parameter_count() -> None:
    h, kv, f, v = 64, 32, 128, 300
    per_layer = 2 * h + h * h + 2 * kv * h + h * h + 3 * f * h
    assert TINY.params == 2 * v * h + 2 * per_layer + h
    assert TINY.name == "h64-l2" and TINY.head_dim == 16 and TINY.kv_dim == kv


def test_bad_configs_are_refused() -> None:
    with pytest.raises(GpuwiseError):
        GgufConfig(hidden=64, layers=2, heads=5, kv_heads=1, ffn=128)
    with pytest.raises(GpuwiseError):
        GgufConfig(hidden=64, layers=2, heads=4, kv_heads=3, ffn=128)
    with pytest.raises(GpuwiseError, match="vocab"):
        GgufConfig(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=100)


def test_round_trip_through_the_reader(tiny_gguf: Path) -> None:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(tiny_gguf)
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors) == [name for name, _ in tensor_shapes(TINY)]
    for name, shape in tensor_shapes(TINY):
        tensor = tensors[name]
        assert tuple(int(d) for d in tensor.shape) == tuple(reversed(shape)), name  # ggml order
        expected = "F32" if len(shape) == 1 else "F16"
        assert gguf.GGMLQuantizationType(tensor.tensor_type).name == expected
    assert sum(int(t.n_elements) for t in reader.tensors) == TINY.params
    q = np.asarray(tensors["blk.0.attn_q.weight"].data, dtype=np.float32)
    assert q.shape == (64, 64) and 0.015 < float(q.std()) < 0.025
    assert np.all(np.asarray(tensors["output_norm.weight"].data) == 1.0)


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def test_metadata_and_tokenizer(tiny_gguf: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(tiny_gguf)
    expected = {
        "general.architecture": "llama", "llama.context_length": 512,
        "llama.embedding_length": 64, "llama.block_count": 2, "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 16, "general.file_type": 1,
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    }
    for key, value in expected.items():
        assert _field(reader, key) == value, key
    eps = _field(reader, "llama.attention.layer_norm_rms_epsilon")
    assert math.isclose(eps, 1e-5, rel_tol=1e-6)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(types, list)
    assert len(tokens) == len(types) == len(_field(reader, "tokenizer.ggml.scores")) == 300
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<0x00>"] and tokens[258] == "<0xFF>"
    assert types[3:259] == [6] * 256 and len(set(tokens)) == 300


def test_qtype_names() -> None:
    assert qtype_key("Q4_K_M") == "q4_k_m" and qtype_key("q8-0") == "q8_0"
    with pytest.raises(GpuwiseError) as err:
        qtype_key("q4_km")
    assert "q4_k_m" in err.value.hint


def test_unknown_qtype_and_missing_files_are_refused(tmp_path: Path) -> None:
    from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_llama_cpp
    from gpuwise.measure.llama_cpp.gguf_model import quantize

    missing = tmp_path / "none.gguf"
    with pytest.raises(GpuwiseError, match="unknown quantization type"):
        quantize(missing, tmp_path / "out.gguf", "q3_xyz")
    with pytest.raises(GpuwiseError, match="no GGUF file"):
        quantize(missing, tmp_path / "out.gguf", "q8_0")
    with pytest.raises(GpuwiseError, match="no GGUF file"):
        time_llama_cpp(missing, threads=1)
    with pytest.raises(GpuwiseError, match="no GGUF file"):
        tensor_bytes(missing)


def test_f16_is_not_quantized(tiny_gguf: Path, tmp_path: Path) -> None:
    from gpuwise.measure.llama_cpp.gguf_model import quantize

    assert quantize(tiny_gguf, tmp_path / "x.gguf", "F16") == tiny_gguf


def test_tensor_bytes(tiny_gguf: Path) -> None:
    from gpuwise.measure.llama_cpp.bench import tensor_bytes

    got = tensor_bytes(tiny_gguf)
    f32 = (2 * 2 + 1) * 64 * 4
    assert got["by_type"] == {"F16": 2 * (TINY.params - 5 * 64), "F32": f32}
    assert got["total"] == sum(got["by_type"].values())
    assert got["token_embd"] == got["output"] == 300 * 64 * 2 and got["token_embd_row"] == 128
    assert got["per_token"] == got["total"] - got["token_embd"] + 128


@pytest.mark.slow
def test_real_tiny_timing(tiny_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_llama_cpp
    from gpuwise.measure.llama_cpp.gguf_model import quantize

    q8 = quantize(tiny_gguf, tmp_path / "tiny-q8_0.gguf", "q8_0")
    assert tensor_bytes(q8)["by_type"].keys() == {"F32", "Q8_0"}
    rec = time_llama_cpp(q8, threads=1, n_prompt=16, n_gen=4, reps=3, timeout_s=120)
    for key in ("pp_tokens_per_s", "tg_tokens_per_s", "pp_s", "tg_s_per_token"):
        assert math.isfinite(rec[key]) and rec[key] > 0, key
    assert rec["pp_tokens_per_s"] > rec["tg_tokens_per_s"]
    assert len(rec["pp_samples_s"]) == len(rec["tg_samples_s"]) == 3
    assert rec["file_bytes"] == q8.stat().st_size and "CPU" in rec["system_info"]
    only_tg = time_llama_cpp(q8, threads=1, n_prompt=0, n_gen=4, reps=1)
    assert only_tg["pp_tokens_per_s"] is None and only_tg["tg_tokens_per_s"] > 0


@pytest.mark.slow
def test_failed_and_overlong_children_raise(tiny_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from gpuwise.measure.llama_cpp.bench import time_llama_cpp

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    with pytest.raises(GpuwiseError, match="failed"):
        time_llama_cpp(junk, threads=1, n_prompt=4, n_gen=1, reps=1)
    with pytest.raises(GpuwiseError, match="longer than"):
        time_llama_cpp(tiny_gguf, threads=1, n_prompt=4, n_gen=1, reps=1, timeout_s=0.001)
