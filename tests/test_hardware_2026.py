"""Issue 40, item 4, second pass: the GeForce desktop and laptop parts, H20, Jetson, MI250X, Radeon,
Arc and every Apple chip bin with each memory size Apple sold, each with its sources."""

from __future__ import annotations

import json

import pytest
from test_cli import run

from gpuwise.catalog.capabilities import needs
from gpuwise.catalog.hardware import find_hardware, load_hardware
from gpuwise.estimate.capability import Device, dtype_refusal, kernel_refusal

# id -> (marketed memory in GB, read as GiB)
GPUS = {"rtx-4070": 12, "rtx-4060": 8, "rtx-5070": 12, "rtx-5070-ti": 16, "rtx-5060-ti-16gb": 16,
        "rtx-3080": 10, "rtx-4090-laptop": 16, "rtx-4080-laptop": 12, "h20": 96,
        "jetson-orin-nano-super": 8, "mi250x": 64, "rx-9070-xt": 16, "rx-7900-xt": 20, "arc-b580": 12}
# FP32 lanes a compute unit: NVIDIA SMs since Ampere, RDNA 3/4 CUs with dual issue, Xe2 cores;
# CDNA 2 CUs run 64 (vector FP32)
LANES = {"mi250x": 64}
LAPTOPS = ("rtx-4090-laptop", "rtx-4080-laptop")
# chip -> {size GiB: (GPU cores, GB/s)}: sizes tie to a bin
APPLE = {
    "m1-pro": {16: (14, 200), 32: (14, 200)},
    "m1-max": {32: (24, 400), 64: (24, 400)},
    "m1-ultra": {64: (48, 800), 128: (64, 800)},
    "m2-pro": {16: (16, 200), 32: (16, 200)},
    "m2-max": {32: (30, 400), 64: (30, 400), 96: (38, 400)},
    "m2-ultra": {64: (76, 800), 128: (76, 800), 192: (76, 800)},
    "m3-pro": {18: (14, 150), 36: (18, 150)},
    "m3-max": {36: (30, 300), 96: (30, 300), 48: (40, 400), 64: (40, 400), 128: (40, 400)},
    "m3-ultra": {96: (60, 819), 256: (60, 819), 512: (80, 819)},
    "m4-pro": {24: (16, 273), 48: (16, 273), 64: (16, 273)},
    "m4-max": {36: (32, 410), 48: (40, 546), 64: (40, 546), 128: (40, 546)},
}


@pytest.mark.parametrize("device", GPUS)
def test_each_new_gpu_has_its_sources_price_and_marketed_memory(device):
    hw = find_hardware(device)
    assert hw.id == device and hw.kind == "gpu"
    assert len(hw.spec_source) > 60 and len(hw.price_source) > 30 and len(hw.notes) > 100
    assert hw.list_price_usd > 0 or hw.cloud_usd_per_hour > 0
    assert hw.memory_gib == GPUS[device]
    for alias in hw.aliases:
        assert find_hardware(alias) is hw


@pytest.mark.parametrize("device", GPUS)
def test_fp32_is_units_times_lanes_times_two_times_the_clock(device):
    hw = find_hardware(device)
    lanes = LANES.get(device, 128)
    expected = hw.compute_units * lanes * 2 * hw.boost_clock_mhz / 1e6
    assert hw.peak_tflops["fp32"] == pytest.approx(expected, rel=0.005)


def test_geforce_tensor_peaks_follow_the_catalogue_rates():
    """512 dense FP16/FP32-accumulate FLOP a clock a SM (the 4090/3090/5090 entries), fp8 2x,
    int8 4x; Blackwell's dense FP4 at 8x, which NVIDIA's sparse 'AI TOPS' halve to."""
    for device in ("rtx-4070", "rtx-4060", "rtx-5070", "rtx-5070-ti", "rtx-5060-ti-16gb",
                   "rtx-3080", *LAPTOPS):
        hw = find_hardware(device)
        bf16 = hw.compute_units * 512 * hw.boost_clock_mhz / 1e6
        assert hw.peak_tflops["bf16"] == pytest.approx(bf16, rel=0.002), device
        assert hw.peak_tflops["int8"] == pytest.approx(4 * bf16, rel=0.002), device
        assert ("fp8" in hw.peak_tflops) == (hw.compute_capability >= 8.9), device
    for device, ai_tops in (("rtx-5070", 988), ("rtx-5070-ti", 1406), ("rtx-5060-ti-16gb", 759)):
        assert find_hardware(device).sparse_peak_tflops["fp4"] == pytest.approx(ai_tops, rel=0.002)


def test_laptops_run_at_home_at_nvidias_max_boost_and_say_so():
    for device, mhz in (("rtx-4090-laptop", 2040), ("rtx-4080-laptop", 2280)):
        hw = find_hardware(device)
        assert hw.site == "home" and hw.boost_clock_mhz == mhz
        assert "vary by laptop" in hw.notes and "maximum boost" in hw.notes
    # the detected name of a laptop part is its own entry, not the desktop card's
    assert find_hardware("NVIDIA GeForce RTX 4090 Laptop GPU").id == "rtx-4090-laptop"


def test_consumer_and_edge_parts_run_at_home_datacentre_parts_do_not():
    for device in GPUS:
        hw = find_hardware(device)
        assert (hw.site == "home") == (device not in ("h20", "mi250x")), device


@pytest.mark.parametrize("chip", APPLE)
def test_every_apple_size_is_its_own_id_with_its_bin(chip):
    for gib, (cores, gbs) in APPLE[chip].items():
        hw = find_hardware(f"{chip}-{gib}gb")
        assert hw.memory_gib == gib and hw.compute_units == cores, (chip, gib)
        assert hw.memory_bandwidth_gbs == gbs == hw.host_link_gbs, (chip, gib)
        assert f"{gib}GB" in hw.name and f"{cores}-core GPU" in hw.name
        assert hw.kind == "apple" and hw.site == "home"


def test_apple_ids_are_unique_and_the_bare_id_keeps_its_meaning():
    ids = [hw.id for hw in load_hardware()]
    assert len(ids) == len(set(ids))
    for chip, gib in (("m2-ultra", 192), ("m3-max", 128), ("m4-max", 128)):
        hw = find_hardware(chip)
        assert hw.id == chip and hw.memory_gib == gib
        assert find_hardware(f"{chip}-{gib}gb") is hw


def test_apple_fp32_follows_each_generations_per_core_rate():
    per_core = {"m1": 10.4 / 32, "m2": 27.2 / 76, "m3": 14.3 / 40, "m4": 17.2 / 40}
    for hw in load_hardware():
        if hw.vendor == "apple":
            rate = per_core[hw.arch.removeprefix("apple-")]
            assert hw.peak_tflops["fp32"] == pytest.approx(hw.compute_units * rate, abs=0.01), hw.id


def test_apple_prices_are_sourced_or_zero():
    for hw in load_hardware():
        if hw.vendor == "apple":
            assert hw.list_price_usd == 0 or "$" in hw.price_source, hw.id
    assert find_hardware("m4-max-36gb").list_price_usd == 1999  # Mac Studio 2025 base
    assert find_hardware("m4-pro").list_price_usd == 1399  # Mac mini M4 Pro base
    assert find_hardware("m4-pro-64gb").list_price_usd == 0  # not found: not known


def test_what_each_new_arch_runs_is_in_the_capability_rules():
    """The dtypes are the peaks' keys; kernels and attention by vendor and compute capability."""
    jetson = Device.of(find_hardware("jetson-orin-nano-super"))
    assert jetson.compute_capability == 8.7 and dtype_refusal("bf16", jetson) is None
    assert kernel_refusal("marlin", jetson) is None  # Ampere: Marlin from 7.5
    assert kernel_refusal("fp8-w8a8", jetson).instead == "marlin-fp8"  # no fp8 tensor cores
    h20 = Device.of(find_hardware("h20"))
    assert kernel_refusal("fbgemm-fp8", h20) is None and kernel_refusal("fp8-w8a8", h20) is None
    for device in ("arc-b580", "rx-9070-xt"):  # bf16 rate not sourced: runs as fp16
        d = Device.of(find_hardware(device))
        assert dtype_refusal("bf16", d).instead == "fp16"
        assert kernel_refusal("bnb-nf4", d) is not None  # CUDA only
    mi250x = Device.of(find_hardware("mi250x"))
    assert dtype_refusal("bf16", mi250x) is None
    assert kernel_refusal("fp8-w8a8", mi250x) is not None  # CDNA 2 has no fp8
    assert needs("attention", "flash").vendors == ("nvidia",)


def _ids(out):
    return {d["id"] for d in json.loads(out)}


def test_hardware_lists_the_new_devices_by_vendor(capsys):
    code, out, _ = run(["hardware", "--vendor", "intel", "--json"], capsys)
    assert code == 0 and "arc-b580" in _ids(out)
    code, out, _ = run(["hardware", "--vendor", "apple", "--json"], capsys)
    assert code == 0 and {f"{c}-{g}gb" for c in ("m4-pro", "m3-ultra") for g in (48, 512)
                          if g in APPLE[c]} <= _ids(out)
    code, out, _ = run(["hardware", "--vendor", "nvidia", "--max-price", "500", "--json"], capsys)
    assert code == 0 and {"rtx-4060", "rtx-5060-ti-16gb", "jetson-orin-nano-super"} <= _ids(out)


# Third pass: the parts the second left out for want of a price or a kind. id -> marketed memory
# in GB (read as GiB; ROCm's 288 GiB for the MI355X).
THIRD = {"rtx-5090-laptop": 24, "l20": 48, "jetson-agx-orin-64gb": 64, "mi355x": 288,
         "arc-a770": 16, "gaudi3": 128, "gaudi2": 96}
UNPRICED = ("l20", "jetson-agx-orin-64gb", "mi355x", "arc-a770", "gaudi2")


@pytest.mark.parametrize("device", THIRD)
def test_each_third_pass_device_has_its_sources_and_marketed_memory(device):
    hw = find_hardware(device)
    assert hw.id == device and hw.memory_gib == THIRD[device]
    assert len(hw.spec_source) > 100 and len(hw.price_source) > 60 and len(hw.notes) > 200
    assert hw.spec_date and hw.price_date
    for alias in hw.aliases:
        assert find_hardware(alias) is hw
    if device in UNPRICED:  # allowed where price_source says why (test_hardware_data.py)
        assert hw.list_price_usd == 0 and hw.cloud_usd_per_hour == 0
        why = hw.price_source.lower()
        assert any(r in why for r in ("no published price", "no price found", "no sourced price"))
    else:
        assert hw.list_price_usd > 0


@pytest.mark.parametrize("device", [d for d in THIRD if find_hardware(d).kind == "gpu"])
def test_third_pass_fp32_is_units_times_128_lanes_times_two_times_the_clock(device):
    """128 FP32 lanes a unit: Ada/Blackwell/Ampere SMs, Xe-cores, CDNA 4 CUs (packed FP32)."""
    hw = find_hardware(device)
    expected = hw.compute_units * 128 * 2 * hw.boost_clock_mhz / 1e6
    assert hw.peak_tflops["fp32"] == pytest.approx(expected, rel=0.005)


def test_third_pass_matrix_peaks_follow_the_per_unit_rates():
    laptop = find_hardware("rtx-5090-laptop")  # 512 FP16/FP32-acc FLOP a clock a SM
    bf16 = 82 * 512 * 2160 / 1e6
    assert laptop.peak_tflops["bf16"] == pytest.approx(bf16, rel=0.002)
    for dtype, times in (("fp8", 2), ("int8", 4), ("fp4", 8)):
        assert laptop.peak_tflops[dtype] == pytest.approx(times * bf16, rel=0.002)
    orin = find_hardware("jetson-agx-orin-64gb")  # the nano entry's 4096 INT8 a clock a SM
    assert orin.peak_tflops["int8"] == pytest.approx(16 * 4096 * 1300 / 1e6, rel=0.002)
    assert orin.sparse_peak_tflops["int8"] == pytest.approx(2 * orin.peak_tflops["int8"], rel=0.01)
    mi355x = find_hardware("mi355x")  # ISSCC 2026: 8192 FP8 FLOP a clock a CU
    fp8 = 256 * 8192 * 2400 / 1e6
    assert mi355x.peak_tflops["fp8"] == pytest.approx(fp8, rel=0.001)
    assert mi355x.peak_tflops["bf16"] == pytest.approx(fp8 / 2, rel=0.001)
    assert mi355x.peak_tflops["fp4"] == pytest.approx(2 * fp8, rel=0.001)  # MXFP4
    assert mi355x.arch.startswith("cdna4") and mi355x.compute_units == 256
    l20 = find_hardware("l20")  # NVIDIA's export-limited figures, taken as dense
    assert l20.peak_tflops["bf16"] == 119.5 and l20.peak_tflops["fp8"] == 239.0
    gaudi3 = find_hardware("gaudi3")  # Intel's MME rates: fp8 at the bf16 rate
    assert gaudi3.peak_tflops == {"bf16": 1835.0, "fp8": 1835.0} and gaudi3.boost_clock_mhz == 0
    assert find_hardware("gaudi2").peak_tflops["bf16"] == 432.0


def test_laptops_and_modules_are_not_advise_candidates_but_on_still_takes_them():
    from gpuwise.app.cost import _considered, candidates

    ids = {c.hw.id for c in candidates(None, None, None)}
    for hw in load_hardware():
        if hw.form_factor in ("laptop", "module"):
            assert hw.id not in ids, hw.id
    assert {"rtx-4090-laptop", "rtx-4080-laptop", "rtx-5090-laptop"} <= {
        hw.id for hw in load_hardware() if hw.form_factor == "laptop"}
    assert {"jetson-orin-nano-super", "jetson-agx-orin-64gb"} <= {
        hw.id for hw in load_hardware() if hw.form_factor == "module"}
    assert "gaudi3" in ids and "rtx-4090" in ids  # priced, a card or board
    assert not set(UNPRICED) & ids  # no price: not a candidate
    kw = {"on": "rtx-4090-laptop", "local": False, "local_price": None, "local_power_w": None}
    assert [c.hw.id for c in _considered(kw)] == ["rtx-4090-laptop"]


def test_advise_on_a_laptop_still_prices_it(capsys):
    code, out, err = run(["advise", "llama-3.2-1b", "--on", "rtx-4090-laptop",
                          "--requests-per-day", "1000"], capsys)
    assert code == 0, err
    assert "rtx-4090-laptop" in out


def test_gaudi_runs_vllm_and_transformers_not_llama_cpp(capsys):
    for runtime in ("vllm", "transformers"):
        code, out, err = run(["infer", "llama-3.1-8b", "--on", "gaudi3", "--runtime", runtime],
                             capsys)
        assert code == 0, err
    for runtime in ("llama.cpp", "sglang"):
        code, out, err = run(["infer", "llama-3.1-8b", "--on", "gaudi3", "--runtime", runtime],
                             capsys)
        assert code == 2 and out == ""
        assert f"error: {runtime} does not run on Intel Gaudi 3" in err and "(hpu)" in err
        assert "--runtime transformers or vllm" in err
        assert len(err.strip().splitlines()) <= 2
    code, out, _ = run(["hardware", "--kind", "hpu", "--json"], capsys)
    assert code == 0 and _ids(out) == {"gaudi2", "gaudi3"}


def test_gaudi_refuses_cuda_only_kernels_and_flash_attention():
    gaudi = Device.of(find_hardware("gaudi3"))
    assert gaudi.kind == "hpu" and dtype_refusal("bf16", gaudi) is None
    assert dtype_refusal("fp16", gaudi).instead == "bf16"  # no published fp16 MME rate
    assert kernel_refusal("marlin", gaudi) is not None
    assert needs("attention", "flash").vendors == ("nvidia",)


def test_mi355x_runs_mxfp4_and_refuses_nvfp4(capsys):
    mi355x = Device.of(find_hardware("mi355x"))
    assert "fp4" in mi355x.matmul_dtypes  # its MXFP4 rate, not NVIDIA's NVFP4
    assert kernel_refusal("mxfp4-w4a16", mi355x) is None
    assert kernel_refusal("nvfp4-w4a4", mi355x) is not None
    code, out, err = run(["infer", "gpt-oss-120b", "--on", "mi355x", "--weights", "mxfp4",
                          "--runtime", "vllm"], capsys)
    assert code == 0, err
    assert "mxfp4-w4a16" in out  # FlashInfer's MXFP4 x MXFP8 is Blackwell's
    code, out, err = run(["infer", "gpt-oss-120b", "--on", "mi355x", "--weights", "nvfp4",
                          "--runtime", "vllm"], capsys)
    assert code == 2 and out == ""
    assert "nvfp4-w4a4 kernel does not run on the AMD Instinct MI355X" in err
    assert "Nvidia GPUs only" in err
