"""Serving runtimes' memory (llama.cpp, vLLM) and the CLI on checkpoint files."""

from __future__ import annotations

import json

import pytest

from gpuwise.catalog.hardware import find_hardware
from gpuwise.catalog.models import resolve_model
from gpuwise.cli import main
from gpuwise.estimate.inference import estimate_inference
from gpuwise.estimate.plans import InferencePlan, StoredWeights
from gpuwise.helpers import MIB, GpuwiseError
from gpuwise.workload import from_config

LLAMA3_8B = from_config(resolve_model("llama-3.1-8b").config, "llama-3.1-8b")


def test_llama_cpp_matches_a_logged_llama3_8b_context():
    # llama.cpp log (Llama-3-8B Q4_K_M, n_ctx 8192, n_ubatch 512, flash_attn 0, CUDA):
    # "CUDA0 KV buffer size = 1024.00 MiB", "CUDA0 compute buffer size = 560.00 MiB",
    # "CPU buffer size = 281.81 MiB" (token_embd kept on the host)
    plan = InferencePlan(runtime="llama.cpp", context_alloc=8192, attention="eager",
                         stored_weights=StoredWeights(4_653_000_000, 295_501_824, "Q4_K"))  # fmt: skip
    est = estimate_inference(LLAMA3_8B, plan, find_hardware("rtx-4090"))
    assert est.breakdown["kv_cache"] == 1024 * MIB
    assert est.breakdown["activations"] == 560 * MIB
    assert est.breakdown["weights"] == 4_653_000_000 - 295_501_824
    assert sum(est.breakdown.values()) == est.total_bytes


def test_llama_cpp_pads_context_and_grows_with_sequences():
    hw = find_hardware("rtx-4090")
    one = estimate_inference(LLAMA3_8B, InferencePlan(runtime="llama.cpp", context_alloc=1000), hw)
    assert one.breakdown["kv_cache"] == 1024 * 128 * 1024  # padded to 1024 cells, 128 KiB each
    four = InferencePlan(runtime="llama.cpp", context_alloc=1000, batch=4, prompt_tokens=900,
                         new_tokens=100)  # fmt: skip
    assert estimate_inference(LLAMA3_8B, four, hw).breakdown["kv_cache"] == 4 * 1024 * 128 * 1024
    with pytest.raises(GpuwiseError, match="KV cache type"):
        estimate_inference(LLAMA3_8B, InferencePlan(runtime="llama.cpp", kv_dtype="q3_k"), hw)


def test_vllm_budget_and_pool():
    hw = find_hardware("h100")
    est = estimate_inference(LLAMA3_8B, InferencePlan(runtime="vllm", context_alloc=8192), hw)
    assert est.fits and sum(est.breakdown.values()) == est.total_bytes
    budget = est.capacity_bytes - 512 * MIB
    assert abs(est.total_bytes - est.capacity_bytes) <= 8  # the pool fills the budget
    assert budget == pytest.approx(0.9 * hw.memory_bytes, abs=1)
    lower = InferencePlan(runtime="vllm", context_alloc=8192, gpu_memory_utilization=0.5)
    assert (
        estimate_inference(LLAMA3_8B, lower, hw).breakdown["kv_cache"] < est.breakdown["kv_cache"]
    )
    # 128K max_model_len does not fit a 24 GB card's pool: vLLM refuses to start
    small = estimate_inference(LLAMA3_8B, InferencePlan(runtime="vllm"), find_hardware("rtx-4090"))
    assert not small.fits and any("refuses to start" in n for n in small.notes)
    with pytest.raises(GpuwiseError, match="GPUs"):
        estimate_inference(LLAMA3_8B, InferencePlan(runtime="vllm"), _cpu())


def _cpu():
    from dataclasses import replace

    return replace(find_hardware("rtx-4090"), kind="cpu")


def _run(args, capsys):
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_infer_gguf_under_each_runtime(tmp_path, capsys):
    checkpoint_files = pytest.importorskip("checkpoint_files")
    path = tmp_path / "tiny.gguf"
    written = checkpoint_files.write_gguf(path, [checkpoint_files.Q.Q4_K])
    base = ["infer", str(path), "--on", "rtx-4090", "--json", "--prompt", "64", "--new-tokens", "8"]
    code, out, err = _run([*base, "--runtime", "llama.cpp", "--ctx", "300"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    assert rec["weights_source"].startswith("checkpoint (exact bytes)")
    assert rec["memory"]["breakdown"]["weights"] == sum(written.values())  # tied: all on the GPU
    assert rec["memory"]["breakdown"]["kv_cache"] == 512 * 2 * 2 * 2 * 16 * 2  # n_ctx 512
    assert rec["checkpoint"]["total_bytes"] == sum(written.values())
    code, out, _ = _run([*base, "--runtime", "vllm"], capsys)
    assert code == 0 and json.loads(out)["runtime"] == "vllm"
    code, out, _ = _run(base, capsys)  # transformers dequantises GGUF: estimated
    assert code == 0 and json.loads(out)["weights_source"].startswith("estimated")
    code, out, _ = _run(
        ["check", str(path), "--on", "rtx-4090", "--runtime", "llama.cpp", "--json"], capsys
    )
    assert code == 0 and json.loads(out)["precisions"][0]["weights"] == "Q4_K (gguf), exact"


def test_cli_safetensors_folder_and_errors(tmp_path, capsys):
    checkpoint_files = pytest.importorskip("checkpoint_files")
    cfg = resolve_model("llama-3.1-8b").config
    small = {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(small))
    written = checkpoint_files.write_safetensors(
        tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("bfloat16", [96, 64], 12288)}
    )
    code, out, err = _run(["infer", str(tmp_path), "--on", "h100", "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    assert rec["memory"]["breakdown"]["weights"] == written
    assert rec["weights_source"] == "checkpoint (exact bytes): BF16 (safetensors)"
    code, _, err = _run(["infer", str(tmp_path), "--runtime", "llama.cpp", "--on", "h100"], capsys)
    assert code == 2 and "GGUF" in err and "Traceback" not in err
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    code, _, err = _run(["infer", str(bad), "--runtime", "llama.cpp"], capsys)
    assert code == 2 and err.startswith("error:") and "Traceback" not in err
    code, _, err = _run(["infer", "llama-3.1-8b", "--runtime", "tgi"], capsys)
    assert code == 2 and "runtime" in err
