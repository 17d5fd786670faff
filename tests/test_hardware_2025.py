"""Issue 40, item 4: the hardware people buy is in the catalogue with its sources, and
`gpuwise hardware` filters by vendor, kind, memory and list price."""

from __future__ import annotations

import json

import pytest
from test_cli import run

from gpuwise.catalog.hardware import find_hardware, load_hardware

NEW = ("rtx-4060-ti-16gb", "rtx-4070-ti-super", "rtx-4080-super", "rtx-5080", "rtx-3090-ti",
       "rtx-3060-12gb", "mi325x", "rx-7900-xtx")
WORKSTATION_AND_DATACENTRE = ("l40", "rtx-6000-ada", "rtx-pro-6000", "gb200")


@pytest.mark.parametrize("device", NEW + WORKSTATION_AND_DATACENTRE)
def test_each_new_device_has_its_sources_and_a_price(device):
    hw = find_hardware(device)
    assert hw.id == device
    assert len(hw.spec_source) > 40 and len(hw.price_source) > 20 and hw.notes
    assert hw.spec_date and hw.price_date
    assert hw.list_price_usd > 0 or hw.cloud_usd_per_hour > 0
    assert hw.memory_gib > 0 and hw.memory_bandwidth_gbs > 0 and hw.boost_clock_mhz > 0
    for alias in hw.aliases:
        assert find_hardware(alias) is hw


def test_the_dtypes_follow_the_compute_capability():
    """bf16 from compute capability 8.0, fp8 from 8.9: what the matrix units run."""
    for hw in load_hardware():
        if hw.vendor != "nvidia" or hw.kind != "gpu":
            continue
        cc = hw.compute_capability
        assert ("bf16" in hw.peak_tflops) == (cc >= 8.0), hw.id
        assert ("fp8" in hw.peak_tflops) == (cc >= 8.9), hw.id


def test_blackwell_entries_carry_their_fp4_peak_at_twice_fp8():
    """Dense FP4 from NVIDIA's figures (half the sparse ones): B200, GB200, RTX 5090, RTX PRO 6000."""
    for device, fp4 in (("b200", 9000), ("gb200", 10000), ("rtx-5090", 1676),
                        ("rtx-pro-6000", 2000)):
        hw = find_hardware(device)
        assert hw.peak_tflops["fp4"] == fp4 and hw.sparse_peak_tflops["fp4"] == 2 * fp4
    assert find_hardware("gb200").peak_tflops["bf16"] == 2500  # NVIDIA: 5 PFLOPS sparse
    assert "fp4" not in find_hardware("h200").peak_tflops


def test_geforce_and_consumer_radeon_run_at_home():
    for device in NEW:
        hw = find_hardware(device)
        assert (hw.site == "home") == (device != "mi325x"), device


def test_the_derived_geforce_peaks_match_the_catalogue_rate():
    """512 dense FP16/FP32-accumulate FLOP a clock a SM, as the 4090 and 5090 entries have."""
    for ref in ("rtx-4090", "rtx-5090", "rtx-3090"):
        hw = find_hardware(ref)
        per_sm = hw.peak_tflops["bf16"] * 1e12 / (hw.compute_units * hw.boost_clock_mhz * 1e6)
        assert per_sm == pytest.approx(512, rel=0.01), ref
    hw = find_hardware("rtx-4070-ti-super")
    assert hw.peak_tflops["bf16"] == pytest.approx(66 * 512 * 2610e6 / 1e12, rel=1e-3)


def _ids(out):
    return {d["id"] for d in json.loads(out)}


def test_vendor_and_memory_filters_combine(capsys):
    code, out, _ = run(["hardware", "--vendor", "amd", "--min-memory", "192", "--json"], capsys)
    assert code == 0 and _ids(out) == {"mi300x", "mi325x", "mi355x"}
    code, out, _ = run(["hardware", "--vendor", "AMD", "--json"], capsys)
    assert _ids(out) == {"mi300x", "mi325x", "mi355x", "rx-7900-xtx", "mi250x", "rx-9070-xt",
                         "rx-7900-xt"}
    code, out, _ = run(["hardware", "--vendor", "apple", "--json"], capsys)
    assert code == 0 and {d["vendor"] for d in json.loads(out)} == {"apple"}


def test_price_and_kind_filters(capsys):
    code, out, _ = run(["hardware", "--max-price", "1000", "--kind", "gpu", "--json"], capsys)
    devices = json.loads(out)
    assert code == 0 and devices
    assert all(0 < d["list_price_usd"] <= 1000 and d["kind"] == "gpu" for d in devices)
    assert {"rtx-4070-ti-super", "rtx-5080", "rx-7900-xtx"} <= _ids(out)
    assert "tpu-v5e" not in _ids(out)  # rented only: no list price
    code, out, _ = run(["hardware", "--kind", "tpu", "--json"], capsys)
    assert _ids(out) == {"tpu-v4", "tpu-v5e", "tpu-v5p"}
    code, out, _ = run(["hardware", "--vendor", "nvidia", "--min-memory", "16",
                        "--max-price", "1000"], capsys)
    assert code == 0 and "rtx-4080-super" in out and "rtx-3060-12gb" not in out


def test_the_json_lists_what_the_table_shows(capsys):
    args = ["hardware", "--vendor", "nvidia", "--max-price", "900"]
    code, table, _ = run(args, capsys)
    code, out, _ = run([*args, "--json"], capsys)
    ids = _ids(out)
    assert ids and all(i in table for i in ids)
    assert "rtx-4090 " not in table


@pytest.mark.parametrize(("args", "needle"), [
    (["--vendor", "nvdia"], "did you mean 'nvidia'"),
    (["--kind", "fpga"], "--kind"),
    (["--min-memory", "-1"], "--min-memory"),
    (["--min-memory", "lots"], "--min-memory"),
    (["--max-price", "0"], "--max-price"),
    (["--vendor", "apple", "--min-memory", "4000"], "no catalogue device matches"),
])
def test_bad_filter_values_are_one_error_line(args, needle, capsys):
    code, out, err = run(["hardware", *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in err
    assert len(err.strip().splitlines()) <= 2
