"""Formats of today (issue 40, item 3): every GGUF block type with its exact bits, llama.cpp's
file types as llama-quant.cpp mixes them, MXFP4, NVFP4 and block-scaled FP8, `fp4` refused as
ambiguous, and each format refused where no kernel runs it (estimate/capability.py)."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli as run

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.formats import ggml_types, weight_format, weight_formats
from gpuwise.catalog.runtime_speed import ggml_backend, ggml_like
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import kernel_here, plan_refusal
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.ggml_time import spec_ggml_rates
from gpuwise.workload import count_params, from_config
from gpuwise.workload.plans import InferencePlan

LLAMA_8B = from_config(resolve_model("llama-3.1-8b").config)
# llama.cpp tools/quantize/README.md, "meta-llama/Llama-3.1-8B": bits/weight of each file
README_BPW = {
    "iq1_s": 2.0042, "iq1_m": 2.1460, "iq2_xxs": 2.3824, "iq2_xs": 2.5882, "iq2_s": 2.7403,
    "iq2_m": 2.9294, "iq3_xxs": 3.2548, "iq3_xs": 3.4977, "iq3_s": 3.6606, "iq3_m": 3.7628,
    "iq4_xs": 4.4597, "iq4_nl": 4.6818, "q2_k_s": 2.9697, "q2_k": 3.1593, "q3_k_s": 3.6429,
    "q3_k_l": 4.2979, "q4_k_s": 4.6672, "q4_k_m": 4.8944, "q5_k_s": 5.5704, "q5_k_m": 5.7036,
    "q6_k": 6.5633, "q8_0": 8.5008,
}
# the same table's sizes (GiB)
README_GIB = {"iq4_xs": 4.17, "q4_k_s": 4.36, "q4_k_m": 4.58, "q3_k_s": 3.41, "q3_k_l": 4.02}


def bits_a_weight(weights: str) -> float:
    return weight_bytes(LLAMA_8B, weights) * 8 / count_params(LLAMA_8B).total


def test_every_gguf_block_type_has_ggmls_exact_size():
    gguf = pytest.importorskip("gguf")
    sizes = {t.name.lower(): s for t, s in gguf.constants.GGML_QUANT_SIZES.items()}
    for t in ggml_types().values():
        if t.id in sizes:  # a gguf older than the catalogue may lack the newest types
            assert (t.block, t.bytes) == sizes[t.id], t.id
    # every type a GGUF stores weights in is listed (Q8_1 and Q8_K hold activations only;
    # the integer and f64 types are not weights)
    stored = {n for n in sizes if n not in ("q8_1", "q8_k", "i8", "i16", "i32", "i64", "f64")}
    assert stored <= set(ggml_types())


def test_block_types_bits_as_ggml_lays_them_out():
    bits = {t: ggml_types()[t].bits for t in ggml_types()}
    assert bits["q4_0"] == 4.5 and bits["q8_0"] == 8.5 and bits["q4_k"] == 4.5
    assert bits["q2_k"] == 2.625 and bits["q3_k"] == 3.4375 and bits["q6_k"] == 6.5625
    assert bits["iq4_xs"] == 4.25 and bits["iq2_xxs"] == 2.0625 and bits["iq1_s"] == 1.5625
    assert bits["tq1_0"] == 1.6875 and bits["tq2_0"] == 2.0625
    assert bits["mxfp4"] == 4.25 and bits["nvfp4"] == 4.5


@pytest.mark.parametrize("weights", sorted(README_BPW))
def test_each_gguf_file_type_has_the_bits_llama_cpp_publishes_for_llama_3_1_8b(weights):
    """The mixes (the main type, the shares llama-quant.cpp gives other types, the embeddings'
    and head's types) reproduce the quantize README's bits a weight to the fourth decimal."""
    assert bits_a_weight(weights) == pytest.approx(README_BPW[weights], abs=3e-4)


def test_named_mixes_fit_the_published_file_sizes():
    for weights, gib in README_GIB.items():
        assert weight_bytes(LLAMA_8B, weights) / 2**30 == pytest.approx(gib, abs=0.01), weights


def test_q3_k_m_follows_llama_quant_cpps_rule():
    """Q3_K_M is not in the README's table: its rule (llama-quant.cpp) gives attn_v Q5_K in the
    first two layers and Q4_K after, ffn_down Q5_K in the first sixteenth of the layers and
    Q4_K after, attn_output Q4_K, Q3_K elsewhere; token_embd Q3_K, output Q6_K."""
    a = LLAMA_8B
    layers, d, kv, ffn = a.num_layers, a.hidden_size, a.kv_dim, a.intermediate_size
    q5 = 2 * d * kv + layers // 16 * d * ffn
    q4 = (layers - 2) * d * kv + (layers - layers // 16) * d * ffn + layers * d * a.q_dim
    linear = count_params(a).linear
    fmt = weight_format("q3_k_m")
    assert dict(fmt.mix) == pytest.approx({"q4_k": q4 / linear, "q5_k": q5 / linear}, abs=1e-4)
    bits = ggml_types()
    expected = (q5 * bits["q5_k"].bits + q4 * bits["q4_k"].bits
                + (linear - q4 - q5) * bits["q3_k"].bits) / linear
    assert fmt.matrix_bits == pytest.approx(expected, abs=1e-3)
    assert (fmt.embd_bits, fmt.head_bits) == (bits["q3_k"].bits, bits["q6_k"].bits)
    assert README_BPW["q3_k_s"] < bits_a_weight("q3_k_m") < README_BPW["q3_k_l"]


def test_every_gguf_file_type_is_named_without_the_file():
    names = ("q2_k", "q2_k_s", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s",
             "q5_k_m", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq1_s", "iq1_m",
             "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs", "iq3_s", "iq3_m",
             "iq4_nl", "iq4_xs", "tq1_0", "tq2_0")
    for name in names:
        fmt = weight_format(name.upper())
        assert fmt.gguf and fmt.ggml_type in ggml_types(), name
    assert set(names) <= set(weight_formats())
    assert weight_format("q3-k").id == "q3_k_m"  # llama-quantize's alias
    assert weight_format("bf16").ggml_type == "bf16"


def test_a_tied_head_quantises_the_embeddings_as_the_output():
    small = from_config(resolve_model("llama-3.2-1b").config)
    assert small.tie_embeddings
    c = count_params(small)
    fmt = weight_format("q4_k_m")
    embedded = weight_bytes(small, fmt) - c.linear * fmt.matrix_bits / 8
    vectors = (c.total - c.linear - c.embedding) * 4.0
    assert embedded - vectors == pytest.approx(c.embedding * fmt.head_bits / 8, rel=1e-9)


def test_block_scaled_floats_bits():
    assert weight_format("mxfp4").matrix_bits == 4.25
    assert weight_format("nvfp4").matrix_bits == 4.5
    assert weight_format("fp8-block").matrix_bits == pytest.approx(8 + 32 / (128 * 128))


def test_mxfp4_matrices_are_4_25_sixteenths_of_bf16s():
    c = count_params(LLAMA_8B)
    rest = (c.total - c.linear) * 2.0  # embeddings, head and norms stay in bf16
    ratio = (weight_bytes(LLAMA_8B, "mxfp4") - rest) / (weight_bytes(LLAMA_8B, "bf16") - rest)
    assert ratio == pytest.approx(4.25 / 16, rel=1e-12)


def test_fp4_is_ambiguous_and_says_which_4_bit_formats_exist(capsys):
    with pytest.raises(GpuwiseError, match="ambiguous") as err:
        weight_format("fp4")
    for name in ("nf4", "mxfp4", "nvfp4", "int4", "bitsandbytes", "GPTQ/AWQ"):
        assert name in err.value.message, name
    assert "did you mean" in err.value.hint and "'nvfp4'" in err.value.hint
    assert "fp4" not in weight_format("nf4").aliases
    code, out, err_text = run(["infer", "llama-3.1-8b", "--on", "b200", "--weights", "fp4"], capsys)
    assert code == 2
    assert "fp4 is ambiguous" in out + err_text and "did you mean" in out + err_text


def test_llama_cpp_runs_an_iq_type_named_without_the_file(capsys):
    code, out, _ = run(["infer", "llama-3.1-8b", "--runtime", "llama.cpp", "--weights", "iq4_xs",
                        "--on", "rtx-4090", "--json"], capsys)
    assert code == 0, out
    answer = json.loads(out)
    assert answer["plan"]["weights"] == "iq4_xs" and answer["time"]["kernel"] == "iq4_xs"
    # the device holds the file less token_embd (in IQ4_XS, as the file stores it)
    embd = LLAMA_8B.vocab_size * LLAMA_8B.hidden_size * ggml_types()["iq4_xs"].bits / 8
    gpu = answer["memory"]["breakdown"]["weights"]
    assert gpu == pytest.approx(weight_bytes(LLAMA_8B, "iq4_xs") - embd, rel=1e-9)
    _, q4, _ = run(["infer", "llama-3.1-8b", "--runtime", "llama.cpp", "--weights", "q4_k_m",
                    "--on", "rtx-4090", "--json"], capsys)
    q4_decode = json.loads(q4)["time"]["decode_s_per_token"]
    assert answer["time"]["decode_s_per_token"] < q4_decode  # fewer bytes, nearly Q4_K's rate


def test_types_without_constants_are_timed_as_a_calibrated_one_times_its_factors():
    rates = rates_from_spec(find_hardware("rtx-4090"))
    cuda = ggml_backend("gpu")
    q4k = spec_ggml_rates(rates, cuda, "q4_k", 1)
    for gtype in ("iq2_xxs", "iq4_xs", "q3_k"):
        like = ggml_like()[gtype]
        assert like.like == "q4_k" and like.source
        g = spec_ggml_rates(rates, cuda, gtype, 1)
        assert g.weight_bytes_per_s == pytest.approx(q4k.weight_bytes_per_s * like.memory)
        assert g.matmul_flops == pytest.approx(q4k.matmul_flops * like.matmul)
    assert ggml_like()["iq2_xxs"].memory < ggml_like()["iq4_xs"].memory < 1.0


def test_ternary_types_have_no_cuda_kernel_and_run_on_a_cpu():
    plan = InferencePlan(weights="tq1_0", runtime="llama.cpp")
    refused = plan_refusal(plan, find_hardware("rtx-4090"))
    assert refused is not None and "TQ1_0" in refused.what and "CPU" in refused.why
    assert plan_refusal(plan, find_hardware("cpu-cloud-32vcpu")) is None
    assert plan_refusal(InferencePlan(weights="iq1_s", runtime="llama.cpp"),
                        find_hardware("rtx-4090")) is None  # IQ types have CUDA kernels


def plan(weights: str, runtime: str = "vllm") -> InferencePlan:
    return InferencePlan(weights=weights, runtime=runtime)


def test_mxfp4_runs_natively_on_blackwell_and_weight_only_from_ampere():
    mxfp4 = plan("mxfp4")
    assert plan_refusal(mxfp4, find_hardware("b200")) is None
    assert kernel_here(mxfp4, find_hardware("b200")).quant_kernel == ""  # its own: W4A8
    for device in ("h100", "a100-sxm-80gb", "rtx-5090", "mi300x"):
        assert kernel_here(mxfp4, find_hardware(device)).quant_kernel == "mxfp4-w4a16", device
    refused = plan_refusal(mxfp4, find_hardware("t4"))  # Turing: no Marlin MXFP4
    assert refused is not None and "8.0 or later" in refused.why


def test_nvfp4_computes_in_fp4_on_blackwell_and_runs_weight_only_through_marlin_elsewhere(capsys):
    """vLLM runs NVFP4 checkpoints on GPUs without FP4 tensor cores as W4A16 through Marlin
    (vllm-project/vllm#49376): on an H100 it is not refused, it runs the weight-only kernel;
    where neither runs (Volta, AMD) it is refused with what runs there."""
    nvfp4 = plan("nvfp4")
    for device in ("b200", "rtx-5090"):
        assert kernel_here(nvfp4, find_hardware(device)).quant_kernel == "", device
    assert kernel_here(nvfp4, find_hardware("h100")).quant_kernel == "marlin-fp4"
    for device in ("v100-sxm2-32gb", "mi300x"):
        refused = plan_refusal(nvfp4, find_hardware(device))
        assert refused is not None and "marlin-fp4" in refused.why, device
    code, out, err = run(["infer", "llama-3.1-8b", "--weights", "nvfp4", "--on", "h100",
                          "--runtime", "vllm", "--json"], capsys)
    assert code == 0 and json.loads(out)["plan"]["weights"] == "nvfp4"
    code, out, err = run(["infer", "llama-3.1-8b", "--weights", "nvfp4", "--on",
                          "v100-sxm2-32gb", "--runtime", "vllm"], capsys)
    assert code == 2 and "does not run on the NVIDIA Tesla V100" in out + err
    assert "lists what runs there" in out + err
    code, out, err = run(["infer", "llama-3.1-8b", "--weights", "nvfp4", "--on", "h100"], capsys)
    assert code == 2 and "transformers has no kernel for nvfp4" in out + err


def test_block_fp8_is_w8a8_from_ada_and_fp8_marlin_below():
    fp8 = plan("fp8-block")
    assert kernel_here(fp8, find_hardware("h100")).quant_kernel == ""
    assert kernel_here(fp8, find_hardware("l4")).quant_kernel == ""
    assert kernel_here(fp8, find_hardware("a100-sxm-80gb")).quant_kernel == "marlin-fp8"
    assert plan_refusal(fp8, find_hardware("v100-sxm2-32gb")) is not None


def test_mxfp4_quantises_gpt_oss_experts_alone_as_its_checkpoint_does():
    """gpt-oss keeps attention, router, embeddings and head in bf16 and its routed experts in
    MXFP4: the gpt-oss model card (OpenAI, 2025-08, table 1) gives checkpoint sizes of
    12.8 GiB (20b) and 60.8 GiB (120b); all matrices in MXFP4 would be far smaller."""
    from gpuwise.estimate.memory.weights import weight_bytes

    for name, published in (("gpt-oss-20b", 12.8), ("gpt-oss-120b", 60.8)):
        arch = from_config(resolve_model(name).config)
        gib = weight_bytes(arch, "mxfp4") / 2**30
        assert abs(gib - published) / published < 0.01, (name, gib)
