"""One short real serving load through llama.cpp's own server, replayed through `gpuwise serve`'s
simulation (docs/serve.md, "Checked against real serving"): keeps the path of
benchmarks/serve_llama_server.py and benchmarks/validate_serve_llama_cpp.py honest. The
accuracy check is the benchmark's (it probes this machine first); here the path must work:
the server's defaults read from its log, every request streamed to the last token and timed,
and the recorded arrivals simulated to finite latencies. CI builds the server
(.ci/llama_server.sh) and sets LLAMA_SERVER."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
MIX = (48, 8)  # prompt tokens, output tokens


@pytest.fixture(scope="module")
def bench():
    server = os.environ.get("LLAMA_SERVER", "")
    if not Path(server).is_file():
        pytest.skip("no llama-server binary: set LLAMA_SERVER (.ci/llama_server.sh builds one)")
    pytest.importorskip("gguf")
    sys.path.insert(0, str(BENCH))
    try:
        import serve_llama_server
        import validate_serve_llama_cpp
    finally:
        sys.path.remove(str(BENCH))
    return serve_llama_server, validate_serve_llama_cpp, Path(server)


@pytest.mark.slow
def test_a_short_load_streams_every_token_and_replays(bench, tmp_path: Path) -> None:
    srv_mod, val_mod, binary = bench
    from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, write_random_gguf

    cfg = GgufConfig(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512)
    model = write_random_gguf(tmp_path / "tiny-f16.gguf", cfg)
    server = srv_mod.LlamaServer(binary, model, tmp_path / "server.log")
    settings = server.start()
    try:
        assert settings["slots"] == 4 and settings["threads"] >= 1  # llama-server's defaults
        idle = srv_mod.no_load(server.port, MIX, seed=1)
        service_s = idle["e2e_ms"] / 1e3
        point = srv_mod.run_point(server.port, server.proc.pid, MIX, "open", 2.0, service_s,
                                  n=12, window=30.0, seed=2)  # fmt: skip
    finally:
        server.stop()
    s = point["summary"]
    assert s["completed"] == 12 and s["errors"] == 0
    assert [row[5] for row in point["records"]] == [MIX[1]] * 12  # every token, ignore_eos
    assert 0 < s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"]
    run = {"server": "llama-server", "server_settings": settings, "no_load": {"tiny": idle},
           "model": {"file_bytes": model.stat().st_size,
                     "config": {"hidden": cfg.hidden, "layers": cfg.layers, "heads": cfg.heads,
                                "kv_heads": cfg.kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab}}}  # fmt: skip
    point["mix"] = "tiny"
    engine = val_mod.engine_for(run, {"rates": {}}, MIX[0], MIX[1])  # the datasheet's rates
    sim = val_mod.simulated(point, engine)
    assert all(math.isfinite(v) and v > 0 for v in (*sim["ttft_ms"].values(),
                                                    *sim["tpot_ms"].values()))  # fmt: skip
    assert sim["output_tokens_per_s"] > 0
