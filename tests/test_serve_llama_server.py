"""One short real serving load through llama.cpp's own server, replayed through `gpuwise serve`'s
simulation (docs/serve.md, "Checked against real serving"): keeps the path of
benchmarks/serve_llama_server.py and benchmarks/validate_serve_llama_cpp.py honest. The
accuracy check is the benchmark's (it probes this machine first); here the path must work:
the server's defaults read from its log, every request streamed to the last token and timed,
and the recorded arrivals, written as a trace, simulated by `gpuwise serve` to finite
latencies. CI builds the server (.ci/llama_server.sh) and sets LLAMA_SERVER. The trace and
command line of a recorded run are checked without a server too."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
MIX = (48, 8)  # prompt tokens, output tokens
TINY = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512}


def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import serve_llama_server
        import validate_serve_llama_cpp
    finally:
        sys.path.remove(str(BENCH))
    return serve_llama_server, validate_serve_llama_cpp


def tiny_model(folder: Path) -> Path:
    from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, write_random_gguf

    return write_random_gguf(folder / "tiny-f16.gguf", GgufConfig(**TINY))


def recorded_run(model: Path, settings: dict, points: list[dict]) -> dict:
    return {"server": "llama-server", "server_settings": settings, "points": points,
            "model": {"file_bytes": model.stat().st_size, "config": {**TINY, "vocab": 32000}}}


@pytest.fixture(scope="module")
def bench():
    server = os.environ.get("LLAMA_SERVER", "")
    if not Path(server).is_file():
        pytest.skip("no llama-server binary: set LLAMA_SERVER (.ci/llama_server.sh builds one)")
    pytest.importorskip("gguf")
    return (*bench_modules(), Path(server))


@pytest.mark.slow
def test_a_short_load_streams_every_token_and_replays(bench, tmp_path: Path) -> None:
    srv_mod, val_mod, binary = bench
    model = tiny_model(tmp_path)
    server = srv_mod.LlamaServer(binary, model, tmp_path / "server.log")
    settings = server.start()
    try:
        assert settings["slots"] == 4 and settings["threads"] >= 1  # llama-server's defaults
        idle = srv_mod.no_load(server.port, MIX, seed=1)
        service_s = idle["e2e_ms"] / 1e3
        point = srv_mod.run_point(server.port, server.proc.pid, MIX, "open", 2.0, service_s,
                                  n=12, window=30.0, seed=2)
    finally:
        server.stop()
    s = point["summary"]
    assert s["completed"] == 12 and s["errors"] == 0
    assert [row[5] for row in point["records"]] == [MIX[1]] * 12  # every token, ignore_eos
    assert 0 < s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"]
    point["mix"] = "tiny"
    run = recorded_run(model, settings, [point])
    rows = val_mod.validate(run, model, tmp_path, tmp_path, on="cpu-cloud-32vcpu")  # datasheet
    assert len(rows) == 5 and all(math.isfinite(r["error"]) for r in rows)
    assert all(r["simulated"] > 0 for r in rows)


def test_a_recorded_run_is_replayed_through_gpuwise_serve(tmp_path: Path) -> None:
    """Drawn lengths go into the trace as recorded, a closed loop's requests arrive at 0 and
    go to --concurrency clients, and `gpuwise serve` answers each point."""
    pytest.importorskip("gguf")
    _, val_mod = bench_modules()
    model = tiny_model(tmp_path)
    rec = [0.0, 0.0, 5.0, 9.0, 10.0, 8, 8, "limit", []]  # serve_llama_cpp.Record.row()
    open_point = {"mix": "A", "mode": "open", "rate": 4.0, "prompt_tokens": 48,
                  "output_tokens": 8, "lengths": [[30, 5], [70, 11]],
                  "records": [[0.5, *rec[1:]], [0.1, *rec[1:]]],
                  "summary": {"ttft_ms": {"p50": 5.0, "p90": 6.0},
                              "tpot_ms": {"p50": 1.0, "p90": 1.2}, "output_tokens_per_s": 50.0}}
    closed_point = {**open_point, "mode": "closed", "concurrency": 2, "lengths": None}
    settings = {"threads": 2, "slots": 2, "n_ctx_slot": 4096}
    run = recorded_run(model, settings, [open_point, closed_point])
    trace = val_mod.write_trace(open_point, tmp_path / "open.jsonl")
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert rows == [{"arrival_s": 0.1, "prompt_tokens": 70, "output_tokens": 11},
                    {"arrival_s": 0.5, "prompt_tokens": 30, "output_tokens": 5}]
    closed = val_mod.trace_rows(closed_point)
    assert [r["arrival_s"] for r in closed] == [0.0, 0.0]
    assert [r["output_tokens"] for r in closed] == [8, 8]  # the tokens received
    args = val_mod.serve_args(run, model, closed_point, trace)
    assert args[args.index("--max-seqs") + 1] == "2" and args[args.index("--concurrency") + 1] == "2"
    assert args[args.index("--on") + 1] == "local" and "--trace" in args
    rows = val_mod.validate(run, model, tmp_path, tmp_path, on="cpu-cloud-32vcpu")
    assert len(rows) == 10 and all(r["simulated"] > 0 for r in rows)


def test_lengths_are_drawn_around_the_means_with_a_fixed_seed() -> None:
    srv_mod, _ = bench_modules()
    fixed = srv_mod.draw_lengths((128, 32), 200, "fixed", seed=3)
    assert set(fixed) == {(128, 32)}
    uniform = srv_mod.draw_lengths((128, 32), 200, "uniform", seed=3)
    assert uniform == srv_mod.draw_lengths((128, 32), 200, "uniform", seed=3)
    assert all(64 <= p <= 192 and 16 <= o <= 48 for p, o in uniform)
    expo = srv_mod.draw_lengths((128, 32), 400, "exponential", seed=3)
    assert all(1 <= p <= 512 and 1 <= o <= 128 for p, o in expo)
    assert 90 < sum(p for p, _ in expo) / 400 < 150
