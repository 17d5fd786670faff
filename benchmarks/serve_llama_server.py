"""Real serving on this CPU through llama.cpp's own server, `llama-server` (continuous batching
over --parallel slots), under Poisson and closed-loop load, timed from the client token by
token (run on demand, not in CI; docs/serve.md, "Checked against real serving").

What it measures. A random-weight llama model of benchmarks/measure_llama_cpp.py's SIZES
(`--size`: S = hidden 512, 8 layers, 8/4 heads, ffn 1408; M, the default and the model the
time model was checked on first = hidden 1024, 12 layers, 16/4 heads, ffn 2816; L = hidden
2048, 16 layers, 16/8 heads, ffn 5632; vocab 32000; q4_0 by llama.cpp's quantizer) served by
`llama-server` with its defaults: as many threads as cores, 4 slots sharing one unified KV
cache (`--parallel` auto), n_batch 2048, n_ubatch 512, prompt caching on. Only the model, host
and port are given, and `--parallel N` with `--kv-unified` where `--parallel` is given (with
slots named, llama-server would split the cache into one stream a slot; its auto setting, and
gpuwise, share one). Two prompt/output mixes, A = (128 prompt tokens, 32 output) and B = (512,
128); `--lengths uniform` (half to 1.5x the mean) or `exponential` (the mean, clipped to
1..4x it) draws each request's prompt and output lengths around them with a fixed seed, and
each point records them (`lengths`, one [prompt, output] a request, in the records' order).
For each mix:

* no load: one warm-up request, then 5 streamed requests one at a time at the mix's mean
  lengths; the medians give TTFT, TPOT and the service time S, beside the server's own prompt
  and decode times (`timings`);
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

Before the load the llama.cpp probe runs as users run it, `gpuwise probe --runtime llama.cpp`
(`--quick-probe`: with `--quick`), with GPUWISE_CACHE_DIR at `--cache` (default: a folder
beside `--out`, FILE_cache/); the results name that folder (`probe.cache`) and
benchmarks/validate_serve_llama_cpp.py simulates every point with `gpuwise serve ... --on
local` on it, so the comparison does not depend on how busy the machine was on another day.
Just after the probe and before each point, the served model's own prompt and generation are
timed in-process (pp512 and tg32, the server idle, `reference`): the machine's speed drifts by
up to 40% within an hour here, and the readings show how far it moved. Each point records the
CPU seconds of server, client and others and is flagged "disturbed" when others kept over 5%
of the CPUs busy (serve_llama_cpp.py). On a shared machine, run it under the timing lock
(`flock /tmp/gpuwise-timing.lock ...`).

Build the server from the llama.cpp sources llama-cpp-python 0.3.36 vendors (the same ggml
the probe measures): `bash .ci/llama_server.sh` builds it (cached) and prints its path.
Run:  .venv/bin/python benchmarks/serve_llama_server.py --server "$(bash .ci/llama_server.sh)"
      [--size S|M|L] [--parallel N] [--lengths fixed|uniform|exponential] [--mixes A,B]
      [--factors 0.5,1,2,3,4] [--requests A:48,B:32] [--concurrency 4] [--no-probe]
      [--quick-probe] [--cache DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from measure_llama_cpp import SIZES, prepare_models
from public_cli import gpuwise_json
from serve_llama_cpp import (
    DEFAULT_MODELS,
    HOST,
    MIXES,
    QTYPE,
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

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "serve_llama_server.json"
DEFAULT_FACTORS = "0.5,1,2,3,4"
DEFAULT_REQUESTS = "A:48,B:32"
DISTURBED = 0.05
NO_LOAD_REPS = 5
FIRST_ID = 300  # token ids from here on are filler pieces (gguf_model.py), never special
VOCAB = 32000
LENGTHS = ("fixed", "uniform", "exponential")
EXPONENTIAL_CAP = 4  # exponential lengths are clipped to 1..4x the mean
STARTUP = re.compile(r"n_threads = (\d+)|n_slots = (\d+), n_ctx_slot = (\d+)")
CACHE_ENV = "GPUWISE_CACHE_DIR"


@dataclass
class LlamaServer:
    binary: Path
    model: Path
    log: Path
    parallel: int | None = None  # None: llama-server's own (auto: 4 slots, unified KV)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        slots = [] if self.parallel is None else ["--parallel", str(self.parallel), "--kv-unified"]
        return [str(self.binary), "-m", str(self.model), "--host", HOST, "--port",
                str(self.port), *slots]

    def start(self, timeout_s: float = 120.0) -> dict[str, Any]:
        self.port = free_port()
        argv = self.argv()
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
                            **self.settings()}
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


def draw_length(rng: random.Random, mean: int, how: str) -> int:
    """One request's length around `mean`: as it is (fixed), uniform over half to 1.5x it (as
    `gpuwise serve --prompt-dist uniform`), or exponential with that mean, clipped to 1..4x."""
    if how == "uniform":
        return rng.randint(max(1, mean // 2), mean + mean // 2)
    if how == "exponential":
        return min(EXPONENTIAL_CAP * mean, max(1, round(rng.expovariate(1.0 / mean))))
    return mean


def draw_lengths(mix: tuple[int, int], n: int, how: str, seed: int) -> list[tuple[int, int]]:
    """n (prompt, output) lengths around the mix's means, from their own seeded stream (the
    arrivals and prompt ids of a point do not move with --lengths)."""
    rng = random.Random(seed + 7)
    return [(draw_length(rng, mix[0], how), draw_length(rng, mix[1], how)) for _ in range(n)]


def stream(port: int, prompt: list[int], n_out: int, t0: float, rec: Record) -> dict[str, Any]:
    """One streamed /completion request; every token timestamped. Returns the server's
    `timings` of the request (its own prompt and decode times)."""
    body = json.dumps({"prompt": prompt, "n_predict": n_out, "stream": True, "ignore_eos": True,
                       "temperature": 0.0, "return_tokens": True})
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


def open_loop(port: int, mix: tuple[int, int], rate: float, n: int, window: float, seed: int,
              how: str = "fixed") -> tuple[list[Record], dict[str, Any]]:
    rng = random.Random(seed)
    arrivals = [0.0]
    while len(arrivals) < n and arrivals[-1] + (gap := rng.expovariate(rate)) <= window:
        arrivals.append(arrivals[-1] + gap)
    lengths = draw_lengths(mix, len(arrivals), how, seed)
    prompts = [prompt_ids(rng, p) for p, _ in lengths]
    records = [Record(arrival_s=a) for a in arrivals]
    threads, t0 = [], time.perf_counter() + 0.05
    for a, prompt, (_, n_out), rec in zip(arrivals, prompts, lengths, records, strict=True):
        time.sleep(max(0.0, t0 + a - time.perf_counter()))
        th = threading.Thread(target=stream, args=(port, prompt, n_out, t0, rec), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(900)
    return records, {"arrival_window_s": round(arrivals[-1], 2),
                     "capped_by_window": len(arrivals) < n,
                     "lengths": [list(x) for x in lengths]}


def closed_loop(port: int, mix: tuple[int, int], clients: int, n: int, seed: int,
                how: str = "fixed") -> tuple[list[Record], dict[str, Any]]:
    """`clients` clients over n requests; the records (and lengths) in sending order."""
    rng = random.Random(seed)
    lengths = draw_lengths(mix, n, how, seed)
    jobs = [(prompt_ids(rng, p), o) for p, o in lengths]
    records = closed_loop_over(jobs, clients,
                               lambda job, t0, rec: stream(port, job[0], job[1], t0, rec))
    return records, {"lengths": [list(x) for x in lengths]}


def no_load(port: int, mix: tuple[int, int], seed: int) -> dict[str, Any]:
    """A warm-up request, then NO_LOAD_REPS streamed ones, one at a time."""
    rng = random.Random(seed)
    warm = stream(port, prompt_ids(rng, mix[0]), mix[1], time.perf_counter(), Record(None))
    if warm.get("prompt_n") != mix[0]:
        raise RuntimeError(f"the server evaluated {warm.get('prompt_n')} prompt tokens, "
                           f"not {mix[0]}")
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
            "records": [r.row() for r in records]}


def reference(model: Path) -> dict[str, float]:
    """The served model's own speed in its own process, the server idle: seconds of a 512-token
    prompt (pp512) and of a generated token (tg32), each the median of 3 repetitions. Against
    the reading taken just after the probe they show how far the machine's speed moved, for
    prompts and for decoding apart."""
    run = time_llama_cpp(model, threads=os.cpu_count() or 1, n_prompt=512, n_gen=32, reps=3)
    return {"pp_s": statistics.median(run["pp_samples_s"]),
            "tg_s": statistics.median(run["tg_samples_s"]) / 32}


def in_process_step(model: Path, mix: tuple[int, int]) -> float:
    """Seconds of one decode step of the served model in its own process, one sequence at the
    no-load requests' middle depth (decode_child, the median of 3 runs of 32 steps), the server
    idle: what the server's token gaps at no load add to it is its own host work a token
    (sampling, streaming; schedulers.toml's llama.cpp `token_host_s`)."""
    depth = mix[0] + mix[1] // 2
    steps = time_decode_steps(model, threads=os.cpu_count() or 1, cases=[(depth, 1)])
    return float(steps["step_s"][f"d{depth}/s1"])


def run_point(port: int, pid: int, mix: tuple[int, int], mode: str, value: float,
              service_s: float, n: int, window: float, seed: int,
              how: str = "fixed") -> dict[str, Any]:
    gate = quiet_pause(2.0)
    meter = CpuMeter(pid)
    point: dict[str, Any] = {"prompt_tokens": mix[0], "output_tokens": mix[1], "mode": mode,
                             "lengths_drawn": how}
    if mode == "open":
        rate = round(value / service_s, 3)
        records, info = open_loop(port, mix, rate, n, window, seed, how)
        point.update({"rate_factor": value, "rate": rate})
    else:
        records, info = closed_loop(port, mix, int(value), n, seed, how)
        point["concurrency"] = int(value)
    point["cpu"] = meter.stop()
    point["quiet_gate"] = gate
    point["disturbed"] = point["cpu"]["others_frac_of_cpus"] > DISTURBED
    point["summary"] = summarize(records)
    point["records"] = [r.row() for r in records]
    point.update(info)
    return point


@contextlib.contextmanager
def cache_at(folder: Path) -> Iterator[None]:
    """GPUWISE_CACHE_DIR at `folder` while the block runs (where `gpuwise probe` saves)."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def run_probe(cache: Path, quick: bool) -> dict[str, Any]:
    """`gpuwise probe --runtime llama.cpp [--quick]` as users run it, saved in `cache`: the
    command, its seconds, the folder (relative to the repository where it is inside it) and
    the command's answer."""
    cache.mkdir(parents=True, exist_ok=True)
    args = ["probe", "--runtime", "llama.cpp", *(["--quick"] if quick else [])]
    t0 = time.perf_counter()
    with cache_at(cache):
        answer = gpuwise_json(*args)
    return {"command": f"GPUWISE_CACHE_DIR={display_path(cache)} gpuwise {' '.join(args)}",
            "cache": display_path(cache), "seconds": round(time.perf_counter() - t0, 1),
            "answer": answer}


def display_path(path: Path) -> str:
    """The path relative to the repository where it lies inside it, else absolute."""
    repo = Path(__file__).resolve().parents[1]
    full = path.resolve()
    return str(full.relative_to(repo)) if full.is_relative_to(repo) else str(full)


def model_file(folder: Path, size: str) -> Path:
    """The q4_0 GGUF of the size (written and quantized unless there: fixed seeds, the same
    bytes every time); M is serve_llama_cpp.py's model."""
    if size == "M":
        return prepare_model(folder)[0]
    return prepare_models(folder, size, [QTYPE])[1][QTYPE]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", "")),
                   help="the llama-server binary (or $LLAMA_SERVER)")
    p.add_argument("--size", default="M", choices=sorted(SIZES), help="the model's shape")
    p.add_argument("--parallel", type=int, help="llama-server's slots (default: its own, 4)")
    p.add_argument("--lengths", default="fixed", choices=LENGTHS,
                   help="each request's prompt and output lengths around the mix's means")
    p.add_argument("--mixes", default="A,B", help="A = 128/32, B = 512/128 (prompt/output)")
    p.add_argument("--factors", default=DEFAULT_FACTORS, help="rates as multiples of 1/S")
    p.add_argument("--requests", default=DEFAULT_REQUESTS, help="requests per point, per mix")
    p.add_argument("--max-window", type=float, default=60.0, help="seconds of arrivals, at most")
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (0: none)")
    p.add_argument("--no-probe", action="store_true", help="skip the llama.cpp probe (the "
                   "cache's profile, if any, stays)")
    p.add_argument("--quick-probe", action="store_true", help="gpuwise probe --quick")
    p.add_argument("--cache", type=Path, help="the probe's GPUWISE_CACHE_DIR (default: "
                   "OUT's name with _cache, beside it)")
    p.add_argument("--rerun", default="", help="only these points again (e.g. A:0.5,B:closed), "
                   "replacing them in --out; the no-load S and probe already there are kept")
    p.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.cache is None:
        args.cache = args.out.with_name(args.out.stem + "_cache")
    return args


def new_results(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    return {
        "about": {"what": __doc__.split("\n\n")[0], "when": datetime.now(UTC).isoformat(),
                  "command": " ".join(sys.argv)},
        "machine": machine(),
        "model": {"file": model.name, "file_bytes": model.stat().st_size, "size": args.size,
                  "qtype": QTYPE, "config": asdict(SIZES[args.size])},
        "server": "llama-server", "load": {"lengths": args.lengths, "seed": SEED},
        "no_load": {}, "points": [],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.server.is_file():
        print("error: no llama-server binary; give --server (see the module docstring)",
              file=sys.stderr)
        return 2
    args.models.mkdir(parents=True, exist_ok=True)
    model = model_file(args.models, args.size)
    if args.rerun:
        return rerun(args, model)
    results = new_results(args, model)
    if not args.no_probe:
        results["probe"] = run_probe(args.cache, args.quick_probe)
        print(f"probe: {results['probe']['seconds']} s -> {results['probe']['cache']}", flush=True)
        if not results["probe"]["answer"].get("trusted"):
            print("warning: the probe was set aside as not trusted; --on local will not use it: "
                  f"{results['probe']['answer'].get('warnings')}", file=sys.stderr)
    else:
        results["probe"] = {"cache": display_path(args.cache), "command": None}
    results["reference"] = reference(model)
    server = LlamaServer(args.server, model, args.models / "llama-server.log", args.parallel)
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
                                  SEED + 100 * (10 * k + i), args.lengths)
                point["mix"], point["reference"] = name, speed
                results["points"].append(point)
                s = point["summary"]
                print(f"{name} {mode} {value:g}: ttft p50 {s['ttft_ms']['p50']} ms, tpot p50 "
                      f"{s['tpot_ms']['p50']} ms, {s['output_tokens_per_s']} tok/s"
                      f"{'  (disturbed)' if point['disturbed'] else ''}", flush=True)
                args.out.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        server.stop()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def rerun(args: argparse.Namespace, model: Path) -> int:
    """Measure the points named in --rerun again, with their seeds, and put them in place."""
    results = json.loads(args.out.read_text())
    how = results.get("load", {}).get("lengths", "fixed")
    wanted = {tuple(x.split(":")) for x in args.rerun.split(",")}
    requests = dict(kv.split(":") for kv in args.requests.split(","))
    server = LlamaServer(args.server, model, args.models / "llama-server.log", args.parallel)
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
                              SEED + 100 * (10 * k + i), how)
            point["mix"], point["rerun"], point["reference"] = old["mix"], True, speed
            results["points"][j] = point
            print(f"{old['mix']} {key}: others {point['cpu']['others_frac_of_cpus']:.3f}"
                  f"{'  (disturbed)' if point['disturbed'] else ''}", flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
