"""Real serving on this CPU through llama.cpp's own server, `llama-server` (continuous batching
over --parallel slots), under Poisson and closed-loop load, timed from the client token by
token (run on demand, not in CI; docs/serve.md, "Checked against real serving").

What it measures. The random-weight llama model of benchmarks/serve_llama_cpp.py (hidden 1024,
12 layers, 16 heads / 4 KV heads, ffn 2816, vocab 32000; q4_0 by llama.cpp's quantizer) served
by `llama-server` with its defaults: as many threads as cores, 4 slots sharing one unified KV
cache (`--parallel` auto), n_batch 2048, n_ubatch 512, prompt caching on. Only the model, host
and port are given. Two prompt/output mixes, A = (128 prompt tokens, 32 output) and B = (512,
128). For each mix:

* no load: one warm-up request, then 5 streamed requests one at a time; the medians give TTFT,
  TPOT and the service time S, beside the server's own prompt and decode times (`timings`);
* open loop: Poisson arrivals (fixed seed) at `--factors` x 1/S (default 0.5, 1, 2, 3, 4: one
  slot busy on average, up to past what 4 batched slots serve), each point `--requests`
  requests or `--max-window` seconds of arrivals, whichever ends first; every request is
  waited for;
* closed loop: `--concurrency` clients (default 4), each sending its next request when the
  last ends.

Requests go to the native `/completion` endpoint with the prompt as token ids (random, no
special tokens; the server reports `prompt_n`, checked equal to the prompt length),
`n_predict` = output length, `ignore_eos`, temperature 0 and `return_tokens`, so every
streamed chunk carries its token ids and each token is timestamped on arrival.

Before the load, the llama.cpp probe (`probe_llama_cpp`, the one `gpuwise probe --runtime
llama.cpp` runs) measures this machine's rates; benchmarks/validate_serve_llama_cpp.py
simulates every point from that probe, so the comparison does not depend on how busy the
machine was on another day. Just after the probe and before each point, the served model's
own prompt and generation are timed in-process (pp512 and tg32, the server idle, `reference`): the machine's
speed drifts by up to 40% within an hour here, and the readings show how far it moved. Each point records the CPU seconds of server, client and others
and is flagged "disturbed" when others kept over 5% of the CPUs busy (serve_llama_cpp.py).

Build the server from the llama.cpp sources llama-cpp-python 0.3.36 vendors (the same ggml
the probe measures):
    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: && tar xzf llama_cpp_*.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF && cmake --build build
      --target llama-server
Run:  .venv/bin/python benchmarks/serve_llama_server.py --server build/bin/llama-server
      [--mixes A,B] [--factors 0.5,1,2,3,4] [--requests A:48,B:32] [--concurrency 4]
      [--no-probe] [--out FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serve_llama_cpp import (
    DEFAULT_MODELS,
    HOST,
    MIXES,
    SEED,
    CpuMeter,
    Record,
    closed_loop_over,
    free_port,
    machine,
    prepare_model,
    quiet_pause,
    summarize,
)

from gpuwise.measure.llama_cpp.bench import time_decode_steps, time_llama_cpp
from gpuwise.measure.llama_cpp.probe import probe_llama_cpp

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "serve_llama_server.json"
DEFAULT_FACTORS = "0.5,1,2,3,4"
DEFAULT_REQUESTS = "A:48,B:32"
DISTURBED = 0.05
NO_LOAD_REPS = 5
FIRST_ID = 300  # token ids from here on are filler pieces (gguf_model.py), never special
VOCAB = 32000
STARTUP = re.compile(r"n_threads = (\d+)|n_slots = (\d+), n_ctx_slot = (\d+)")


@dataclass
class LlamaServer:
    binary: Path
    model: Path
    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> dict[str, Any]:
        self.port = free_port()
        argv = [str(self.binary), "-m", str(self.model), "--host", HOST, "--port", str(self.port)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); see {self.log}")
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return {"argv": argv[1:], "startup_s": round(time.perf_counter() - t0, 2),
                            **self.settings()}  # fmt: skip
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not answer in {timeout_s} s; see {self.log}")

    def settings(self) -> dict[str, int]:
        """Threads and slots as the server chose them (its start-up log)."""
        out: dict[str, int] = {}
        for m in STARTUP.finditer(self.log.read_text(errors="replace")):
            if m.group(1):
                out["threads"] = int(m.group(1))
            else:
                out["slots"], out["n_ctx_slot"] = int(m.group(2)), int(m.group(3))
        return out

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)


def prompt_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(n)]


def stream(port: int, prompt: list[int], n_out: int, t0: float, rec: Record) -> dict[str, Any]:
    """One streamed /completion request; every token timestamped. Returns the server's
    `timings` of the request (its own prompt and decode times)."""
    body = json.dumps({"prompt": prompt, "n_predict": n_out, "stream": True, "ignore_eos": True,
                       "temperature": 0.0, "return_tokens": True})  # fmt: skip
    conn = http.client.HTTPConnection(HOST, port, timeout=900)
    rec.send_s = time.perf_counter() - t0
    timings: dict[str, Any] = {}
    try:
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec.error = f"http {resp.status}"
            return timings
        while line := resp.readline():
            now = time.perf_counter() - t0
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("tokens"):
                rec.chunks += 1
                rec.times.extend([now] * len(chunk["tokens"]))
            if chunk.get("stop"):
                rec.done_s, rec.finish = now, chunk.get("stop_type")
                timings = chunk.get("timings") or {}
                break
    except OSError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return timings


def open_loop(port: int, mix: tuple[int, int], rate: float, n: int, window: float,
              seed: int) -> tuple[list[Record], dict[str, Any]]:  # fmt: skip
    rng = random.Random(seed)
    arrivals = [0.0]
    while len(arrivals) < n and arrivals[-1] + (gap := rng.expovariate(rate)) <= window:
        arrivals.append(arrivals[-1] + gap)
    prompts = [prompt_ids(rng, mix[0]) for _ in arrivals]
    records = [Record(arrival_s=a) for a in arrivals]
    threads, t0 = [], time.perf_counter() + 0.05
    for a, prompt, rec in zip(arrivals, prompts, records, strict=True):
        time.sleep(max(0.0, t0 + a - time.perf_counter()))
        th = threading.Thread(target=stream, args=(port, prompt, mix[1], t0, rec), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(900)
    return records, {"arrival_window_s": round(arrivals[-1], 2),
                     "capped_by_window": len(arrivals) < n}  # fmt: skip


def closed_loop(port: int, mix: tuple[int, int], clients: int, n: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    prompts = [prompt_ids(rng, mix[0]) for _ in range(n)]
    return closed_loop_over(prompts, clients,
                            lambda prompt, t0, rec: stream(port, prompt, mix[1], t0, rec))  # fmt: skip


def no_load(port: int, mix: tuple[int, int], seed: int) -> dict[str, Any]:
    """A warm-up request, then NO_LOAD_REPS streamed ones, one at a time."""
    rng = random.Random(seed)
    warm = stream(port, prompt_ids(rng, mix[0]), mix[1], time.perf_counter(), Record(None))
    if warm.get("prompt_n") != mix[0]:
        raise RuntimeError(f"the server evaluated {warm.get('prompt_n')} prompt tokens, "
                           f"not {mix[0]}")  # fmt: skip
    records, server = [], []
    for _ in range(NO_LOAD_REPS):
        time.sleep(0.3)
        rec = Record(arrival_s=None)
        server.append(stream(port, prompt_ids(rng, mix[0]), mix[1], time.perf_counter(), rec))
        records.append(rec)
    s = summarize(records)
    mid = sorted(server, key=lambda t: t["prompt_ms"] + t["predicted_ms"])[NO_LOAD_REPS // 2]
    return {"ttft_ms": s["ttft_ms"]["p50"], "tpot_ms": s["tpot_ms"]["p50"],
            "e2e_ms": s["e2e_ms"]["p50"], "server_prompt_ms": mid["prompt_ms"],
            "server_decode_ms_per_token": mid["predicted_per_token_ms"],
            "records": [r.row() for r in records]}  # fmt: skip


def reference(model: Path) -> dict[str, float]:
    """The served model's own speed in its own process, the server idle: seconds of a 512-token
    prompt (pp512) and of a generated token (tg32), each the median of 3 repetitions. Against
    the reading taken just after the probe they show how far the machine's speed moved, for
    prompts and for decoding apart (validate_serve_llama_cpp.py `--drift`)."""
    run = time_llama_cpp(model, threads=os.cpu_count() or 1, n_prompt=512, n_gen=32, reps=3)
    return {"pp_s": statistics.median(run["pp_samples_s"]),
            "tg_s": statistics.median(run["tg_samples_s"]) / 32}  # fmt: skip


def in_process_step(model: Path, mix: tuple[int, int]) -> float:
    """Seconds of one decode step of the served model in its own process, one sequence at the
    no-load requests' middle depth (decode_child, the median of 3 runs of 32 steps), the server
    idle: what the server's token gaps at no load add to it is its own host work a token
    (sampling, streaming; validate_serve_llama_cpp.py `token_host_s`)."""
    depth = mix[0] + mix[1] // 2
    steps = time_decode_steps(model, threads=os.cpu_count() or 1, cases=[(depth, 1)])
    return float(steps["step_s"][f"d{depth}/s1"])


def run_point(port: int, pid: int, mix: tuple[int, int], mode: str, value: float,
              service_s: float, n: int, window: float, seed: int) -> dict[str, Any]:  # fmt: skip
    gate = quiet_pause(2.0)
    meter = CpuMeter(pid)
    point: dict[str, Any] = {"prompt_tokens": mix[0], "output_tokens": mix[1], "mode": mode}
    if mode == "open":
        rate = round(value / service_s, 3)
        records, info = open_loop(port, mix, rate, n, window, seed)
        point.update({"rate_factor": value, "rate": rate, **info})
    else:
        records = closed_loop(port, mix, int(value), n, seed)
        point["concurrency"] = int(value)
    point["cpu"] = meter.stop()
    point["quiet_gate"] = gate
    point["disturbed"] = point["cpu"]["others_frac_of_cpus"] > DISTURBED
    point["summary"] = summarize(records)
    point["records"] = [r.row() for r in records]
    return point


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", "")),
                   help="the llama-server binary (or $LLAMA_SERVER)")  # fmt: skip
    p.add_argument("--mixes", default="A,B", help="A = 128/32, B = 512/128 (prompt/output)")
    p.add_argument("--factors", default=DEFAULT_FACTORS, help="rates as multiples of 1/S")
    p.add_argument("--requests", default=DEFAULT_REQUESTS, help="requests per point, per mix")
    p.add_argument("--max-window", type=float, default=60.0, help="seconds of arrivals, at most")
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (0: none)")
    p.add_argument("--no-probe", action="store_true", help="skip the llama.cpp probe")
    p.add_argument("--rerun", default="", help="only these points again (e.g. A:0.5,B:closed), "
                   "replacing them in --out; the no-load S and probe already there are kept")
    p.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.server.is_file():
        print("error: no llama-server binary; give --server (see the module docstring)",
              file=sys.stderr)  # fmt: skip
        return 2
    args.models.mkdir(parents=True, exist_ok=True)
    model, _ = prepare_model(args.models)
    if args.rerun:
        return rerun(args, model)
    results: dict[str, Any] = {
        "about": {"what": __doc__.split("\n\n")[0], "when": datetime.now(UTC).isoformat(),
                  "command": " ".join(sys.argv)},  # fmt: skip
        "machine": machine(), "model": {"file": model.name, "file_bytes": model.stat().st_size,
                                        "config": json.loads(_model_config())},  # fmt: skip
        "server": "llama-server", "no_load": {}, "points": [],
    }
    if not args.no_probe:
        t0 = time.perf_counter()
        results["probe"] = probe_llama_cpp(os.cpu_count() or 1)
        results["probe_s"] = round(time.perf_counter() - t0, 1)
        results["reference"] = reference(model)
    server = LlamaServer(args.server, model, args.models / "llama-server.log")
    results["server_settings"] = server.start()
    requests = dict(kv.split(":") for kv in args.requests.split(","))
    try:
        for k, name in enumerate(args.mixes.split(",")):
            mix = MIXES[name]
            nl = results["no_load"][name] = no_load(server.port, mix, SEED + k)
            nl["in_process_step_s"] = in_process_step(model, mix)
            plan = [("open", float(f)) for f in args.factors.split(",")]
            plan += [("closed", float(args.concurrency))] if args.concurrency else []
            for i, (mode, value) in enumerate(plan):
                speed = reference(model)
                point = run_point(server.port, server.proc.pid, mix, mode, value,  # type: ignore[union-attr]
                                  nl["e2e_ms"] / 1e3, int(requests[name]), args.max_window,
                                  SEED + 100 * (10 * k + i))  # fmt: skip
                point["mix"], point["reference"] = name, speed
                results["points"].append(point)
                s = point["summary"]
                print(f"{name} {mode} {value:g}: ttft p50 {s['ttft_ms']['p50']} ms, tpot p50 "
                      f"{s['tpot_ms']['p50']} ms, {s['output_tokens_per_s']} tok/s"
                      f"{'  (disturbed)' if point['disturbed'] else ''}", flush=True)  # fmt: skip
                args.out.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        server.stop()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def rerun(args: argparse.Namespace, model: Path) -> int:
    """Measure the points named in --rerun again, with their seeds, and put them in place."""
    results = json.loads(args.out.read_text())
    wanted = {tuple(x.split(":")) for x in args.rerun.split(",")}
    requests = dict(kv.split(":") for kv in args.requests.split(","))
    server = LlamaServer(args.server, model, args.models / "llama-server.log")
    server.start()
    try:
        for j, old in enumerate(results["points"]):
            key = "closed" if old["mode"] == "closed" else f"{old['rate_factor']:g}"
            if (old["mix"], key) not in wanted:
                continue
            k = list(MIXES).index(old["mix"])
            mix, value = MIXES[old["mix"]], old.get("rate_factor") or old["concurrency"]
            i = sum(1 for p in results["points"][:j] if p["mix"] == old["mix"])
            speed = reference(model)
            point = run_point(server.port, server.proc.pid, mix, old["mode"], float(value),  # type: ignore[union-attr]
                              results["no_load"][old["mix"]]["e2e_ms"] / 1e3,
                              int(requests[old["mix"]]), args.max_window,
                              SEED + 100 * (10 * k + i))  # fmt: skip
            point["mix"], point["rerun"], point["reference"] = old["mix"], True, speed
            results["points"][j] = point
            print(f"{old['mix']} {key}: others {point['cpu']['others_frac_of_cpus']:.3f}"
                  f"{'  (disturbed)' if point['disturbed'] else ''}", flush=True)  # fmt: skip
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        server.stop()
    return 0


def _model_config() -> str:
    from serve_llama_cpp import MODEL_CFG

    return json.dumps({"hidden": MODEL_CFG.hidden, "layers": MODEL_CFG.layers,
                       "heads": MODEL_CFG.heads, "kv_heads": MODEL_CFG.kv_heads,
                       "ffn": MODEL_CFG.ffn, "vocab": MODEL_CFG.vocab})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
