"""Streams of requests a served model sees (`gpuwise serve`): arrivals at a Poisson rate, a
trace of recorded arrivals, and the prompt and output lengths each request brings."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from gpuwise.errors import GpuwiseError
from gpuwise.workload.limits import check_count

LENGTH_DISTS = ("fixed", "uniform", "normal", "trace")
MAX_REQUESTS = 1_000_000
# Keys the common serving benchmarks write for a request's arrival and lengths (vLLM's
# benchmark_serving/Mooncake/Azure LLM traces): the first one present is read.
ARRIVAL_KEYS = ("arrival_s", "timestamp", "arrival_time", "time")
PROMPT_KEYS = ("prompt_tokens", "input_length", "input_len", "prompt_len", "ContextTokens")
OUTPUT_KEYS = ("output_tokens", "output_length", "output_len", "GeneratedTokens")


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt: int  # tokens
    output: int  # tokens to generate (at least 1)


@dataclass(frozen=True)
class Lengths:
    """How long prompts and outputs are: a distribution around a mean (`trace`: as recorded)."""

    prompt: int
    output: int
    prompt_dist: str = "fixed"
    output_dist: str = "fixed"

    def __post_init__(self) -> None:
        check_count(self.prompt, "--prompt", 1 << 24)
        check_count(self.output, "--output", 1 << 24)
        for name, dist in (("--prompt-dist", self.prompt_dist),
                           ("--new-tokens-dist", self.output_dist)):
            if dist not in LENGTH_DISTS:
                raise GpuwiseError(f"{name} {dist!r} is not a length distribution",
                                   f"choose one of: {', '.join(LENGTH_DISTS)}")

    def draw(self, rng: random.Random) -> tuple[int, int]:
        return _draw(rng, self.prompt_dist, self.prompt), _draw(rng, self.output_dist, self.output)


def _draw(rng: random.Random, dist: str, mean: int) -> int:
    """One length: fixed; uniform over [mean/2, 3 mean/2]; normal with a quarter of the mean
    as its deviation, at least 1."""
    if dist == "uniform":
        return max(1, round(rng.uniform(mean / 2, 1.5 * mean)))
    if dist == "normal":
        return max(1, round(rng.gauss(mean, mean / 4)))
    return mean


def poisson_requests(rate: float, count: int, lengths: Lengths, seed: int = 0) -> list[Request]:
    """`count` requests arriving as a Poisson process of `rate` a second."""
    if not (rate > 0 and math.isfinite(rate)):
        raise GpuwiseError(f"--rate must be a positive number of requests a second, got {rate:g}",
                           "e.g. --rate 2.5, or --concurrency C for a fixed number in flight")
    check_count(count, "--requests", MAX_REQUESTS)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(Request(t, *lengths.draw(rng)))
    return out


def closed_loop_lengths(count: int, lengths: Lengths, seed: int = 0) -> list[tuple[int, int]]:
    """The (prompt, output) of `count` requests sent by clients that wait for each answer."""
    check_count(count, "--requests", MAX_REQUESTS)
    rng = random.Random(seed)
    return [lengths.draw(rng) for _ in range(count)]


def _field(rec: dict, keys: tuple[str, ...], line: int, what: str) -> float:
    for key in keys:
        if key in rec:
            value = rec[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                break
            return float(value)
    raise GpuwiseError(f"trace line {line}: no {what} (one of {', '.join(keys)}) as a number",
                       'each line is a JSON object, e.g. {"arrival_s": 0.5, "prompt_tokens": '
                       '512, "output_tokens": 128}')


def parse_trace(text: str, lengths: Lengths | None = None, seed: int = 0) -> list[Request]:
    """Requests from JSON lines of arrival time (seconds, or ms timestamps) and lengths; a
    length distribution other than `trace` replaces the recorded lengths."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise GpuwiseError(f"trace line {i} is not JSON: {exc.msg}",
                               "a trace is JSON lines: one request a line") from None
        if not isinstance(rec, dict):
            raise GpuwiseError(f"trace line {i} is not a JSON object", "one request a line")
        arrival = _field(rec, ARRIVAL_KEYS, i, "arrival time")
        prompt = int(_field(rec, PROMPT_KEYS, i, "prompt length"))
        output = int(_field(rec, OUTPUT_KEYS, i, "output length"))
        if not (math.isfinite(arrival) and arrival >= 0) or prompt < 1 or output < 1:
            raise GpuwiseError(f"trace line {i}: arrival {arrival:g}, prompt {prompt}, output "
                               f"{output}", "arrivals at 0 or later, lengths of 1 token or more")
        out.append(Request(arrival, prompt, output))
    if not out:
        raise GpuwiseError("the trace has no requests", "one JSON object a line")
    return _resampled(_in_seconds(sorted(out, key=lambda r: r.arrival_s)), lengths, seed)


def _in_seconds(reqs: list[Request]) -> list[Request]:
    """Arrivals from 0; epoch timestamps in milliseconds (past 1e11: after 1973 in ms, the
    year 5138 in seconds) read as milliseconds."""
    start = reqs[0].arrival_s
    scale = 1e-3 if start > 1e11 else 1.0
    return [Request((r.arrival_s - start) * scale, r.prompt, r.output) for r in reqs]


def _resampled(reqs: list[Request], lengths: Lengths | None, seed: int) -> list[Request]:
    if lengths is None:
        return reqs
    rng = random.Random(seed)
    out = []
    for r in reqs:
        prompt, output = lengths.draw(rng)
        out.append(Request(r.arrival_s, r.prompt if lengths.prompt_dist == "trace" else prompt,
                           r.output if lengths.output_dist == "trace" else output))
    return out
