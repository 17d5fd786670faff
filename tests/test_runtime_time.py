"""The runtimes' time models (catalog/data/runtime_speed.toml, estimate/speed/runtime_time.py
and ggml_time.py), the llama.cpp probe's fit, and the intervals every time carries."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from catalogue_archs import arch

from gpuwise.catalog import find_hardware
from gpuwise.catalog.runtime_speed import (
    ggml_backend,
    kernel_names,
    runtime_names,
    runtime_speed,
    weight_kernel,
)
from gpuwise.catalog.time_intervals import time_interval
from gpuwise.errors import GpuwiseError
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.ggml_time import GgmlRates
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.measure.llama_cpp.fit import ModelTiming, fit_rates, llama_arch, timing_plans

ROOT = Path(__file__).resolve().parents[1]
LLAMA = arch("llama-3.1-8b")
H100 = rates_from_spec(find_hardware("h100-sxm"))
RTX4090 = rates_from_spec(find_hardware("rtx-4090"))
CPU = rates_from_spec(find_hardware("cpu-cloud-32vcpu"))
M2 = rates_from_spec(find_hardware("m2-ultra"))


def infer(rates, runtime, weights="bf16", batch=1, prompt=512, new=128, **kw):
    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new, weights=weights,
                         runtime=runtime, **kw)
    return estimate_inference_time(LLAMA, plan, rates)


def test_every_constant_of_every_runtime_backend_and_kernel_has_a_source():
    for name in runtime_names():
        rt = runtime_speed(name)
        assert set(rt.sources) >= {"name", "step_s", "kernels"} and rt.id == name
    for kind in ("cpu", "gpu", "apple"):
        backend = ggml_backend(kind)
        assert all(len(s) > 20 for s in backend.sources.values())
        assert set(backend.memory) == set(backend.matmul)
    for name in kernel_names():
        kernel = weight_kernel(name)
        assert 0 < kernel.decode_memory <= 1 and 0 < kernel.prefill_matmul <= 1
    for rt in map(runtime_speed, runtime_names()):  # every kernel a runtime names exists
        for kernel in rt.kernels.values():
            weight_kernel(kernel)


def test_serving_runtimes_decode_without_the_eager_dispatch_floor():
    eager, vllm = infer(H100, "transformers"), infer(H100, "vllm")
    assert eager.decode.bound == "overhead" and vllm.decode.bound == "memory"
    # An 8B model in bf16 reads 16 GB a token: at 3.35 TB/s x 0.85 that is 5.6 ms, plus
    # vLLM's step; published vLLM runs decode it in 6-7 ms (docs/speed.md, "Runtimes").
    assert 5.6e-3 < vllm.decode_s_per_token < 8e-3 < eager.decode_s_per_token
    assert vllm.runtime_id == "vllm" and "vLLM" in vllm.runtime


def test_decode_follows_each_device_bandwidth_not_one_floor():
    per_device = {hw: infer(rates_from_spec(find_hardware(hw)), "vllm").decode_s_per_token
                  for hw in ("a10", "a100-sxm-80gb", "h100-sxm")}
    assert per_device["a10"] > 2 * per_device["a100-sxm-80gb"] > 2 * per_device["h100-sxm"] / 1.5


def test_weight_only_kernels_stream_packed_bytes_and_prefill_at_their_own_rate():
    bf16, marlin = infer(H100, "vllm"), infer(H100, "vllm", weights="int4")
    assert marlin.kernel == "marlin"
    assert marlin.decode_s_per_token < 0.6 * bf16.decode_s_per_token  # fewer bytes a token
    awq = infer(H100, "compiled", weights="int4", quant_kernel="awq-gemm")
    exllama = infer(H100, "compiled", weights="int4", quant_kernel="exllama")
    plain = infer(H100, "compiled")
    # Prefill at the kernel's own share of the bf16 rate, not the full rate (the baseline's
    # int4 prefill error, docs/speed.md).
    assert plain.prefill_s < awq.prefill_s < exllama.prefill_s
    fp8 = infer(H100, "vllm", weights="fp8")
    assert fp8.kernel == "fp8-w8a8" and fp8.prefill_s < bf16.prefill_s


def test_llama_cpp_time_follows_the_ggml_type_and_the_backend():
    f16, q4 = infer(RTX4090, "llama.cpp", "fp16"), infer(RTX4090, "llama.cpp", "q4_k_m")
    assert q4.kernel == "q4_k" and f16.kernel == "f16"
    assert 2.0 < f16.decode_s_per_token / q4.decode_s_per_token < 3.5  # 16 vs ~4.9 bits
    assert infer(M2, "llama.cpp", "q4_0").decode_s_per_token > q4.decode_s_per_token
    one, more = (infer(CPU, "llama.cpp", "q4_0", threads=t) for t in (1, 16))
    assert more.decode_s_per_token < one.decode_s_per_token  # bandwidth shared by threads
    assert more.prefill_s < one.prefill_s / 8  # compute in proportion


def test_a_gguf_files_own_type_sets_llama_cpp_speed():
    stored = replace(InferencePlan(), stored_weights=None)
    from gpuwise.workload.plans import StoredWeights

    q6 = StoredWeights(6_600_000_000, 800_000_000, "Q6_K (gguf)", "Q6_K")
    plan = replace(stored, weights="fp16", stored_weights=q6, runtime="llama.cpp")
    assert estimate_inference_time(LLAMA, plan, RTX4090).kernel == "q6_k"


@pytest.mark.parametrize("runtime,rates,weights,message", [
    ("vllm", CPU, "bf16", "does not run on"),
    ("sglang", M2, "bf16", "does not run on"),
    ("llama.cpp", H100, "nf4", "no nf4"),
    ("vllm", H100, "q4_k_m", "GGUF"),
    ("compiled", H100, "nf4", "no kernel for nf4"),
])
def test_a_runtime_that_cannot_run_the_plan_says_what_is_missing(runtime, rates, weights, message):
    with pytest.raises(GpuwiseError) as err:
        infer(rates, runtime, weights)
    assert message in str(err.value) + (err.value.hint or "")


def test_unknown_runtimes_get_did_you_mean_and_serving_runtimes_do_not_train():
    with pytest.raises(GpuwiseError, match="unknown runtime") as err:
        InferencePlan(runtime="vlm")
    assert "vllm" in err.value.hint
    with pytest.raises(GpuwiseError, match="does not train"):
        TrainingPlan(runtime="llama.cpp")


def test_a_compiled_training_step_drops_the_eager_dispatch():
    plan = TrainingPlan(batch=4, seq=2048)
    eager = estimate_training_time(LLAMA, plan, H100)
    compiled = estimate_training_time(LLAMA, replace(plan, runtime="compiled"), H100)
    assert compiled.step_s < eager.step_s and compiled.runtime_id == "compiled"
    assert compiled.forward.overhead_s == 0.0


def test_every_time_carries_its_runtimes_interval():
    t = infer(H100, "vllm")
    iv = t.interval("decode")
    assert iv is not None and iv.low < 1 < iv.high and iv.source == "spec"
    low, high = iv.around(t.decode_s_per_token)
    assert low < t.decode_s_per_token < high
    assert time_interval("made-up", "decode", "spec").runtime == "any"  # pooled fallback


def test_the_printed_intervals_hold_for_75_to_90_percent_of_the_validation_entries():
    data = (ROOT / "gpuwise" / "catalog" / "data" / "time_intervals.toml").read_text()
    import tomllib

    groups = tomllib.loads(data)["interval"]
    covered = [g["coverage"] for g in groups if g["runtime"] == "any"]
    assert covered and all(0.75 <= c <= 0.9 for c in covered)


def test_the_intervals_file_is_written_from_the_latest_results():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "write_time_intervals.py"),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _synthetic_timing(hidden, layers, g: GgmlRates) -> ModelTiming:
    a = llama_arch(hidden, layers, hidden // 64, 2, 3 * hidden, 32000)
    from gpuwise.estimate.memory.weights import weight_bytes

    total = int(weight_bytes(a, "q8_0"))
    pp, tg = timing_plans("q8_0", total, int(total * 0.2), 256, 32, 2)
    rates = replace(CPU, compute_units=2, ggml_measured={"q8_0/2": {
        k: getattr(g, k) for k in GgmlRates.__dataclass_fields__ if k != "source"}})
    prefill = estimate_inference_time(a, pp, rates).prefill_s
    decode = estimate_inference_time(a, tg, rates).decode_s_per_token
    return ModelTiming(a, pp, tg, prefill, decode)


def test_the_probe_fit_recovers_the_rates_that_made_its_timings():
    truth = GgmlRates(30e9, 30e9, 300e9, 300e9, 20e-6, 0.0, 5e-6, "measured")
    fitted = fit_rates(_synthetic_timing(384, 6, truth), _synthetic_timing(1280, 4, truth))
    assert fitted["weight_bytes_per_s"] == pytest.approx(30e9, rel=0.05)
    assert fitted["matmul_flops"] == pytest.approx(300e9, rel=0.05)
    assert fitted["layer_s"] == pytest.approx(20e-6, rel=0.2)




def test_check_times_a_decode_step_per_precision_under_its_runtime():
    from gpuwise.app.check import check
    from gpuwise.catalog import resolve_model

    model = resolve_model("llama-3.1-8b")
    plan = InferencePlan(runtime="llama.cpp")
    rows = check(model, LLAMA, find_hardware("rtx-4090"), plan).rows
    decode = {r.weights: r.decode.record() for r in rows if r.decode}
    assert list(decode) == ["fp16", "q8_0", "q6_k", "q5_k_m", "q4_k_m"]  # its GGUF types
    assert decode["q4_k_m"]["s_per_token"] < decode["q8_0"]["s_per_token"] < decode["fp16"][
        "s_per_token"]
    assert decode["q4_k_m"]["low"] < decode["q4_k_m"]["s_per_token"] < decode["q4_k_m"]["high"]
    nf4 = check(model, LLAMA, find_hardware("rtx-4090"), replace(plan, weights="nf4"))
    assert "nf4" not in {r.weights for r in nf4.rows}  # llama.cpp has no nf4: not offered


def test_llama_cpp_layers_left_on_the_host_slow_decode_and_leave_the_gpu_memory():
    from gpuwise.app.infer import offload_host
    from gpuwise.estimate.runtimes import estimate_inference

    hw = find_hardware("rtx-4090")
    times, weights = [], []
    for layers in (None, 24, 8, 0):
        plan = InferencePlan(weights="q4_k_m", runtime="llama.cpp", gpu_layers=layers)
        times.append(estimate_inference_time(LLAMA, plan, RTX4090,
                                             host=offload_host(plan, hw)).decode_s_per_token)
        weights.append(estimate_inference(LLAMA, plan, hw).breakdown["weights"])
    assert times == sorted(times) and times[-1] > 5 * times[0]  # host DRAM is far slower
    assert weights == sorted(weights, reverse=True) and weights[-1] == 0


def test_llama_cpp_without_flash_attention_reads_its_scores_back():
    fa = infer(RTX4090, "llama.cpp", "q4_k_m", prompt=4096)
    no_fa = infer(RTX4090, "llama.cpp", "q4_k_m", prompt=4096, attention="eager")
    assert no_fa.prefill_s > fa.prefill_s and no_fa.decode_s_per_token == fa.decode_s_per_token
