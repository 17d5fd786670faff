"""What one claim's experiment returns: its measurements (each saying where it came from), the
verdict with the rule it was decided by, and the data its figures are drawn from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Where a number came from (README: "Every number says where it came from").
SOURCES = ("measured", "detected", "estimated", "spec")


def one_of(what: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse a label that is not one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class Measurement:
    """One number of an experiment: `source` is measured, detected, estimated or spec."""

    name: str
    value: float | int | str | None
    unit: str
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        one_of("source", self.source, SOURCES)


@dataclass(frozen=True)
class Verdict:
    """`holds` True or False, or None where the experiment could not run here; `reason` gives
    the numbers it rests on, `rule` the stated threshold and where it comes from."""

    holds: bool | None
    reason: str
    rule: str

    @property
    def text(self) -> str:
        if self.holds is None:
            return f"not measured here, because {self.reason}"
        return "holds here" if self.holds else f"does not hold here, because {self.reason}"


# Where the numbers a verdict rests on came from:
# - "timed here": measured by the experiment itself, in this run;
# - "probe with runtime costs": estimated from this machine's probe profile, which holds the
#   own costs of every runtime the claim is judged on (llama.cpp's, transformers' dispatch);
# - "probe without runtime costs": a probe profile lacking one of them (a quick probe, or one
#   without `--runtime llama.cpp`): that runtime's costs are the datasheet's or the bare op's;
# - "datasheet": the catalogue's figures for this device;
# - "detected": what was read off the machine (its memory), no rate at all.
RATES = ("timed here", "probe with runtime costs", "probe without runtime costs", "datasheet",
         "detected")
# The runtime names as a person reads them.
NAMES = {"llama.cpp": "llama.cpp", "vllm": "vLLM", "sglang": "SGLang",
         "transformers": "transformers", "compiled": "torch.compile", "pytorch": "PyTorch"}


@dataclass(frozen=True)
class RuntimeUse:
    """A runtime a verdict was judged on, for some phases; `instead_of` names the runtime
    people use for them here where the experiment could not run it, and `why`."""

    runtime: str  # as --runtime takes it (llama.cpp, vllm, transformers), or pytorch: a bare loop
    weights: str  # q4_k_m, f16, bf16, fp32, mixed-bf16
    phases: tuple[str, ...]  # prefill, decode, training step, a training loop
    instead_of: str = ""  # the runtime people use for these phases on this device, if another
    why: str = ""  # why the experiment ran another

    @property
    def text(self) -> str:
        said = f"{NAMES.get(self.runtime, self.runtime)} {self.weights} {' and '.join(self.phases)}"
        if self.instead_of:
            said += f" (not {NAMES.get(self.instead_of, self.instead_of)}: {self.why})"
        return said


@dataclass(frozen=True)
class RatesUsed:
    """Where the numbers came from (one of RATES), in words, and the command that would make
    the verdict firmer ("" where none would)."""

    kind: str
    text: str
    firmer: str = ""

    def __post_init__(self) -> None:
        one_of("rates", self.kind, RATES)


@dataclass(frozen=True)
class JudgedOn:
    """What a verdict was judged on: the runtimes, by phase, and the rates."""

    runtimes: tuple[RuntimeUse, ...]
    rates: RatesUsed

    @property
    def text(self) -> str:
        """'llama.cpp q4_k_m prefill and decode, transformers mixed-bf16 training step; probe
        of 2026-12-06 with llama.cpp's and transformers' costs'."""
        said = "; ".join((", ".join(r.text for r in self.runtimes), self.rates.text))
        return said + (f" (firmer: `{self.rates.firmer}`)" if self.rates.firmer else "")


@dataclass(frozen=True)
class ClaimResult:
    """One claim of the explainer, tested on this machine."""

    id: str
    title: str
    claim: str  # the explainer's claim, in one sentence
    experiment: str  # what was run here, in one or two sentences
    verdict: Verdict
    summary: str  # the measurement in one line (the terminal table's cell)
    measurements: tuple[Measurement, ...] = ()
    series: dict[str, Any] = field(default_factory=dict)  # what the figures are drawn from
    table: tuple[tuple[str, ...], ...] = ()  # rows, the first the header
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    # the runtimes and the rates (probe, datasheet, timed here) the verdict was judged on,
    # printed beside it; None where the experiment did not run
    judged_on: JudgedOn | None = None


def not_measured(claim_id: str, title: str, claim: str, reason: str, rule: str = "",
                 seconds: float = 0.0) -> ClaimResult:
    """The result of an experiment that could not run here, saying why."""
    return ClaimResult(claim_id, title, claim, "the experiment did not run",
                       Verdict(None, reason, rule), f"not measured: {reason}", seconds=seconds)


@dataclass(frozen=True)
class ClaimsAnswer:
    """Every claim tested, in the explainer's order, and the machine it ran on."""

    machine: dict[str, Any]
    quick: bool
    results: tuple[ClaimResult, ...]
    wall_s: float
    command: str = ""
