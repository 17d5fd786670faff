"""`gpuwise plan`'s loads (docs/plan.md, "The load"): clients in a closed loop (--concurrency)
and a recorded trace (--trace), each searched at a rate and the choice re-simulated at the load
itself; exactly one load, else one error line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_run import run_cli as run

SPACE = ["plan", "qwen2.5-1.5b", "--on", "t4", "--runtime", "vllm,sglang"]
TARGETS = ["--tpot-ms", "50", "--ttft-ms", "300"]


def test_clients_choice_meets_the_targets_in_its_closed_loop_run(capsys) -> None:
    code, out, err = run([*SPACE, "--concurrency", "8", *TARGETS, "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    load, run_, at, choice = rec["load"], rec["load_run"], rec["at_load"], rec["choice"]
    assert load["kind"] == "concurrency" and load["concurrency"] == 8
    assert load["requests_per_s"] == pytest.approx(8 / (0.300 + 127 * 0.050))  # Little's law
    assert run_["kind"] == "concurrency" and run_["meets"]
    assert choice["replicas"] == run_["replicas"] and choice["meets"]
    assert run_["clients_per_replica"] == math.ceil(8 / run_["replicas"])
    assert run_["run_warmup_requests"] == run_["clients_per_replica"]  # steady: warm-up left out
    assert at["warmup_requests"] == run_["run_warmup_requests"]
    assert at["ttft_s"]["p90"] <= 0.300 and at["tpot_s"]["p90"] <= 0.050
    assert at["slo_met_fraction"] >= 0.9
    assert run_["requests_per_s"] > 0 and run_["requests_per_s"] != load["requests_per_s"]
    # the search's cheapest (SGLang here) needs a second replica at 8 clients: the choice is
    # the cheapest that meets the targets there, and it says which it was chosen over
    assert run_["search_choice"] and run_["rechecked_configurations"] >= 2
    assert all(o["usd_per_month"] >= choice["usd_per_month"] for o in rec["runners_up"]
               if o["meets"])


def test_the_terminal_says_the_load_and_its_run(capsys) -> None:
    code, out, err = run([*SPACE, "--concurrency", "8", *TARGETS], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "8 clients in a closed loop" in flat and "Little's law" in flat
    assert "clients a replica: p50" in flat and "the clients sent" in flat


def _trace(path: Path, gap_s: float, count: int) -> Path:
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps({"arrival_s": 10.0 + i * gap_s, "prompt_tokens": 400 + 200 * (i % 2),
                                "output_tokens": 100 + 40 * (i % 2)}) + "\n")
    return path


def test_a_trace_gives_its_rate_and_the_choice_is_run_on_it(tmp_path: Path, capsys) -> None:
    trace = _trace(tmp_path / "t.jsonl", 0.5, 100)  # 2 requests a second
    code, out, err = run([*SPACE, "--trace", str(trace), "--tpot-ms", "50", "--ttft-ms", "1000",
                          "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    load, run_, at = rec["load"], rec["load_run"], rec["at_load"]
    assert load["kind"] == "trace" and load["requests_per_s"] == pytest.approx(2.0)
    assert (load["prompt_tokens"], load["new_tokens"]) == (500, 120)  # its means
    assert load["trace"]["requests"] == 100 and load["trace"]["span_s"] == pytest.approx(49.5)
    assert run_["kind"] == "trace" and run_["requests_per_s"] == pytest.approx(2.0)
    assert at["requests"] == math.ceil(100 / run_["replicas"])  # one replica's share, as dealt
    for key in ("ttft_s", "tpot_s"):
        assert at[key]["p50"] <= at[key]["p90"] <= at[key]["p99"]
    assert run_["meets"] == (at["slo_met_fraction"] >= 0.9)


def _serve_error(trace: Path, capsys) -> str:
    code, _, err = run(["serve", "qwen2.5-1.5b", "--on", "t4", "--trace", str(trace)], capsys)
    assert code == 2
    return err.splitlines()[0]


@pytest.mark.parametrize("load, starts", [
    ([], "error: give the load once"),
    (["--rate", "2", "--concurrency", "4"], "error: give the load once"),
    (["--rate", "2", "--requests-per-day", "100"], "error: give the load once"),
    (["--concurrency", "4", "--trace", "x.jsonl"], "error: give the load once"),
    (["--concurrency", "0"], "error: --concurrency must be an integer"),
    (["--concurrency", "4", "--ttft-ms", "300"], "error: --concurrency needs --tpot-ms"),
])
def test_one_load_else_one_error_line(load: list[str], starts: str, capsys) -> None:
    targets = [] if "--ttft-ms" in load else ["--tpot-ms", "50"]
    code, out, err = run([*SPACE, *load, *targets], capsys)
    assert code == 2 and not out
    lines = err.splitlines()
    assert lines[0].startswith(starts), err
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in err


def test_a_bad_trace_is_refused_as_serve_refuses_it(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n{"arrival_s": 1}\n')
    code, _, err = run([*SPACE, "--trace", str(bad), "--tpot-ms", "50"], capsys)
    assert code == 2 and err.splitlines()[0] == _serve_error(bad, capsys)
    missing = tmp_path / "missing.jsonl"
    code, _, err = run([*SPACE, "--trace", str(missing), "--tpot-ms", "50"], capsys)
    assert code == 2 and err.splitlines()[0] == _serve_error(missing, capsys)
    one = _trace(tmp_path / "one.jsonl", 1.0, 1)
    code, _, err = run([*SPACE, "--trace", str(one), "--tpot-ms", "50"], capsys)
    assert code == 2 and err.startswith("error: the trace's 1 request(s) span no time")
