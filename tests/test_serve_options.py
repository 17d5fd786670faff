"""`gpuwise serve`'s options for a published run as its server ran it (issue 37): the KV cache
dtype, the overlap scheduler, a trace's requests sent by a closed loop of clients, and what
the JSON reports of such a run (means, the steady state, the KV cache's size)."""

from __future__ import annotations

import json

import pytest

from gpuwise.cli import main


def serve_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    try:
        main(["serve", "llama-3.1-8b", "--on", "h100", *args, "--json"])
    except SystemExit as exc:
        assert exc.code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def write_trace(path, requests: list[tuple[float, int, int]]):  # type: ignore[no-untyped-def]
    path.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
                            + "\n" for t, p, o in requests))
    return str(path)


def test_an_fp8_kv_cache_holds_twice_the_positions_of_a_bf16_one(capsys):
    base = ("--concurrency", "4", "--requests", "8", "--prompt", "256", "--new-tokens", "32")
    bf16 = serve_json(capsys, *base)
    fp8 = serve_json(capsys, *base, "--kv-dtype", "fp8")
    assert fp8["plan"]["kv_dtype"] == "fp8"
    assert fp8["kv_cache_tokens"] == pytest.approx(2 * bf16["kv_cache_tokens"], rel=0.01)


def test_without_its_overlap_scheduler_sglang_answers_a_mid_step_arrival_sooner(tmp_path, capsys):
    # one long request decoding, a second arriving mid-step: the overlap scheduler picked the
    # next step before it came, so it waits a step more (docs/serve.md, "Schedulers")
    trace = write_trace(tmp_path / "t.jsonl", [(0.0, 64, 400), (1.0005, 64, 4)])
    args = ("--runtime", "sglang", "--trace", trace)
    overlap = serve_json(capsys, *args)
    serial = serve_json(capsys, *args, "--no-overlap-schedule")
    assert serial["ttft_s"]["p99"] < overlap["ttft_s"]["p99"]


def test_clients_send_a_traces_requests_in_turn(tmp_path, capsys):
    requests = [(5.0 * i, 128 + 64 * i, 16) for i in range(6)]  # arrival times are ignored
    trace = write_trace(tmp_path / "t.jsonl", requests)
    one = serve_json(capsys, "--trace", trace, "--concurrency", "1")
    three = serve_json(capsys, "--trace", trace, "--concurrency", "3")
    assert one["load"]["concurrency"] == 1 and one["requests"] == 6
    assert one["duration_s"] < 5.0  # not the trace's 25 s of arrivals
    assert three["duration_s"] < one["duration_s"]


def test_the_json_gives_means_and_the_steady_state_of_an_all_at_once_run(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [(0.0, 200, 50 + 10 * (i % 7)) for i in range(64)])
    rec = serve_json(capsys, "--trace", trace, "--max-seqs", "8")
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        assert rec[key]["p50"] <= rec[key]["p99"] and rec[key]["mean"] > 0
    steady = rec["steady_state"]
    assert steady["average_batch"] == pytest.approx(8, rel=0.1)
    assert 0 < steady["seconds"] < rec["duration_s"]
    assert steady["output_tokens_per_s"] > rec["output_tokens_per_s"]  # no drain tail in it
    assert steady["per_output_token_j"] > 0
