"""`gpuwise plan` as a user runs it: the choice with its latencies at the load, the runners-up
and why they lost, the frontier, the command that runs the choice; one error line where the
load is not given; a budget nothing meets is said so."""

from __future__ import annotations

import json

from test_cli import run

ARGS = ["plan", "qwen2.5-1.5b", "--on", "t4,l4,rtx-4090", "--rate", "2", "--tpot-ms", "50",
        "--ttft-ms", "1000"]


def test_the_plan_names_a_choice_its_latencies_and_its_command(capsys) -> None:
    code, out, err = run([*ARGS, "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    choice = rec["choice"]
    assert choice["meets"] and choice["device"] in ("t4", "l4", "rtx-4090")
    at = rec["at_load"]
    for key in ("ttft_s", "tpot_s"):
        p = at[key]
        assert p["p50"] <= p["p90"] <= p["p99"]
    assert at["tpot_s"]["p90"] <= 0.050 and at["ttft_s"]["p90"] <= 1.0
    first = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server",
             "llama.cpp": "llama-server"}[choice["runtime"]]
    assert rec["command"].startswith(first)
    others = rec["runners_up"]
    assert others and all(o["why"] for o in others)
    assert all(o["usd_per_month"] >= choice["usd_per_month"] for o in others if o["meets"])
    assert rec["speed_frontier"] and rec["search"]["sized"] < rec["search"]["configurations"]


def test_the_load_is_asked_for_and_a_budget_nothing_meets_is_said(capsys) -> None:
    code, _, err = run(["plan", "qwen2.5-1.5b", "--on", "t4"], capsys)
    assert code == 2 and err.startswith("error: give the load once")
    code, out, err = run([*ARGS, "--budget", "1"], capsys)
    assert code == 0, err
    assert "no configuration meets the targets within the limits" in out
