"""Checkpoint readers: exact bytes for files written here with the real libraries, quantised
layouts recognised, hostile files refused with a clear error, and the CLI on checkpoints."""

from __future__ import annotations

import json
import struct
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")
checkpoint_files = pytest.importorskip("checkpoint_files")

from checkpoint_files import (  # noqa: E402
    Q,
    awq_layer,
    gptq_layer,
    header_bytes,
    write_gguf,
    write_safetensors,
)

from gpuwise.catalog.checkpoints import read_checkpoint  # noqa: E402
from gpuwise.errors import GpuwiseError  # noqa: E402
from gpuwise.workload import from_config  # noqa: E402

DTYPES = {
    "f32": ("float32", [3, 5], 60), "f16": ("float16", [4, 4], 32),
    "bf16": ("bfloat16", [2, 8], 32), "i8": ("int8", [7], 7), "u8": ("uint8", [3, 3], 9),
    "i32": ("int32", [2, 3], 24), "f64": ("float64", [2], 16),
    "fp8": ("float8_e4m3fn", [4, 4], 16), "fp8b": ("float8_e5m2", [8], 8),
    "fp4": ("float4_e2m1fn_x2", [2, 4], 8),
}
GGUF_TYPES = [Q.Q4_0, Q.Q4_K, Q.Q8_0, Q.Q6_K, Q.F16, Q.F32, Q.Q5_K, Q.Q2_K, Q.IQ4_NL]


def test_safetensors_bytes_equal_the_files_own_offsets(tmp_path):
    path = tmp_path / "model.safetensors"
    written = write_safetensors(path, DTYPES)
    ckpt = read_checkpoint(path)
    by_name = {t.name: t.stored_bytes for t in ckpt.tensors}
    assert by_name == header_bytes(path)
    assert ckpt.total_bytes == written
    assert {t.name: t.dtype for t in ckpt.tensors}["bf16"] == "BF16"
    assert ckpt.config is None


def test_sharded_folder_with_index_and_config(tmp_path):
    a = {"model.embed_tokens.weight": ("bfloat16", [96, 64], 96 * 64 * 2)}
    b = {
        "model.norm.weight": ("float32", [64], 256),
        "lm_head.weight": ("float16", [96, 64], 96 * 128),
    }
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", a)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", b)
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in a},
                  **{k: "model-00002-of-00002.safetensors" for k in b}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.total_bytes == 96 * 64 * 2 + 256 + 96 * 128
    assert len(ckpt.files) == 2 and ckpt.config_source == "config.json"
    assert ckpt.bytes_by_dtype()["BF16"] == 96 * 64 * 2


def test_index_must_not_point_outside_its_folder(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(GpuwiseError, match="outside the model folder"):
        read_checkpoint(tmp_path)


def test_gptq_and_awq_layers_recognised_with_logical_shape_and_bits(tmp_path):
    specs = {**gptq_layer("l0.q_proj", out=256, inp=512),
             **gptq_layer("l0.down_proj", out=128, inp=256, bits=8, group=64),
             **awq_layer("l1.q_proj", out=256, inp=512),
             "l0.norm.weight": ("float16", [256], 512)}
    path = tmp_path / "q.safetensors"
    write_safetensors(path, specs)
    ckpt = read_checkpoint(path)
    found = {q.name: q for q in ckpt.quantised}
    g4, g8, awq = found["l0.q_proj"], found["l0.down_proj"], found["l1.q_proj"]
    assert (g4.scheme, g4.bits, g4.logical_shape, g4.group_size) == ("gptq", 4, (256, 512), 128)
    assert (g8.scheme, g8.bits, g8.logical_shape, g8.group_size) == ("gptq", 8, (128, 256), 64)
    assert (awq.scheme, awq.bits, awq.logical_shape, awq.group_size) == ("awq", 4, (256, 512), 128)
    parts = header_bytes(path)
    assert g4.stored_bytes == sum(v for k, v in parts.items() if k.startswith("l0.q_proj."))
    assert ckpt.total_bytes == sum(parts.values())
    assert 4.0 < g4.bits_per_weight < 4.5  # packed values plus fp16 scales and zeros per group
    assert ckpt.logical_params == 256 * 512 * 2 + 128 * 256 + 256


def test_bitsandbytes_layouts(tmp_path):
    specs = {"l.weight": ("int8", [64, 32], 2048), "l.SCB": ("float32", [64], 256),
             "m.weight": ("uint8", [1024, 1], 1024), "m.weight.absmax": ("float32", [32], 128),
             "m.weight.quant_map": ("float32", [16], 64),
             "m.weight.quant_state.bitsandbytes__nf4": ("uint8", [90], 90)}
    path = tmp_path / "bnb.safetensors"
    write_safetensors(path, specs)
    found = {q.name: q for q in read_checkpoint(path).quantised}
    assert (found["l"].scheme, found["l"].bits, found["l"].stored_bytes) == ("bnb-int8", 8, 2304)
    nf4 = found["m"]
    assert (nf4.scheme, nf4.elements, nf4.group_size) == ("bnb-nf4", 2048, 64)
    assert nf4.stored_bytes == 1024 + 128 + 64 + 90


def test_gguf_bytes_equal_what_was_written_for_every_type(tmp_path):
    path = tmp_path / "m.gguf"
    written = write_gguf(path, GGUF_TYPES)
    ckpt = read_checkpoint(path)
    assert {t.name: t.stored_bytes for t in ckpt.tensors} == written
    types = {t.name: t.dtype for t in ckpt.tensors}
    assert [types[f"blk.{i}.ffn_up.weight"] for i in range(len(GGUF_TYPES))] == [
        q.name for q in GGUF_TYPES]
    q4k = next(q for q in ckpt.quantised if q.scheme == "Q4_K")
    assert (q4k.bits, q4k.logical_shape, q4k.bits_per_weight) == (4, (128, 256), 4.5)
    assert path.stat().st_size >= ckpt.total_bytes


def test_gguf_metadata_gives_the_architecture(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, [Q.Q4_0], vocab=96, tied=False)
    ckpt = read_checkpoint(path)
    arch = from_config(ckpt.config, "m")
    assert (arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads) == (64, 2, 4, 2)
    assert (arch.intermediate_size, arch.vocab_size, arch.max_position) == (128, 96, 512)
    assert not arch.tie_embeddings and ckpt.config_source == "GGUF metadata"


# --- malformed and hostile files -----------------------------------------------------------


def _valid_safetensors(tmp_path):
    path = tmp_path / "ok.safetensors"
    write_safetensors(path, {"a": ("float16", [4, 4], 32), "b": ("int32", [8], 32)})
    return path.read_bytes()


def _safetensors_with_header(tmp_path, header: dict, data: bytes = b"\0" * 32):
    raw = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("case", ["truncated", "header_too_long", "absurd_shape",
                                  "unknown_dtype", "empty", "not_json"])
def test_malformed_safetensors_clear_error(tmp_path, case):
    good = _valid_safetensors(tmp_path)
    if case == "truncated":
        path = tmp_path / "bad.safetensors"
        path.write_bytes(good[: len(good) - 10])
    elif case == "header_too_long":
        path = tmp_path / "bad.safetensors"
        path.write_bytes(struct.pack("<Q", 1 << 62) + good[8:])
    elif case == "absurd_shape":
        path = _safetensors_with_header(
            tmp_path, {"a": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 32]}}
        )
    elif case == "unknown_dtype":
        path = _safetensors_with_header(
            tmp_path, {"a": {"dtype": "X99", "shape": [8], "data_offsets": [0, 32]}}
        )
    elif case == "empty":
        path = tmp_path / "bad.safetensors"
        path.write_bytes(b"")
    else:
        path = tmp_path / "bad.safetensors"
        path.write_bytes(struct.pack("<Q", 5) + b"{{{{{" + b"\0" * 8)
    with pytest.raises(GpuwiseError, match="safetensors"):
        read_checkpoint(path)


def _valid_gguf(tmp_path):
    path = tmp_path / "ok.gguf"
    write_gguf(path, [Q.Q4_0, Q.F16])
    return path, path.read_bytes()


def _rewrite(tmp_path, data: bytes):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    return path


def test_gguf_bad_magic_and_truncation(tmp_path):
    _, good = _valid_gguf(tmp_path)
    with pytest.raises(GpuwiseError, match="GGUF"):
        read_checkpoint(_rewrite(tmp_path, b"GGUX" + good[4:]))
    for cut in (3, 20, len(good) // 3, len(good) - 5):
        with pytest.raises(GpuwiseError, match="GGUF"):
            read_checkpoint(_rewrite(tmp_path, good[:cut]))


def test_gguf_huge_counts_fail_fast_without_allocating(tmp_path):
    _, good = _valid_gguf(tmp_path)
    # tensor count and metadata count (bytes 8..24) far beyond what the file holds
    for offset in (8, 16):
        data = good[:offset] + struct.pack("<Q", 1 << 60) + good[offset + 8 :]
        with pytest.raises(GpuwiseError, match="more than the file"):
            read_checkpoint(_rewrite(tmp_path, data))


def _gguf_with_array(tmp_path, length: int, item_type: int = 4):
    """A GGUF header with one metadata array whose length field says `length`."""
    key = b"x.arr"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, item_type, length)
    body += b"\0" * 64
    return _rewrite(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)


def test_gguf_array_length_past_the_file_is_refused(tmp_path):
    # gguf's own reader would loop on empty reads here for ever
    for item_type in (4, 8, 9):  # uint32, string, nested array
        with pytest.raises(GpuwiseError, match="more than the file can hold"):
            read_checkpoint(_gguf_with_array(tmp_path, 1 << 40, item_type))


def _tensor_info_offset(good: bytes, name: bytes) -> int:
    return good.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)


def test_gguf_unknown_type_and_absurd_shape(tmp_path):
    _, good = _valid_gguf(tmp_path)
    at = _tensor_info_offset(good, b"blk.1.ffn_up.weight")  # n_dims u32, dims u64 x2, type u32
    bad_type = good[: at + 20] + struct.pack("<I", 99) + good[at + 24 :]
    with pytest.raises(GpuwiseError, match="unknown ggml type 99"):
        read_checkpoint(_rewrite(tmp_path, bad_type))
    huge = good[: at + 4] + struct.pack("<QQ", 1 << 40, 1 << 40) + good[at + 20 :]
    with pytest.raises(GpuwiseError, match="absurd shape"):
        read_checkpoint(_rewrite(tmp_path, huge))
    dims = good[:at] + struct.pack("<I", 5) + good[at + 4 :]
    with pytest.raises(GpuwiseError, match="dimensions"):
        read_checkpoint(_rewrite(tmp_path, dims))


def test_missing_gguf_package_says_how_to_install(tmp_path, monkeypatch):
    path, _ = _valid_gguf(tmp_path)
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(GpuwiseError, match="gguf package") as err:
        read_checkpoint(path)
    assert "pip install" in err.value.hint


def test_checkpoint_without_config_is_a_clear_error(tmp_path):
    from gpuwise.catalog.models import resolve_model

    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"a": ("float16", [4], 8)})
    with pytest.raises(GpuwiseError, match="config.json"):
        resolve_model(str(path))


# --- fuzzing: any mutation or truncation of a valid file reads or fails cleanly -------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
mutations = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6)


def _mutated(good: bytes, changes: list[tuple[int, int]], cut: int) -> bytes:
    data = bytearray(good[: max(0, len(good) - cut)])
    for at, value in changes:
        if data:
            data[at % len(data)] = value
    return bytes(data)


def _reads_or_refuses(path) -> None:
    try:
        ckpt = read_checkpoint(path)
    except GpuwiseError as exc:
        assert exc.message and exc.hint
        return
    assert ckpt.total_bytes <= 1 << 50


@FUZZ
@given(changes=mutations, cut=st.integers(0, 64))
def test_fuzz_safetensors(tmp_path, changes, cut):
    good = _valid_safetensors(tmp_path)
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(_mutated(good, changes, cut))
    _reads_or_refuses(path)


@FUZZ
@given(changes=mutations, cut=st.integers(0, 4096))
def test_fuzz_gguf(tmp_path, changes, cut):
    path, good = _valid_gguf(tmp_path)
    # aim half the mutations at the header, where the counts and offsets live
    header = [(at % 600, v) if i % 2 else (at, v) for i, (at, v) in enumerate(changes)]
    bad = tmp_path / "fuzz.gguf"
    bad.write_bytes(_mutated(good, header, cut))
    _reads_or_refuses(bad)


def test_gguf_metadata_arrays_read_without_walking_elements(tmp_path):
    import gguf

    path = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"t{i}" for i in range(1000)])
    w.add_array("llama.attention.head_count", [4, 8, 4])
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from gpuwise.catalog.checkpoints.gguf_config import metadata_values
    from gpuwise.catalog.checkpoints.gguf_reader import _open

    gg, reader = _open(path)
    values = metadata_values(gg, reader)
    assert values["tokenizer.ggml.tokens.length"] == 1000
    assert values["llama.attention.head_count"] == [4, 8, 4]


@pytest.mark.torch
@pytest.mark.slow
def test_transformers_save_pretrained_shards_read_exactly(tmp_path):
    """A real Hugging Face layout: a tiny Llama saved sharded in bf16 by transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpuwise.catalog.models import resolve_model

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    expected = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    resolved = resolve_model(str(tmp_path))
    ckpt = resolved.checkpoint
    assert resolved.origin == "checkpoint" and len(ckpt.files) > 1
    assert ckpt.total_bytes == expected and set(ckpt.bytes_by_dtype()) == {"BF16"}
    assert ckpt.logical_params == sum(p.numel() for p in model.parameters())
