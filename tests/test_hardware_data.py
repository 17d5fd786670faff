"""Sanity checks for the hardware catalogue (gpuwise/catalog/data/hardware.toml).

These tests only read the TOML file; they do not import gpuwise, so they run on a bare
Python 3.11+ with pytest.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

HARDWARE_TOML = Path(__file__).parents[1] / "gpuwise/catalog/data/hardware.toml"

NUMBER = (int, float)

# key -> accepted Python types after tomllib parsing
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "name": (str,),
    "aliases": (list,),
    "vendor": (str,),
    "kind": (str,),
    "memory_gib": NUMBER,
    "memory_bandwidth_gbs": NUMBER,
    "peak_tflops": (dict,),
    "sparse_peak_tflops": (dict,),
    "compute_units": (int,),
    "compute_unit_name": (str,),
    "l2_mib": NUMBER,
    "tdp_w": (int,),
    "interconnect": (str,),
    "interconnect_gbs": NUMBER,
    "host_link": (str,),
    "host_link_gbs": NUMBER,
    "list_price_usd": NUMBER,
    "cloud_usd_per_hour": NUMBER,
    "spec_source": (str,),
    "spec_date": (str,),
    "price_source": (str,),
    "price_date": (str,),
    "notes": (str,),
}

VENDORS = {"nvidia", "amd", "apple", "google", "intel", "generic"}
KINDS = {"gpu", "tpu", "hpu", "apple", "cpu"}
# Optional `form_factor`: a laptop GPU or an edge module (absent: a card or a board).
FORM_FACTORS = {"laptop", "module"}
DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4"}
# fp4 (dense FP4 matrix peak): Blackwell's tensor cores, compute capability 10.0 and later, and
# AMD CDNA 4's matrix cores (MXFP4).
FP4_MIN_CC = 10.0
FP4_AMD_ARCH = "cdna4"
# A price of 0 for both list and cloud is allowed where price_source says why (one of these).
UNPRICED_REASONS = ("no published price", "no price found", "no sourced price")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
DATE_RE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$")

# Devices the catalogue must cover, looked up by id or alias (what a user would type).
REQUIRED_LOOKUPS = [
    "h200",
    "b200",
    "h100-sxm",
    "h100-pcie",
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "a100-pcie-40gb",
    "a100-pcie-80gb",
    "l40s",
    "l4",
    "a10",
    "a10g",
    "t4",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "rtx-3090",
    "rtx-4090",
    "rtx-5090",
    "mi300x",
    "m2-ultra",
    "m3-max",
    "m4-max",
    "tpu-v4",
    "tpu-v5e",
    "tpu-v5p",
]


def _is_number(value: object) -> bool:
    # bool is a subclass of int; a bool is never a valid number here.
    return isinstance(value, NUMBER) and not isinstance(value, bool)


@pytest.fixture(scope="module")
def devices() -> list[dict]:
    with HARDWARE_TOML.open("rb") as fh:
        data = tomllib.load(fh)
    assert set(data) == {"device"}, f"unexpected top-level keys: {sorted(data)}"
    assert isinstance(data["device"], list)
    return data["device"]


def _ids(devices: list[dict]) -> list[str]:
    return [d.get("id", "?") for d in devices]


def _lookup(devices: list[dict]) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for dev in devices:
        table[dev["id"]] = dev
        for alias in dev["aliases"]:
            table[alias] = dev
    return table


def test_file_exists() -> None:
    assert HARDWARE_TOML.is_file(), HARDWARE_TOML


def test_at_least_24_devices(devices: list[dict]) -> None:
    assert len(devices) >= 24, len(devices)


def test_required_keys_and_types(devices: list[dict]) -> None:
    problems = []
    for dev in devices:
        did = dev.get("id", "?")
        missing = set(REQUIRED_KEYS) - set(dev)
        if missing:
            problems.append(f"{did}: missing {sorted(missing)}")
        for key, types in REQUIRED_KEYS.items():
            if key not in dev:
                continue
            value = dev[key]
            if types is NUMBER:
                ok = _is_number(value)
            else:
                ok = isinstance(value, types) and not isinstance(value, bool)
            if not ok:
                problems.append(f"{did}.{key}: {type(value).__name__} not {types}")
        for alias in dev.get("aliases", []):
            if not isinstance(alias, str):
                problems.append(f"{did}: non-string alias {alias!r}")
    assert not problems, "\n".join(problems)


def test_ids_are_canonical_and_unique(devices: list[dict]) -> None:
    ids = _ids(devices)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    bad = [i for i in ids if not ID_RE.match(i)]
    assert not bad, bad


def test_names_unique(devices: list[dict]) -> None:
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))


def test_aliases_do_not_collide(devices: list[dict]) -> None:
    owner: dict[str, str] = {d["id"]: d["id"] for d in devices}
    problems = []
    for dev in devices:
        seen_here = set()
        for alias in dev["aliases"]:
            if alias != alias.lower() or alias != alias.strip() or not ID_RE.match(alias):
                problems.append(f"{dev['id']}: alias {alias!r} is not a lowercase slug")
            if alias in seen_here:
                problems.append(f"{dev['id']}: alias {alias!r} repeated")
            seen_here.add(alias)
            if alias in owner and owner[alias] != dev["id"]:
                problems.append(f"{dev['id']}: alias {alias!r} already used by {owner[alias]}")
            elif alias == dev["id"]:
                problems.append(f"{dev['id']}: alias repeats its own id")
            owner.setdefault(alias, dev["id"])
    assert not problems, "\n".join(problems)


def test_enums(devices: list[dict]) -> None:
    bad = [
        (d["id"], d["vendor"], d["kind"])
        for d in devices
        if d["vendor"] not in VENDORS or d["kind"] not in KINDS
    ]
    assert not bad, bad


def test_sources_and_dates_present(devices: list[dict]) -> None:
    problems = []
    for dev in devices:
        for key in ("spec_source", "spec_date", "price_source", "price_date", "notes", "name"):
            if not str(dev.get(key, "")).strip():
                problems.append(f"{dev['id']}: empty {key}")
        for key in ("spec_date", "price_date"):
            if not DATE_RE.match(dev.get(key, "")):
                problems.append(f"{dev['id']}: {key}={dev.get(key)!r} is not YYYY-MM[-DD]")
    assert not problems, "\n".join(problems)


def test_memory_and_bandwidth_positive(devices: list[dict]) -> None:
    bad = [
        d["id"]
        for d in devices
        if not (0 < d["memory_gib"] <= 4096 and d["memory_bandwidth_gbs"] > 0)
    ]
    assert not bad, bad


def test_other_numbers_non_negative(devices: list[dict]) -> None:
    keys = (
        "l2_mib",
        "tdp_w",
        "interconnect_gbs",
        "host_link_gbs",
        "list_price_usd",
        "cloud_usd_per_hour",
    )
    bad = [(d["id"], k, d[k]) for d in devices for k in keys if d[k] < 0]
    assert not bad, bad
    assert all(d["compute_units"] > 0 for d in devices)


def test_peak_tables_well_formed(devices: list[dict]) -> None:
    problems = []
    for dev in devices:
        dense, sparse = dev["peak_tflops"], dev["sparse_peak_tflops"]
        if not dense:
            problems.append(f"{dev['id']}: empty peak_tflops")
        for table_name, table in (("peak_tflops", dense), ("sparse_peak_tflops", sparse)):
            for dtype, value in table.items():
                if dtype not in DTYPES:
                    problems.append(f"{dev['id']}.{table_name}: unknown dtype {dtype!r}")
                if not _is_number(value) or value <= 0:
                    problems.append(f"{dev['id']}.{table_name}.{dtype}={value!r}")
        extra = set(sparse) - set(dense)
        if extra:
            problems.append(f"{dev['id']}: sparse-only dtypes {sorted(extra)}")
    assert not problems, "\n".join(problems)


def _has_fp4_units(dev: dict) -> bool:
    """Blackwell (NVIDIA compute capability 10.0 and later) or AMD CDNA 4 (MXFP4)."""
    if dev["vendor"] == "nvidia":
        return dev.get("compute_capability", 0) >= FP4_MIN_CC
    return dev["vendor"] == "amd" and dev.get("arch", "").startswith(FP4_AMD_ARCH)


def test_fp4_only_on_blackwell_and_cdna4(devices: list[dict]) -> None:
    # FP4 matrix units are Blackwell's (sm_100, sm_120) and CDNA 4's (gfx950); no other
    # device lists an fp4 peak.
    bad = [
        d["id"]
        for d in devices
        for table in (d["peak_tflops"], d["sparse_peak_tflops"])
        if "fp4" in table and not _has_fp4_units(d)
    ]
    assert not bad, bad
    fp4 = [d for d in devices if "fp4" in d["peak_tflops"]]
    assert {"b200", "rtx-5090", "mi355x"} <= {d["id"] for d in fp4}
    # FP4 runs at twice the fp8 rate (or more) on every part listed.
    assert all(d["peak_tflops"]["fp4"] >= d["peak_tflops"]["fp8"] for d in fp4)


def test_form_factors(devices: list[dict]) -> None:
    bad = [(d["id"], d["form_factor"]) for d in devices
           if "form_factor" in d and d["form_factor"] not in FORM_FACTORS]
    assert not bad, bad
    laptops = {d["id"] for d in devices if d.get("form_factor") == "laptop"}
    modules = {d["id"] for d in devices if d.get("form_factor") == "module"}
    assert {"rtx-4090-laptop", "rtx-4080-laptop", "rtx-5090-laptop"} <= laptops
    assert all("laptop" in i for i in laptops)
    assert all(i.startswith("jetson-") for i in modules) and len(modules) >= 2


def test_dense_never_exceeds_sparse(devices: list[dict]) -> None:
    bad = [
        (d["id"], dtype, d["peak_tflops"][dtype], sparse)
        for d in devices
        for dtype, sparse in d["sparse_peak_tflops"].items()
        if dtype in d["peak_tflops"] and d["peak_tflops"][dtype] > sparse
    ]
    assert not bad, bad


def test_sparse_is_about_twice_dense(devices: list[dict]) -> None:
    # 2:4 sparsity doubles math throughput; anything else means a dense number was
    # copied from the sparse column (or the other way round).
    bad = [
        (d["id"], dtype)
        for d in devices
        for dtype, sparse in d["sparse_peak_tflops"].items()
        if not 1.9 <= sparse / d["peak_tflops"][dtype] <= 2.1
    ]
    assert not bad, bad


def test_tensor_core_gpus_beat_fp32(devices: list[dict]) -> None:
    # Every GPU here has tensor/matrix cores: bf16 (or fp16 where bf16 is absent)
    # must be at least the plain fp32 rate.
    problems = []
    for dev in devices:
        if dev["kind"] != "gpu":
            continue
        peaks = dev["peak_tflops"]
        assert "fp32" in peaks, dev["id"]
        half = peaks.get("bf16", peaks.get("fp16"))
        if half is None:
            problems.append(f"{dev['id']}: no bf16/fp16 peak")
        elif half < peaks["fp32"]:
            problems.append(f"{dev['id']}: 16-bit {half} < fp32 {peaks['fp32']}")
        if "bf16" in peaks and peaks["bf16"] < peaks["fp32"]:
            problems.append(f"{dev['id']}: bf16 {peaks['bf16']} < fp32 {peaks['fp32']}")
    assert not problems, "\n".join(problems)


def test_required_devices_present(devices: list[dict]) -> None:
    table = _lookup(devices)
    missing = [name for name in REQUIRED_LOOKUPS if name not in table]
    assert not missing, missing
    kinds = [d["kind"] for d in devices]
    assert kinds.count("cpu") >= 2


@pytest.mark.parametrize(
    ("lookup", "gib", "bf16_dense"),
    [
        # anchors users will check against nvidia-smi / datasheets
        ("h100", 81559 / 1024, 989.4),
        ("h200", 143771 / 1024, 989.4),
        ("a100-sxm-80gb", 81920 / 1024, 312.0),
        ("a100-sxm-40gb", 40960 / 1024, 312.0),
        ("l4", 23034 / 1024, 121.0),
        ("rtx-4090", 24564 / 1024, 165.2),
        ("rtx-3090", 24576 / 1024, 71.0),
        ("a10g", 23028 / 1024, 70.0),
    ],
)
def test_known_anchor_values(
    devices: list[dict], lookup: str, gib: float, bf16_dense: float
) -> None:
    dev = _lookup(devices)[lookup]
    assert dev["memory_gib"] == pytest.approx(gib, abs=0.01)
    assert dev["peak_tflops"]["bf16"] == pytest.approx(bf16_dense, rel=1e-3)


def test_unrented_and_unsold_are_zero_not_missing(devices: list[dict]) -> None:
    # TPUs are only rented; a device with neither price (sold only through OEMs, only in
    # China, no price found) must say why in price_source.
    for dev in devices:
        if dev["kind"] == "tpu":
            assert dev["list_price_usd"] == 0, dev["id"]
            assert dev["cloud_usd_per_hour"] > 0, dev["id"]
        if dev["list_price_usd"] == 0 and dev["cloud_usd_per_hour"] == 0:
            why = dev["price_source"].lower()
            if not any(reason in why for reason in UNPRICED_REASONS):
                pytest.fail(f"{dev['id']}: neither sold nor rented, and price_source does "
                            f"not say why (one of {UNPRICED_REASONS})")


def test_boost_clocks_are_the_clocks_the_fp32_peaks_are_computed_at(devices: list[dict]) -> None:
    """fp32 peak = compute units x FP32 lanes x 2 x boost clock, with 64, 128 or 256 lanes a
    unit (Volta/Turing/GA100, Ampere-Ada-Hopper-Blackwell SMs, CDNA3/CDNA4 CUs). A GPU must give
    its clock; an hpu (Gaudi: no published clock nor FP32 rate) gives none."""
    problems = []
    for dev in devices:
        clock = dev.get("boost_clock_mhz", 0)
        if not clock:
            assert dev["kind"] != "gpu", f"{dev['id']}: a GPU without its boost clock"
            continue
        assert dev["kind"] != "hpu", f"{dev['id']}: an hpu lists no clock"
        lanes = dev["peak_tflops"]["fp32"] * 1e12 / (dev["compute_units"] * 2 * clock * 1e6)
        if min(abs(lanes / n - 1) for n in (64, 128, 256)) > 0.02:
            problems.append(f"{dev['id']}: {lanes:.1f} FP32 lanes a unit at {clock} MHz")
    assert not problems, "\n".join(problems)


def test_hpus_are_gaudis_with_a_bf16_matrix_peak(devices: list[dict]) -> None:
    """kind "hpu" (Intel Gaudi, like "tpu" for Google's): matrix-engine peaks only, bf16 among
    them; no clock, so the fp32 rule above does not apply."""
    hpus = [d for d in devices if d["kind"] == "hpu"]
    assert {"gaudi2", "gaudi3"} <= {d["id"] for d in hpus}
    for dev in hpus:
        assert dev["vendor"] == "intel" and dev["arch"].startswith("gaudi"), dev["id"]
        assert "bf16" in dev["peak_tflops"] and not dev.get("boost_clock_mhz"), dev["id"]
