"""Real serving measurements on this CPU: llama-cpp-python's OpenAI-compatible server under
Poisson and closed-loop load, timed from the client token by token (run on demand, not in CI).

What it measures. One random-weight llama model (hidden 1024, 12 layers, 16 heads / 4 KV heads,
ffn 2816, vocab 32000, untied head; q4_0 by llama.cpp's own quantizer, 122 MB) served by
`python -m llama_cpp.server` (llama-cpp-python 0.3.36) with 2 threads for decode and prompt.
Two prompt/output mixes, A = (128 prompt tokens, 32 output) and B = (512, 128). For each mix:

* no load: one untimed non-streamed request (checks `usage.prompt_tokens`), then 5 streamed
  requests one at a time; the medians give TTFT, TPOT and the service time S;
* open loop: Poisson arrivals (fixed seed) at 0.25, 0.5, 0.8, 1.0 and 1.3 x 1/S, each point
  `--requests` requests or `--max-window` seconds of arrivals, whichever ends first; every
  request is waited for (the queue drains), so past saturation a point runs longer;
* closed loop: `--concurrency` clients, each sending its next request when the last ends.

Plus three side measurements: the same requests through `llama_cpp.Llama` in-process (no HTTP:
what the server adds), the server with `--logits_all False` at no load (its default, True,
computes the output head for every prompt token), and the server with its default
`--interrupt_requests True` under load (a waiting request cuts the streaming one short).

How. The server runs as a child process on a free port; its stderr (llama.cpp's per-request
perf lines, verbose being the default) goes to a log that is parsed for llama.cpp's own
per-request total time. The client is stdlib only: one thread per request, http.client,
`stream: true`, and every SSE chunk is timestamped with time.perf_counter on arrival. The
completions endpoint takes text only (`prompt: str | list[str]`; token ids are rejected), so
prompts are random lowercase letters: the vocabulary written by gguf_model has no merges, so
each letter is one byte token, plus BOS and the three byte tokens of the leading "\u2581":
L - 4 letters make exactly L prompt tokens (checked with /extras/tokenize and `usage`). The
random model emits filler tokens (" t123") and, rarely, byte tokens; the tokens in a chunk are
counted from its text (a multi-byte character arrives as one chunk of several tokens).
`max_tokens` = output length, temperature 0; there is no ignore_eos (min_tokens would add a
Python logits processor), an early EOS shows as finish "stop" and a shorter output.

Per point the result holds the per-request records (fields in "record_fields"; token gaps in
tenths of a millisecond), and summaries: TTFT, TPOT ((last token - first token) /
(tokens - 1)), inter-token latency, e2e (send to [DONE]) percentiles, output tokens/s and
requests/s over the window (first send to last [DONE]), the queueing delay inferred from the
client (the server reports none: it serves one request at a time in arrival order, so a
request starts when both it has been sent and the one before it has finished), llama.cpp's
own per-request time from the server log, and the CPU seconds of server, client and anything
else (so a busy neighbour shows).

Before every load point the benchmark idles `--pause` seconds (default 11): the server's
per-token time depends on how many worker threads have run llama_decode (see "threading" in
the result), and anyio retires worker threads idle for 10 s, so each point starts alike.

Run:  .venv/bin/python benchmarks/serve_llama_cpp.py [--mixes A,B] [--factors 0.25,0.5,0.8,1,1.3]
      [--requests A:50,B:36] [--max-window 120] [--concurrency 4] [--pause 11] [--no-side]
      [--models DIR] [--out FILE]

The model is written to `--models` (default /tmp/gpuwise-serve; reused when present). The
result goes to benchmarks/results/serve_llama_cpp.json, rewritten after every point.

Neighbours. On 2 vCPUs any other busy process stalls the 2-thread server (a 1.4 s gap inside
one stream, then a queue that takes tens of seconds to drain), so each point records the CPU
seconds of server, client and others, waits before it for a quiet second (up to 60 s), and
is flagged "disturbed" when others kept over 5% of the CPUs busy. `--rerun A:0.5,B:closed`
measures named points again with the same seeds and keeps, of the two, the less disturbed one
in "points" (the other in "points_replaced").

The default run took 13 min 4 s of wall time on this machine (2 vCPUs of an AMD EPYC with
AVX-512; the model, written and quantized in 4 s, was already there), and the rerun of four
points 4 min. Other work ran on the machine meanwhile: 7 of the 12 points kept are flagged.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwise.measure.llama_cpp.gguf_model import GgufConfig, quantize, write_random_gguf

MODEL_CFG = GgufConfig(hidden=1024, layers=12, heads=16, kv_heads=4, ffn=2816)
QTYPE = "q4_0"
MIXES = {"A": (128, 32), "B": (512, 128)}
DEFAULT_FACTORS = "0.25,0.5,0.8,1.0,1.3"
DEFAULT_REQUESTS = "A:50,B:36"
HOST = "127.0.0.1"
N_CTX = 2048
THREADS = 2
NO_LOAD_REPS = 5
SEED = 1234
DISTURBED = 0.05  # other processes' share of the CPUs above which a point is flagged
PREFIX_TOKENS = 4  # BOS and the 3 byte tokens of the leading "\u2581" the tokenizer adds
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "serve_llama_cpp.json"
DEFAULT_MODELS = Path("/tmp/gpuwise-serve")
LLAMA_BENCH_RESULT = Path(__file__).resolve().parent / "results" / "llama_cpp_cpu.json"
APP_PY = "llama_cpp/server/app.py"
RECORD_FIELDS = [
    "arrival_s",
    "send_s",
    "ttft_ms",
    "last_token_ms",
    "done_ms",
    "tokens",
    "chunks",
    "finish",
    "gaps_0.1ms",
]
FILLER = re.compile(r" t\d+")
PERF_TOTAL = re.compile(r"total time =\s*([\d.]+) ms /\s*(\d+) tokens")
PREFIX_HIT = re.compile(r"Llama.generate: (\d+) prefix-match hit")


# --------------------------------------------------------------------------- machine, CPU time


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def machine() -> dict[str, Any]:
    flags = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = line
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "avx512f": " avx512f" in flags,
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": sys.version.split()[0],
    }


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (all threads)


def system_busy_s() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLK_TCK


class CpuMeter:
    """CPU seconds of the server, this client and everything else over a span."""

    def __init__(self, server_pid: int | None) -> None:
        self.pid = server_pid
        self.start = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        server = proc_cpu_s(self.pid) if self.pid else 0.0
        own = os.times()
        return time.perf_counter(), server, own.user + own.system, system_busy_s()

    def stop(self) -> dict[str, float]:
        end = self._read()
        wall, server, client, busy = (b - a for a, b in zip(self.start, end, strict=True))
        others = max(0.0, busy - server - client)
        return {
            "wall_s": round(wall, 2),
            "server_cpu_s": round(server, 2),
            "client_cpu_s": round(client, 2),
            "others_cpu_s": round(others, 2),
            "others_frac_of_cpus": round(others / (max(wall, 1e-6) * (os.cpu_count() or 1)), 3),
        }


# --------------------------------------------------------------------------- model, prompts


def prepare_model(folder: Path) -> tuple[Path, float]:
    """The q4_0 model file (written and quantized unless present) and the seconds it took."""
    t0 = time.perf_counter()
    dst = folder / f"M-{MODEL_CFG.name}-{QTYPE}.gguf"
    if not dst.is_file():
        src = write_random_gguf(folder / f"M-{MODEL_CFG.name}-f16.gguf", MODEL_CFG)
        quantize(src, dst, QTYPE)
        src.unlink()
    return dst, time.perf_counter() - t0


def make_prompt(rng: random.Random, n_tokens: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n_tokens - PREFIX_TOKENS))


def chunk_tokens(text: str) -> int:
    """Tokens in one streamed chunk: filler pieces (" t123") plus one per byte of the rest."""
    rest = FILLER.sub("", text)
    return max(1, len(FILLER.findall(text)) + len(rest.encode("utf-8")))


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    model: Path
    log: Path
    options: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        opts = {
            "--model": str(self.model),
            "--n_ctx": str(N_CTX),
            "--n_threads": str(THREADS),
            "--n_threads_batch": str(THREADS),
            "--host": HOST,
            "--port": str(self.port),
            **self.options,
        }
        return [sys.executable, "-m", "llama_cpp.server"] + [x for kv in opts.items() for x in kv]

    def start(self, timeout_s: float = 120.0) -> float:
        self.port = free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log, "wb") as log:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env)
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {self.log}")
            try:
                status, _ = http_json(self.port, "GET", "/v1/models", None)
                if status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not answer in {timeout_s} s; see {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def threads(self) -> int | None:
        """OS threads of the server process (each OpenMP team adds its workers)."""
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/task")) if self.proc else None
        except OSError:
            return None

    def log_size(self) -> int:
        return self.log.stat().st_size

    def log_since(self, offset: int) -> dict[str, Any]:
        """llama.cpp's per-request total times and the prefix-cache hits logged since offset."""
        time.sleep(0.3)
        with open(self.log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
        totals = [float(m.group(1)) for m in PERF_TOTAL.finditer(text)]
        hits = [int(m.group(1)) for m in PREFIX_HIT.finditer(text)]
        return {"llama_total_ms": [round(t, 1) for t in totals], "prefix_hit_tokens": hits}


def http_json(port: int, method: str, path: str, body: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        data = json.dumps(body) if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


# --------------------------------------------------------------------------- one request


@dataclass
class Record:
    arrival_s: float | None
    send_s: float = 0.0
    times: list[float] = field(default_factory=list)  # one per token (absolute, point clock)
    chunks: int = 0
    done_s: float | None = None
    finish: str | None = None
    error: str | None = None

    @property
    def first_s(self) -> float | None:
        return self.times[0] if self.times else None

    def row(self) -> list[Any]:
        ms = 1000.0
        first = self.first_s
        gaps = [round((b - a) * 1e4) for a, b in zip(self.times, self.times[1:], strict=False)]
        arrival = None if self.arrival_s is None else round(self.arrival_s, 4)
        return [
            arrival,
            round(self.send_s, 4),
            None if first is None else round((first - self.send_s) * ms, 1),
            round((self.times[-1] - self.send_s) * ms, 1) if self.times else None,
            None if self.done_s is None else round((self.done_s - self.send_s) * ms, 1),
            len(self.times),
            self.chunks,
            self.finish or self.error,
            gaps,
        ]


def stream_request(port: int, prompt: str, max_tokens: int, t0: float, rec: Record) -> None:
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    )
    conn = http.client.HTTPConnection(HOST, port, timeout=900)
    rec.send_s = time.perf_counter() - t0
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec.error = f"http {resp.status}"
            return
        while True:
            line = resp.readline()
            now = time.perf_counter() - t0
            if not line:
                break
            if not line.startswith(b"data: "):
                continue  # blank separators and ": ping" comments
            payload = line[6:].strip()
            if payload == b"[DONE]":
                rec.done_s = now
                break
            choice = json.loads(payload)["choices"][0]
            if choice.get("finish_reason") is not None:
                rec.finish = choice["finish_reason"]
                continue
            rec.chunks += 1
            rec.times.extend([now] * chunk_tokens(choice.get("text") or ""))
    except OSError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if rec.done_s is not None and rec.finish is None and rec.error is None:
        rec.finish = "interrupted"  # [DONE] without a finish chunk: cut short by the server


# --------------------------------------------------------------------------- load generators


def run_open_loop(
    port: int, mix: tuple[int, int], rate: float, n: int, max_window: float, seed: int
) -> tuple[list[Record], dict[str, Any]]:
    """Poisson arrivals at `rate` (first at 0) until n requests or max_window seconds."""
    rng = random.Random(seed)
    arrivals = [0.0]
    while len(arrivals) < n:
        nxt = arrivals[-1] + rng.expovariate(rate)
        if nxt > max_window:
            break
        arrivals.append(nxt)
    prompts = [make_prompt(rng, mix[0]) for _ in arrivals]
    records = [Record(arrival_s=a) for a in arrivals]
    threads = []
    t0 = time.perf_counter() + 0.05
    for a, prompt, rec in zip(arrivals, prompts, records, strict=True):
        delay = t0 + a - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(
            target=stream_request, args=(port, prompt, mix[1], t0, rec), daemon=True
        )
        th.start()
        threads.append(th)
    for th in threads:
        th.join(900)
    info = {
        "arrival_window_s": round(arrivals[-1], 2),
        "capped_by_window": len(arrivals) < n,
        "offered_rate": round((len(arrivals) - 1) / arrivals[-1], 3) if len(arrivals) > 1 else None,
    }
    return records, info


def run_closed_loop(
    port: int, mix: tuple[int, int], concurrency: int, n: int, seed: int
) -> list[Record]:
    rng = random.Random(seed)
    prompts = [make_prompt(rng, mix[0]) for _ in range(n)]
    return closed_loop_over(prompts, concurrency,
                            lambda prompt, t0, rec: stream_request(port, prompt, mix[1], t0, rec))


def closed_loop_over(prompts: list[Any], clients: int,
                     send: Callable[[Any, float, Record], Any]) -> list[Record]:
    """`clients` threads, each sending the next of `prompts` (`send(prompt, t0, record)`) as
    soon as its previous request is done; the records in sending order."""
    records: list[Record] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                if len(records) >= len(prompts):
                    return
                rec = Record(arrival_s=None)
                prompt = prompts[len(records)]
                records.append(rec)
            send(prompt, t0, rec)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(1800)
    return records


# --------------------------------------------------------------------------- summaries


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def dist(values: list[float], qs: tuple[int, ...], scale: float = 1000.0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for q in qs:
        v = pct(values, q)
        out[f"p{q}"] = None if v is None else round(v * scale, 2)
    out["mean"] = round(statistics.fmean(values) * scale, 2) if values else None
    return out


def summarize(records: list[Record]) -> dict[str, Any]:
    ok = [r for r in records if r.done_s is not None and r.times and r.error is None]
    ttft = [r.times[0] - r.send_s for r in ok]
    tpot = [(r.times[-1] - r.times[0]) / (len(r.times) - 1) for r in ok if len(r.times) > 1]
    itl = [b - a for r in ok for a, b in zip(r.times, r.times[1:], strict=False)]
    e2e = [r.done_s - r.send_s for r in ok if r.done_s is not None]
    # The server serves one request at a time in arrival order: a request starts when it has
    # been sent and the one served before it has finished (ordered by first token).
    order = sorted(ok, key=lambda r: r.times[0])
    queue, service, service_ttft = [], [], []
    prev_done = None
    for r in order:
        start = r.send_s if prev_done is None else max(r.send_s, prev_done)
        queue.append(start - r.send_s)
        service.append(r.done_s - start)
        service_ttft.append(r.times[0] - start)
        prev_done = r.done_s
    window = (max(r.done_s for r in ok) - min(r.send_s for r in ok)) if ok else 0.0
    tokens = sum(len(r.times) for r in ok)
    return {
        "completed": len(ok),
        "errors": sum(1 for r in records if r.error),
        "finish": {
            k: sum(1 for r in records if (r.finish or r.error) == k)
            for k in sorted({str(r.finish or r.error) for r in records})
        },
        "output_tokens": tokens,
        "multi_token_chunks": sum(r.chunks < len(r.times) for r in ok),
        "window_s": round(window, 3),
        "ttft_ms": dist(ttft, (50, 90, 99)),
        "tpot_ms": dist(tpot, (50, 90)),
        "itl_ms": dist(itl, (50, 90, 99)),
        "e2e_ms": dist(e2e, (50, 90, 99)),
        "output_tokens_per_s": round(tokens / window, 2) if window else None,
        "requests_per_s": round(len(ok) / window, 3) if window else None,
        "queue_ms_inferred": dist(queue, (50, 90, 99)),
        "service_ms_inferred": dist(service, (50, 90)),
        "service_ttft_ms_inferred": dist(service_ttft, (50, 90)),
    }


def llama_summary(log: dict[str, Any]) -> dict[str, Any]:
    totals = [t / 1000.0 for t in log["llama_total_ms"]]
    return {
        "llama_total_ms": dist(totals, (50, 90)),
        "n_logged": len(totals),
        "prefix_hit_tokens": sorted(set(log["prefix_hit_tokens"])),
    }


# --------------------------------------------------------------------------- measurements


def no_load(server: Server, mix: tuple[int, int], seed: int, reps: int) -> dict[str, Any]:
    """One non-streamed request (checks usage), then `reps` streamed ones, one at a time."""
    rng = random.Random(seed)
    prompt = make_prompt(rng, mix[0])
    _, tok = http_json(server.port, "POST", "/extras/tokenize", {"input": prompt})
    _, warm = http_json(
        server.port,
        "POST",
        "/v1/completions",
        {"prompt": prompt, "max_tokens": mix[1], "temperature": 0.0},
    )
    offset = server.log_size()
    records = []
    for _ in range(reps):
        time.sleep(0.3)
        rec = Record(arrival_s=None)
        stream_request(server.port, make_prompt(rng, mix[0]), mix[1], time.perf_counter(), rec)
        records.append(rec)
    s = summarize(records)
    out = {
        "tokenize_len": len(tok["tokens"]),
        "warmup_usage": warm["usage"],
        "reps": reps,
        "ttft_ms": s["ttft_ms"]["p50"],
        "tpot_ms": s["tpot_ms"]["p50"],
        "e2e_ms": s["e2e_ms"]["p50"],
        "output_tokens": [len(r.times) for r in records],
        "ttft_ms_all": [round((r.times[0] - r.send_s) * 1000, 1) for r in records],
        "tpot_ms_all": [
            round((r.times[-1] - r.times[0]) / (len(r.times) - 1) * 1000, 2) for r in records
        ],
        "e2e_ms_all": [round((r.done_s - r.send_s) * 1000, 1) for r in records if r.done_s],
        "records": [r.row() for r in records],
    }
    out.update(llama_summary(server.log_since(offset)))
    out["server_threads"] = server.threads()
    return out


def in_process(model: Path, mixes: dict[str, tuple[int, int]], reps: int) -> dict[str, Any]:
    """The same requests through llama_cpp.Llama in this process: no HTTP, no server."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model),
        n_ctx=N_CTX,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        verbose=False,
    )
    out: dict[str, Any] = {
        "note": "llama_cpp.Llama(n_ctx=2048, n_threads=2, n_threads_batch=2,"
        " logits_all=True), create_completion(stream=True), median of reps"
    }
    for name, (n_prompt, n_out) in mixes.items():
        rng = random.Random(SEED + 7)
        ttft, tpot, e2e = [], [], []
        for rep in range(reps + 1):
            prompt = make_prompt(rng, n_prompt)
            t0 = time.perf_counter()
            times: list[float] = []
            for chunk in llm.create_completion(
                prompt, max_tokens=n_out, temperature=0.0, stream=True
            ):
                if chunk["choices"][0]["finish_reason"] is None:
                    now = time.perf_counter()
                    times.extend([now] * chunk_tokens(chunk["choices"][0]["text"]))
            end = time.perf_counter()
            if rep == 0:
                continue  # warm-up
            ttft.append(times[0] - t0)
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
            e2e.append(end - t0)
        out[name] = {
            "ttft_ms": round(statistics.median(ttft) * 1000, 2),
            "tpot_ms": round(statistics.median(tpot) * 1000, 3),
            "e2e_ms": round(statistics.median(e2e) * 1000, 1),
            "reps": reps,
        }
    del llm
    return out


def llama_bench_reference() -> dict[str, Any] | None:
    """pp/tg speeds of the same model from benchmarks/results/llama_cpp_cpu.json, if there."""
    try:
        runs = json.loads(LLAMA_BENCH_RESULT.read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return None
    for run in runs:
        if run.get("size") == "M" and run.get("qtype") == QTYPE and run.get("threads") == THREADS:
            keys = (
                "n_prompt",
                "n_gen",
                "pp_tokens_per_s",
                "tg_tokens_per_s",
                "tg_s_per_token",
                "n_batch",
                "n_ubatch",
                "flash_attn",
            )
            return {
                "source": "benchmarks/results/llama_cpp_cpu.json",
                **{k: run.get(k) for k in keys},
            }
    return None


def source_line(path: Path, needle: str) -> int | None:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    return None


def server_notes() -> dict[str, Any]:
    """Where llama-cpp-python's server decides how requests are scheduled (file:line)."""
    import llama_cpp

    root = Path(llama_cpp.__file__).resolve().parent
    app, llama, settings = root / "server/app.py", root / "llama.py", root / "server/settings.py"

    def at(path: Path, needle: str) -> str:
        return f"{path.relative_to(root.parent)}:{source_line(path, needle)}"

    return {
        "scheduling": (
            "One request at a time, no batching across requests: a single Llama object "
            "(one llama_context, one sequence) behind two module-level anyio Locks. Every "
            "completion/chat request (and /extras/tokenize) takes them via get_llama_proxy(); "
            "a streaming request holds the inner lock until its last chunk and [DONE] are sent. "
            "anyio's asyncio Lock hands over to waiters first-in first-out, so requests are "
            "served in arrival order. With interrupt_requests True (the default) a streaming "
            "request is cut short (a bare [DONE], no finish chunk) as soon as any other request "
            "is waiting, i.e. under concurrent load each in-flight stream is truncated after its "
            "next token; this run sets --interrupt_requests False for the load grid and "
            "measures the default separately (default_interrupt)."
        ),
        "source": {
            "locks": at(app, "llama_outer_lock = Lock()"),
            "get_llama_proxy (double lock)": at(app, "async def get_llama_proxy"),
            "stream holds the lock for the whole generation": at(
                app, "async with contextlib.asynccontextmanager(get_llama_proxy)() as llama_proxy:"
            ),
            "interrupt check per chunk": at(
                app, "if interrupt_requests and llama_outer_lock.locked()"
            ),
            "prompt list must have <= 1 element (text only)": at(
                app, "assert len(body.prompt) <= 1"
            ),
            "interrupt_requests default True": at(settings, "interrupt_requests: bool"),
            "logits_all default True": at(settings, "logits_all: bool = Field(default=True"),
            "KV prefix reuse with the previous request": at(
                llama, "# Check for kv cache prefix match"
            ),
            "anyio Lock FIFO hand-over": "anyio/_backends/_asyncio.py Lock.release: _waiters.popleft() (anyio 4.16)",
            "sync generator dependency (runs in a worker thread)": at(
                app, "def get_server_settings"
            ),
            "fastapi runs it via contextmanager_in_threadpool": "fastapi/dependencies/utils.py:654 (fastapi 0.165.0)",
            "each token's next() in a worker thread": "starlette/concurrency.py:57 iterate_in_threadpool (starlette 1.10.0)",
            "worker threads: LIFO reuse, pruned after 10 s idle": "anyio/_backends/_asyncio.py:1069 MAX_IDLE_TIME, :2752 idle_workers.pop()",
        },
        "threading": THREADING_NOTE,
        "defaults": {
            "n_ctx": 2048,
            "n_batch": 512,
            "n_ubatch": 512,
            "flash_attn": False,
            "logits_all": True,
            "n_threads": "cpu_count // 2 (1 here; set to 2)",
            "n_threads_batch": "cpu_count (2 here)",
            "cache": False,
            "cache_note": (
                "--cache (a RAM/disk cache of saved states keyed by token prefix) is off "
                "by default; independent of it, Llama.generate always reuses the KV "
                "of the longest common token prefix with the previous request. Here "
                "every prompt starts with the same 4 tokens (BOS + the 3 byte "
                "tokens of the leading space), so 4 prompt tokens are reused and "
                "L - 4 are evaluated (logged as prefix_hit_tokens)."
            ),
            "interrupt_requests": True,
            "verbose": True,
            "seed": "LLAMA_DEFAULT_SEED",
            "streaming": (
                "sse-starlette EventSourceResponse, one JSON chunk per token (a "
                "multi-byte character waits for its last byte), then a chunk with "
                "finish_reason and text '', then [DONE]; ':ping' comments every 15 s; "
                "each chunk hops threads (iterate_in_threadpool) and a 10-deep "
                "memory channel; no usage in the stream"
            ),
            "per_request_work": (
                "pydantic validation, tokenize, prefix match, set_seed, "
                "per-token detokenize of the whole completion (O(n^2) in "
                "tokens) and a UTF-8 check, llama_perf print (verbose)"
            ),
        },
    }


THREADING_NOTE = (
    "Per-token time depends on which threads have run llama_decode. llama.cpp here is built with "
    "OpenMP (system_info OPENMP = 1), and every OS thread that calls llama_decode gets its own "
    "OpenMP team. The server calls the generator's next() for each token in an anyio worker "
    "thread (iterate_in_threadpool), and workers are reused last-in first-out. A request that "
    "arrives while another streams runs FastAPI's sync generator dependency "
    "get_server_settings (through authenticate) in a worker thread at the same time, so a "
    "second worker is created; afterwards tokens may be computed by a different worker, i.e. "
    "a second OpenMP team, and from then on decode steps run slower (likely libgomp's "
    "throttled spin-wait once it manages more threads than the 2 CPUs: idle workers sleep on "
    "a futex instead of spinning). Measured here: in-process llama_cpp.Llama 3.3-3.9 ms a "
    "token; the server with one team 4.5-5 ms; after concurrent requests 7-11 ms (and 11.4 ms "
    "with OMP_WAIT_POLICY=PASSIVE, no spinning at all). The server's thread count (in each "
    "point, before/after) shows the teams. anyio prunes workers idle for 10 s, so this "
    "benchmark pauses --pause seconds (default 11) before every point for a common start; "
    "within a point the slow state is what a loaded server gives."
)


# --------------------------------------------------------------------------- output


def dumps(obj: Any, indent: int = 0) -> str:
    """JSON with lists of scalars (and lists of such lists' items) kept on one line."""
    pad = " " * (indent + 1)

    def flat(x: Any) -> bool:
        return not isinstance(x, dict | list) or (
            isinstance(x, list) and all(not isinstance(y, dict | list) for y in x)
        )

    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and obj and not all(flat(x) for x in obj):
        items = [f"{pad}{dumps(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(obj, separators=(", ", ": "))


def write_results(out: Path, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tmp.write_text(dumps(results) + "\n")
    os.replace(tmp, out)


HEADER = (
    f"{'mix':<4}{'mode':<8}{'rate':>7}{'n':>4}{'ttft50':>8}{'ttft90':>8}{'tpot50':>8}"
    f"{'tpot90':>8}{'e2e50':>8}{'queue50':>9}{'tok/s':>8}{'req/s':>7}{'others':>7}"
)


def table_row(point: dict[str, Any]) -> str:
    s = point["summary"]

    def f(v: float | None, w: int, d: int = 1) -> str:
        return f"{'-' if v is None else f'{v:.{d}f}':>{w}}"

    load = point["rate"] if point["mode"] == "open" else point["concurrency"]
    return (
        f"{point['mix']:<4}{point['mode']:<8}{f(load, 7, 2)}{s['completed']:>4}"
        f"{f(s['ttft_ms']['p50'], 8)}{f(s['ttft_ms']['p90'], 8)}{f(s['tpot_ms']['p50'], 8, 2)}"
        f"{f(s['tpot_ms']['p90'], 8, 2)}{f(s['e2e_ms']['p50'], 8, 0)}"
        f"{f(s['queue_ms_inferred']['p50'], 9, 0)}{f(s['output_tokens_per_s'], 8)}"
        f"{f(s['requests_per_s'], 7, 2)}{f(point['cpu']['others_frac_of_cpus'], 7, 2)}"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mixes", default="A,B", help="A = 128/32, B = 512/128 (prompt/output)")
    p.add_argument("--factors", default=DEFAULT_FACTORS, help="rates as multiples of 1/S")
    p.add_argument("--requests", default=DEFAULT_REQUESTS, help="requests per point, per mix")
    p.add_argument("--max-window", type=float, default=120.0, help="seconds of arrivals, at most")
    p.add_argument("--pause", type=float, default=11.0, help="idle seconds before each point")
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (0: none)")
    p.add_argument("--no-side", action="store_true", help="skip in-process, logits_all, interrupt")
    p.add_argument("--rerun", default="", help="only these points again, e.g. A:0.5,B:closed")
    p.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rerun:
        return rerun(args)
    import llama_cpp

    t_start = time.perf_counter()
    mixes = {m: MIXES[m] for m in args.mixes.split(",")}
    factors = [float(x) for x in args.factors.split(",")]
    n_req = {k: int(v) for k, v in (kv.split(":") for kv in args.requests.split(","))}
    model, model_s = prepare_model(args.models)
    main_opts = {"--interrupt_requests": "False"}
    server = Server(model, args.models / "server.log", main_opts)
    results: dict[str, Any] = {
        "about": (
            "llama-cpp-python's OpenAI-compatible server (llama.cpp on CPU) under open-loop "
            "Poisson and closed-loop load, timed token by token from a client on the same "
            "machine: the reference for gpuwise serve's simulator. See the module "
            "docstring of benchmarks/serve_llama_cpp.py."
        ),
        "command": " ".join([".venv/bin/python", "benchmarks/serve_llama_cpp.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "server": {
            "version": llama_cpp.__version__,
            "command": " ".join(server.argv()).replace(sys.executable, "python"),
            **server_notes(),
        },
        "model": {
            "config": asdict(MODEL_CFG),
            "qtype": QTYPE,
            "file": model.name,
            "file_bytes": model.stat().st_size,
            "params": MODEL_CFG.params,
            "prepare_s": round(model_s, 1),
        },
        "mixes": {k: {"prompt_tokens": v[0], "output_tokens": v[1]} for k, v in mixes.items()},
        "record_fields": RECORD_FIELDS,
        "llama_bench_reference": llama_bench_reference(),
    }
    if not args.no_side:
        print("in-process baseline (llama_cpp.Llama, no server) ...", flush=True)
        results["in_process"] = in_process(model, mixes, 3)
        print(json.dumps(results["in_process"]), flush=True)
    print(f"server up in {server.start():.1f} s on port {server.port}", flush=True)
    results["server"]["command"] = " ".join(server.argv()).replace(sys.executable, "python")
    results["no_load"], results["points"] = {}, []
    try:
        for name, mix in mixes.items():
            nl = no_load(server, mix, SEED, NO_LOAD_REPS)
            results["no_load"][name] = nl
            service_s = nl["e2e_ms"] / 1000.0
            print(
                f"no load {name} {mix}: TTFT {nl['ttft_ms']:.1f} ms, TPOT {nl['tpot_ms']:.2f} ms,"
                f" e2e {nl['e2e_ms']:.0f} ms -> saturation ~{1 / service_s:.2f} req/s",
                flush=True,
            )
            write_results(args.out, results)
        print(HEADER, flush=True)
        for name, mix in mixes.items():
            for i, (mode, value) in enumerate(load_plan(factors, args.concurrency)):
                point = run_point(server, args, results, name, mix, mode, value, i, n_req[name])
                results["points"].append(point)
                print(table_row(point), flush=True)
                write_results(args.out, results)
    finally:
        server.stop()
    if not args.no_side:
        side_runs(args, model, mixes, results)
    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_results(args.out, results)
    print(f"wall time {results['wall_s']:.0f} s; results in {args.out}", flush=True)
    return 0


def load_plan(factors: list[float], concurrency: int) -> list[tuple[str, float]]:
    """The points of one mix in order: open loop at each factor, then closed loop."""
    return [("open", f) for f in factors] + (
        [("closed", float(concurrency))] if concurrency else []
    )


def quiet_pause(pause_s: float, extra_s: float = 60.0, limit: float = 0.05) -> dict[str, Any]:
    """Idle pause_s seconds; then wait (up to extra_s more) until other processes keep the
    CPUs under `limit` busy for a second: a neighbour stalls the 2-thread server badly."""
    meter = CpuMeter(None)
    time.sleep(pause_s)
    others = meter.stop()["others_frac_of_cpus"]
    waited = 0.0
    while others > limit and waited < extra_s:
        probe = CpuMeter(None)
        time.sleep(1.0)
        waited += 1.0
        others = probe.stop()["others_frac_of_cpus"]
    return {"extra_wait_s": waited, "others_frac_before": others}


def run_point(
    server: Server,
    args: argparse.Namespace,
    results: dict[str, Any],
    name: str,
    mix: tuple[int, int],
    mode: str,
    value: float,
    index: int,
    n: int,
) -> dict[str, Any]:
    """One load point on a running server: open loop at value x 1/S, or closed loop."""
    service_s = results["no_load"][name]["e2e_ms"] / 1000.0
    gate = quiet_pause(args.pause)
    offset = server.log_size()
    threads_before = server.threads()
    meter = CpuMeter(server.proc.pid if server.proc else None)
    point: dict[str, Any] = {
        "mix": name,
        "prompt_tokens": mix[0],
        "output_tokens": mix[1],
        "mode": mode,
    }
    seed = SEED + 100 * index
    if mode == "open":
        rate = round(value / service_s, 3)
        records, info = run_open_loop(server.port, mix, rate, n, args.max_window, seed)
        point.update({"rate_factor": value, "rate": rate, **info})
    else:
        records = run_closed_loop(server.port, mix, int(value), n, seed)
        point.update({"concurrency": int(value)})
    point["cpu"] = meter.stop()
    point["quiet_gate"] = gate
    point["disturbed"] = point["cpu"]["others_frac_of_cpus"] > DISTURBED
    point["server_threads"] = [threads_before, server.threads()]
    point["n_requests"] = len(records)
    point["summary"] = summarize(records)
    point["server_log"] = llama_summary(server.log_since(offset))
    point["records"] = [r.row() for r in records]
    return point


def disturbance(point: dict[str, Any]) -> float:
    return float(point["cpu"]["others_frac_of_cpus"])


def keep_better(results: dict[str, Any], point: dict[str, Any]) -> None:
    """Of a point measured twice, keep the one other processes disturbed less in "points";
    the other goes to "points_replaced"."""
    for j, old in enumerate(results["points"]):
        same = old["mix"] == point["mix"] and old["mode"] == point["mode"]
        if same and (point["mode"] == "closed" or old.get("rate_factor") == point["rate_factor"]):
            if disturbance(point) < disturbance(old):
                results["points"][j], point = point, old
            results.setdefault("points_replaced", []).append(point)
            return
    results["points"].append(point)


def rerun(args: argparse.Namespace) -> int:
    """Measure again the points named in --rerun (e.g. A:0.5,B:closed) with the same seeds
    and the no-load S already in --out; of the two, the less disturbed stays in "points"."""
    results = json.loads(args.out.read_text())
    factors = [float(x) for x in args.factors.split(",")]
    n_req = {k: int(v) for k, v in (kv.split(":") for kv in args.requests.split(","))}
    model, _ = prepare_model(args.models)
    server = Server(model, args.models / "server-rerun.log", {"--interrupt_requests": "False"})
    server.start()
    print(HEADER, flush=True)
    try:
        for key in args.rerun.split(","):
            name, load = key.split(":")
            plan = load_plan(factors, args.concurrency)
            if load == "closed":
                index = len(plan) - 1
            else:
                index = next(i for i, (m, v) in enumerate(plan) if m == "open" and v == float(load))
            mode, value = plan[index]
            point = run_point(
                server, args, results, name, MIXES[name], mode, value, index, n_req[name]
            )
            point["rerun"] = datetime.now(UTC).isoformat(timespec="seconds")
            keep_better(results, point)
            print(table_row(point), flush=True)
            write_results(args.out, results)
    finally:
        server.stop()
    results.setdefault("rerun_commands", []).append(
        " ".join([".venv/bin/python", "benchmarks/serve_llama_cpp.py", *sys.argv[1:]])
    )
    write_results(args.out, results)
    return 0


def side_runs(
    args: argparse.Namespace,
    model: Path,
    mixes: dict[str, tuple[int, int]],
    results: dict[str, Any],
) -> None:
    """The server's own default (interrupt_requests True) under load; logits_all False."""
    server = Server(model, args.models / "server-default.log", {})
    server.start()
    try:
        name = next(iter(mixes))
        mix = mixes[name]
        service_s = results["no_load"][name]["e2e_ms"] / 1000.0
        rate = round(0.8 / service_s, 3)
        meter = CpuMeter(server.proc.pid if server.proc else None)
        records, info = run_open_loop(server.port, mix, rate, 20, args.max_window, SEED + 999)
        s = summarize(records)
        results["default_interrupt"] = {
            "command": " ".join(server.argv()).replace(sys.executable, "python"),
            "note": (
                "the server's defaults (interrupt_requests True): a stream is cut short "
                "whenever another request waits; tokens per request as received"
            ),
            "mix": name,
            "rate": rate,
            "rate_factor": 0.8,
            **info,
            "cpu": meter.stop(),
            "tokens_received": [len(r.times) for r in records],
            "finish": s["finish"],
            "summary": s,
            "records": [r.row() for r in records],
        }
        print(
            f"default interrupt_requests, mix {name} at {rate} req/s: tokens received "
            f"{[len(r.times) for r in records]}, finish {s['finish']}",
            flush=True,
        )
    finally:
        server.stop()
    write_results(args.out, results)
    server = Server(
        model,
        args.models / "server-nologits.log",
        {"--interrupt_requests": "False", "--logits_all": "False"},
    )
    server.start()
    try:
        out: dict[str, Any] = {"command": " ".join(server.argv()).replace(sys.executable, "python")}
        for name, mix in mixes.items():
            nl = no_load(server, mix, SEED, NO_LOAD_REPS)
            out[name] = {
                k: nl[k]
                for k in (
                    "ttft_ms",
                    "tpot_ms",
                    "e2e_ms",
                    "ttft_ms_all",
                    "tpot_ms_all",
                    "llama_total_ms",
                )
            }
            print(
                f"logits_all False, no load {name}: TTFT {nl['ttft_ms']:.1f} ms, "
                f"TPOT {nl['tpot_ms']:.2f} ms, e2e {nl['e2e_ms']:.0f} ms",
                flush=True,
            )
        results["no_load_logits_all_false"] = out
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
