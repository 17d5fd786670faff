"""gpuwise advise / cost: formulas against hand-computed figures, invariants, bad input."""

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run  # the CLI contract's runner: exit code, stdout, stderr

from gpuwise.app.lookup import model_named
from gpuwise.catalog.costs import load_costs, with_overrides
from gpuwise.catalog.hardware import find_hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.cost.advise import advise, serving_options
from gpuwise.estimate.cost.prices import (
    Usage,
    api_cost,
    break_even_utilisation,
    owned_cost,
    rent_cost,
)
from gpuwise.estimate.cost.serving_sim import size_serving_simulated
from gpuwise.estimate.cost.sizing import Candidate, Sizing
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.units import HOURS_PER_MONTH, parse_fraction
from gpuwise.workload.deployments import ServeLoad

# Round numbers so every figure below can be checked by hand.
ROUND = with_overrides(
    load_costs(), electricity_usd_per_kwh=0.1, pue=1.5, depreciation_years=4,
    hosting_usd_per_kw_month=100, ops_usd_per_device_year=120, idle_power_fraction=0.1,
    busy_power_fraction=1.0, memory_power_fraction=0.75, grid_gco2_per_kwh=500, reserved_discount=0.25,
    host_power_fraction=0.0, host_price_fraction=0.0,
)
DEVICE = replace(find_hardware("h100"), tdp_w=1000, list_price_usd=12000, cloud_usd_per_hour=2.0)
HALF = Usage(devices=1, busy_hours=365, held_hours=365, tokens=1e8)


def test_owned_cost_by_hand():
    cost = owned_cost(DEVICE, HALF, ROUND)
    # 12000 / 48 = 250 depreciation; 1 kW x $100 hosting; $120 / 12 ops.
    assert cost.breakdown_usd["depreciation"] == pytest.approx(250)
    assert cost.breakdown_usd["hosting"] == pytest.approx(100)
    assert cost.breakdown_usd["ops"] == pytest.approx(10)
    # (365 h x 1000 W + 365 h x 100 W) x 1.5 = 602.25 kWh at $0.1.
    assert cost.kwh_per_month == pytest.approx(602.25)
    assert cost.breakdown_usd["electricity"] == pytest.approx(60.225)
    assert cost.usd_per_month == pytest.approx(420.225)
    assert cost.usd_per_million_tokens == pytest.approx(4.20225)
    assert cost.co2_kg_per_month == pytest.approx(301.125)
    assert cost.wall_kw == pytest.approx(1.5)


def test_rent_and_reserved_by_hand():
    assert rent_cost(DEVICE, HALF, ROUND).usd_per_month == pytest.approx(2.0 * 365)
    reserved = rent_cost(DEVICE, HALF, ROUND, reserved=True)
    assert reserved.usd_per_month == pytest.approx(2.0 * 0.75 * 730)
    # The provider's energy is reported for the hours held: 365 h busy at 1.5 kW.
    assert rent_cost(DEVICE, HALF, ROUND).kwh_per_month == pytest.approx(547.5)


def test_break_even_by_hand_and_by_definition():
    # F = 360, e_idle = 100 W x 1.5 x 730 h x $0.1/kWh = 10.95, e_busy = 109.5:
    # h* = (360 + 10.95) / (2 x 730 - (109.5 - 10.95)) = 370.95 / 1361.45
    h = break_even_utilisation(DEVICE, ROUND)
    assert h == pytest.approx(370.95 / 1361.45)
    at = Usage(1, h * HOURS_PER_MONTH, h * HOURS_PER_MONTH, 1.0)
    assert owned_cost(DEVICE, at, ROUND).usd_per_month == pytest.approx(
        rent_cost(DEVICE, at, ROUND).usd_per_month
    )
    assert break_even_utilisation(replace(DEVICE, cloud_usd_per_hour=0), ROUND) is None
    assert break_even_utilisation(replace(DEVICE, cloud_usd_per_hour=0.01), ROUND) > 1


def test_api_cost_by_hand():
    cost = api_cost(1e8, 2e7, 0.5, 1.5, requests=1e5)
    assert cost.usd_per_month == pytest.approx(50 + 30)
    assert cost.usd_per_1000_requests == pytest.approx(0.8)
    assert cost.kwh_per_month is None


@pytest.mark.parametrize("text, value", [("0.3", 0.3), ("30%", 0.3), ("100%", 1.0), (1, 1.0)])
def test_fractions_accepted(text, value):
    assert parse_fraction(text, "utilisation") == pytest.approx(value)


@pytest.mark.parametrize("text, hint", [("30", "write 0.3 or 30%"), ("150%", "between 0 and"),
                                        ("-0.1", "between 0 and"), ("0", "between 0 and"),
                                        ("lots", "fraction")])
def test_fractions_refused(text, hint):
    with pytest.raises(GpuwiseError) as exc:
        parse_fraction(text, "utilisation")
    assert hint in exc.value.hint


@settings(max_examples=60, deadline=None)
@given(
    u1=st.floats(0.01, 1.0), u2=st.floats(0.01, 1.0), idle=st.floats(0.0, 1.0),
    pue=st.floats(1.0, 3.0), price=st.floats(0.0, 1e5), electricity=st.floats(0.0, 1.0),
    hosting=st.floats(0.0, 500.0), tdp=st.floats(1.0, 2000.0),
)
def test_higher_utilisation_never_raises_owned_cost_per_token(
    u1, u2, idle, pue, price, electricity, hosting, tdp
):
    low, high = sorted((u1, u2))
    a = with_overrides(ROUND, idle_power_fraction=idle, pue=pue, electricity_usd_per_kwh=electricity,
                       hosting_usd_per_kw_month=hosting)
    hw = replace(DEVICE, list_price_usd=price, tdp_w=tdp)
    rate = 1e6  # tokens per busy hour: tokens grow with the busy share

    def per_token(u: float) -> float:
        hours = u * HOURS_PER_MONTH
        return owned_cost(hw, Usage(1, hours, hours, rate * hours), a).usd_per_million_tokens

    assert per_token(high) <= per_token(low) * (1 + 1e-9)


@pytest.fixture(scope="module")
def small():
    return model_named("qwen2.5-0.5b")[1]


@pytest.fixture(scope="module")
def l4():
    hw = find_hardware("l4")
    return Candidate(hw, rates_from_spec(hw), "spec")


@settings(max_examples=25, deadline=None)
@given(r1=st.floats(1.0, 5e7), r2=st.floats(1.0, 5e7), util=st.floats(0.05, 1.0))
def test_more_requests_never_fewer_devices(small, l4, r1, r2, util):
    low, high = sorted((r1, r2))

    def devices(requests: float) -> int:
        load = ServeLoad(requests, 256, 64, tpot_ms=100, max_utilisation=util)
        sizing = size_serving_simulated(small, load, l4, "bf16")
        assert isinstance(sizing, Sizing)
        return sizing.devices

    assert devices(low) <= devices(high)


@settings(max_examples=20, deadline=None)
@given(requests=st.floats(1e3, 2e7), u1=st.floats(0.05, 1.0), u2=st.floats(0.05, 1.0))
def test_higher_target_utilisation_never_raises_owned_cost(small, l4, requests, u1, u2):
    """The same load on fewer, busier replicas: owned cost per token does not rise."""
    a = load_costs()

    def per_token(util: float) -> float:
        sizing = size_serving_simulated(small, ServeLoad(requests, 256, 64, max_utilisation=util),
                                        l4, "bf16")
        assert isinstance(sizing, Sizing)
        return owned_cost(l4.hw, sizing.usage, a).usd_per_million_tokens

    low, high = sorted((u1, u2))
    assert per_token(high) <= per_token(low) * (1 + 1e-9)


def _candidates(*names):
    return [Candidate(find_hardware(n), rates_from_spec(find_hardware(n)), "spec") for n in names]


def test_cpu_suffices_and_rent_below_break_even(small):
    a = load_costs()
    load = ServeLoad(2000, 256, 64, tpot_ms=500)
    result = advise(serving_options(small, load, _candidates("cpu-2s-xeon-8480", "b200"), a), a)
    assert result.choice is not None and result.choice.kind == "cpu"
    assert any("a CPU suffices" in r for r in result.reasons)
    # An always-on service holds its rental every hour: at 100% of the hours, reserve or buy.
    assert any(r.startswith("buy:") for r in result.reasons)


def test_no_option_meets_the_target(small):
    a = load_costs()
    load = ServeLoad(1e5, 256, 64, tpot_ms=0.001)
    result = advise(serving_options(small, load, _candidates("l4", "h100", "cpu-cloud-32vcpu"),
                                    a), a, target="<= 0.001 ms per output token")
    assert result.choice is None
    assert result.reasons[0].startswith("no option meets the target")
    assert len(result.closest) == 3 and not any(o.meets for o in result.closest)
    ratios = [o.miss_ratio for o in result.closest]
    assert ratios == sorted(ratios) and ratios[0] > 1


@pytest.mark.parametrize("args, message", [
    (["--requests-per-day", "-5"], "requests per day must be above 0"),
    (["--requests-per-day", "100", "--utilisation", "150%"], "utilisation must be"),
    (["--requests-per-day", "100", "--utilisation", "60"], "utilisation must be"),
    (["--train-tokens", "1e9", "--measured-util", "1.5"], "measured utilisation must be"),
    (["--requests-per-day", "100", "--train-tokens", "1e9"], "give one workload"),
    ([], "no workload given"),
    (["--requests-per-day", "100", "--pue", "0.5"], "pue must be between 1 and 5"),
    (["--requests-per-day", "100", "--api-price-per-mtok", "cheap"], "api-price-per-mtok"),
    (["--train-tokens", "1e9", "--hours-per-month", "1000"], "give one workload"),
])
def test_bad_input_is_one_clear_line(capsys, args, message):
    code, out, err = run(["advise", "qwen2.5-0.5b", "--no-local", *args], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0]
    assert len(lines) <= 2 and "Traceback" not in err


def test_unknown_hardware_did_you_mean(capsys):
    code, _, err = run(["cost", "qwen2.5-0.5b", "--on", "h100x", "--requests-per-day", "5"], capsys)
    assert code == 2 and "did you mean" in err


def test_api_needs_a_price(capsys):
    code, _, err = run(["cost", "qwen2.5-0.5b", "--on", "api", "--requests-per-day", "5"], capsys)
    assert code == 2 and "no prices for named API vendors" in err


def test_advise_json_contract(capsys):
    code, out, _ = run(["advise", "qwen2.5-0.5b", "--no-local", "--requests-per-day", "1e4",
                        "--latency-ms", "100", "--api-price-per-mtok", "0.1,0.3", "--json"],
                       capsys)
    assert code == 0
    obj = json.loads(out)
    rec = obj["recommendation"]
    assert rec["meets_target"] and rec["usd_per_month"] == min(
        o["usd_per_month"] for o in obj["options"] if o["meets_target"])
    for key in (
        "wall_kw",
        "kwh_per_month",
        "kwh_per_1000_requests",
        "co2_kg_per_month",
        "usd_per_million_tokens",
        "break_even_utilisation",
        "devices",
        "rates_source",
    ):
        assert key in rec
    assert any(o["mode"] == "api" for o in obj["options"])
    names = {a["name"] for a in obj["assumptions"]}
    assert {"electricity_usd_per_kwh", "pue", "grid_gco2_per_kwh"} <= names
    assert all(a["source"] for a in obj["assumptions"])


def test_cost_rent_json_by_hand(capsys):
    code, out, _ = run(["cost", "qwen2.5-0.5b", "--on", "h100", "--rent", "--requests-per-day",
                        "1000", "--json"], capsys)
    assert code == 0
    option = json.loads(out)["option"]
    assert option["mode"] == "on-demand" and option["devices"] == 1
    assert option["usd_per_month"] == pytest.approx(2.69 * 730)


def test_override_is_listed_as_the_users(capsys):
    code, out, _ = run(["cost", "qwen2.5-0.5b", "--on", "h100", "--owned", "--requests-per-day",
                        "1000", "--electricity", "0.3", "--json"], capsys)
    assert code == 0
    listed = {a["name"]: a for a in json.loads(out)["assumptions"]}
    assert listed["electricity_usd_per_kwh"]["value"] == 0.3
    assert listed["electricity_usd_per_kwh"]["source"] == "your --electricity"


def test_training_with_low_measured_utilisation_blames_the_pipeline(capsys):
    code, out, _ = run(["advise", "qwen2.5-0.5b", "--no-local", "--train-tokens", "1e8",
                        "--measured-util", "30%", "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert any("data pipeline is the problem, not the chip" in r for r in obj["reasons"])
    rec = obj["recommendation"]
    assert rec["job_hours"] * rec["devices"] > 0 and math.isfinite(rec["usd_per_month"])


def test_site_power_limits_owned_hardware_only(capsys):
    code, out, _ = run(["advise", "qwen2.5-0.5b", "--no-local", "--requests-per-day", "1e4",
                        "--max-kw", "0.5", "--json"], capsys)
    assert code == 0
    options = json.loads(out)["options"]
    over = [o for o in options if o["mode"] == "owned" and o["wall_kw"] and o["wall_kw"] > 0.5]
    assert over and all(not o["meets_target"] and "site power" in o["misses"] for o in over)
    assert all(o["meets_target"] for o in options if o["mode"] == "on-demand")


def test_measured_utilisation_from_a_watch_log(tmp_path, capsys):
    log = tmp_path / "watch.jsonl"
    samples = [{"kind": "sample", "t": t, "gpus": [{"util_percent": 25.0}]} for t in range(5)]
    header = {"kind": "header", "format": "gpuwise-watch/1"}
    log.write_text("\n".join(json.dumps(r) for r in [header, *samples]) + "\n")
    code, out, _ = run(["advise", "qwen2.5-0.5b", "--no-local", "--train-tokens", "1e8",
                        "--measured-util", str(log), "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["workload"]["measured_util"] == pytest.approx(0.25)
    assert any("measured utilisation is 25%" in r for r in obj["reasons"])
    cpu_only = tmp_path / "cpu.jsonl"
    cpu_only.write_text(json.dumps({"kind": "sample", "t": 0, "cpu_percent": 90}) + "\n")
    code, _, err = run(["advise", "qwen2.5-0.5b", "--no-local", "--train-tokens", "1e8",
                        "--measured-util", str(cpu_only)], capsys)
    assert code == 2 and "no GPU utilisation" in err


def test_hours_per_month_training_and_not_considered(capsys):
    code, out, _ = run(["advise", "qwen2.5-7b", "--no-local", "--hours-per-month", "100",
                        "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    rec = obj["recommendation"]
    # Full fine-tuning of 7B: 100 h of the month on every device it takes.
    assert rec["held_hours_per_device_month"] == pytest.approx(100)
    assert rec["tokens_per_month"] == pytest.approx(rec["tokens_per_s_per_replica"] * 100 * 3600)
    assert any("does not fit" in s["reason"] for s in obj["not_considered"])


def _owned(*extra: str, on: str = "rtx-4090", capsys) -> dict:
    code, out, err = run(["cost", "qwen2.5-0.5b", "--on", on, "--requests-per-day", "20000",
                          "--prompt", "256", "--new-tokens", "64", "--owned", *extra, "--json"],
                         capsys)
    assert code == 0, err
    return json.loads(out)["option"]


def test_a_geforce_card_is_costed_at_home_and_a_datacentre_gpu_in_a_datacentre(capsys):
    """A home RTX 4090 pays no colocation and no facility overhead, at the residential
    price; `--site datacentre` prices it as an H100; a flag's value wins over the site's."""
    home = _owned(capsys=capsys)
    assert home["cost_breakdown_usd"]["hosting"] == 0.0
    assert any(n.startswith("costed at home: PUE 1,") for n in home["notes"])
    dc = _owned("--site", "datacentre", capsys=capsys)
    assert dc["cost_breakdown_usd"]["hosting"] > 0 and not dc["notes"]
    assert dc["kwh_per_month"] == pytest.approx(home["kwh_per_month"] * 1.56)
    assert home["cost_breakdown_usd"]["electricity"] == pytest.approx(
        home["kwh_per_month"] * 0.16)
    pue = _owned("--pue", "1.2", capsys=capsys)
    assert pue["kwh_per_month"] == pytest.approx(home["kwh_per_month"] * 1.2)
    h100 = _owned(on="h100", capsys=capsys)
    assert h100["cost_breakdown_usd"]["hosting"] > 0
    code, _, err = run(["cost", "qwen2.5-0.5b", "--on", "h100", "--requests-per-day", "100",
                        "--site", "moon"], capsys)
    assert code == 2 and "--site 'moon' is not a site" in err
