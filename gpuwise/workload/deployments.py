"""What a deployment has to do in a month: serve requests, or train on tokens. Checked on
construction, so bad input is one clear error (exit 2), never a wrong answer."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.errors import GpuwiseError
from gpuwise.units import DAYS_PER_MONTH, HOURS_PER_MONTH
from gpuwise.workload.limits import MAX_TRAIN_TOKENS, check_number

# field -> (the quantity in words, its option, the most it may be). Every one is above 0.
# The caps sit far beyond real services: ~2.5e9 prompts a day reach the largest chat service
# and ~1e13 tokens a day the largest API (2025); a latency target over a minute per token, or
# an hour to the first token, is no target.
LIMITS: dict[str, tuple[str, str, float]] = {
    "requests_per_day": ("requests per day", "--requests-per-day or --tokens-per-day", 1e12),
    "tokens_per_day": ("tokens per day", "--tokens-per-day", 1e15),
    "prompt_tokens": ("prompt length", "--prompt", 1 << 24),
    "output_tokens": ("output length", "--new-tokens", 1 << 24),
    "tpot_ms": ("latency target", "--latency-ms", 60_000.0),
    "ttft_ms": ("time-to-first-token target", "--ttft-ms", 3_600_000.0),
    "max_utilisation": ("utilisation", "--target-utilization", 1.0),
    "hours_per_day": ("service hours per day", "--hours-per-day", 24.0),
    "measured_util": ("measured utilisation", "--measured-utilization", 1.0),
    "tokens_per_month": ("training tokens", "--train-tokens", MAX_TRAIN_TOKENS),
    "hours_per_month": ("hours per month", "--hours-per-month", HOURS_PER_MONTH),
    "deadline_hours": ("deadline", "--deadline-hours", HOURS_PER_MONTH),
}


def check_load_options(**values: float | None) -> None:
    """Each value (None: not given) above 0 and at most its cap (LIMITS, by field name)."""
    for name, value in values.items():
        what, flag, high = LIMITS[name]
        check_number(value, flag, high, what=what)


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
        check_load_options(**vars(self))

    @classmethod
    def from_tokens_per_day(cls, tokens_per_day: float, prompt_tokens: int, output_tokens: int,
                            **kw: object) -> ServeLoad:
        """Tokens a day count prompt and generated tokens: requests = tokens / (prompt + output)."""
        check_load_options(tokens_per_day=tokens_per_day)
        return cls(tokens_per_day / (prompt_tokens + output_tokens), prompt_tokens, output_tokens,
                   **kw)  # type: ignore[arg-type]

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
                               "(one of them)", "e.g. --train-tokens 2e9")
        check_load_options(**vars(self))

    @property
    def limit_hours(self) -> float:
        """The longest a month's training may take."""
        return min(self.deadline_hours or HOURS_PER_MONTH, HOURS_PER_MONTH)
