"""What a deployment has to do in a month: serve requests, or train on tokens. Checked on
construction, so bad input is one clear error (exit 2), never a wrong answer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuwise.errors import GpuwiseError
from gpuwise.units import DAYS_PER_MONTH, HOURS_PER_MONTH


def _positive(name: str, value: float | None, flag: str, high: float = math.inf) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value <= 0 or value > high:
        limit = f" and at most {high:g}" if math.isfinite(high) else ""
        raise GpuwiseError(f"{name} must be above 0{limit}, got {value:g}",
                           f"pass a sensible {flag}")  # fmt: skip


@dataclass(frozen=True)
class ServeLoad:
    """Online inference: requests a day, each a prompt and a generated answer.

    tpot_ms: target time per output token (the decode step a user waits for each token);
    ttft_ms: target time to the first token (the prefill of one prompt, no queueing).
    max_utilisation: the busy share each replica is sized for (headroom for peaks).
    hours_per_day: the hours the service runs (requests arrive within them).
    """

    requests_per_day: float
    prompt_tokens: int = 512
    output_tokens: int = 256
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    max_utilisation: float = 0.6
    hours_per_day: float = 24.0
    measured_util: float | None = None

    def __post_init__(self) -> None:
        _positive(
            "requests per day", self.requests_per_day, "--requests-per-day or --tokens-per-day"
        )
        _positive("prompt length", self.prompt_tokens, "--prompt", 1 << 24)
        _positive("output length", self.output_tokens, "--output", 1 << 24)
        _positive("latency target", self.tpot_ms, "--latency-ms")
        _positive("time-to-first-token target", self.ttft_ms, "--ttft-ms")
        _positive("utilisation", self.max_utilisation, "--utilisation", 1.0)
        _positive("service hours per day", self.hours_per_day, "--hours-per-day", 24.0)
        _positive("measured utilisation", self.measured_util, "--measured-util", 1.0)

    @classmethod
    def from_tokens_per_day(cls, tokens_per_day: float, prompt_tokens: int, output_tokens: int,
                            **kw: object) -> ServeLoad:  # fmt: skip
        """Tokens a day count prompt and generated tokens: requests = tokens / (prompt + output)."""
        _positive("tokens per day", tokens_per_day, "--tokens-per-day")
        return cls(tokens_per_day / (prompt_tokens + output_tokens), prompt_tokens, output_tokens,
                   **kw)  # type: ignore[arg-type]  # fmt: skip

    @property
    def requests_per_month(self) -> float:
        return self.requests_per_day * DAYS_PER_MONTH

    @property
    def input_tokens_per_month(self) -> float:
        return self.requests_per_month * self.prompt_tokens

    @property
    def output_tokens_per_month(self) -> float:
        return self.requests_per_month * self.output_tokens

    @property
    def tokens_per_month(self) -> float:
        return self.input_tokens_per_month + self.output_tokens_per_month

    @property
    def service_hours_per_month(self) -> float:
        return HOURS_PER_MONTH * self.hours_per_day / 24

    @property
    def arrivals_per_s(self) -> float:
        """Average request rate while the service runs."""
        return self.requests_per_day / (self.hours_per_day * 3600)


@dataclass(frozen=True)
class TrainLoad:
    """Training: tokens to train on per month (finished within `deadline_hours`, at most a
    month), or hours per month that the hardware trains."""

    tokens_per_month: float | None = None
    hours_per_month: float | None = None
    deadline_hours: float | None = None
    measured_util: float | None = None

    def __post_init__(self) -> None:
        if (self.tokens_per_month is None) == (self.hours_per_month is None):
            raise GpuwiseError("give the training load as --train-tokens or --hours-per-month "
                               "(one of them)", "e.g. --train-tokens 2e9")  # fmt: skip
        _positive("training tokens", self.tokens_per_month, "--train-tokens")
        _positive("hours per month", self.hours_per_month, "--hours-per-month", HOURS_PER_MONTH)
        _positive("deadline", self.deadline_hours, "--deadline-hours")
        _positive("measured utilisation", self.measured_util, "--measured-util", 1.0)

    @property
    def limit_hours(self) -> float:
        """The longest a month's training may take."""
        return min(self.deadline_hours or HOURS_PER_MONTH, HOURS_PER_MONTH)
