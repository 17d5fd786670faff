"""`gpuwise claims`: small real experiments on this machine, one per claim of the GPU explainer
gpuwise started from, each with its measurements, where they came from, and a verdict decided
by a stated, sourced threshold (docs/claims.md).

Each claim is a module with `ID`, `TITLE`, `CLAIM`, a pure `judge(...)` that turns
measurements into a Verdict, and `run(ctx)` that measures, on the runtime people use for each
phase here (judged_on.runtime_for), and says what it was judged on (`JudgedOn`: the runtimes
and the probe or rates); `runner.run_claims` runs them."""

from __future__ import annotations

from gpuwise.app.claims.result import (
    ClaimResult,
    ClaimsAnswer,
    JudgedOn,
    Measurement,
    RatesUsed,
    RuntimeUse,
    Verdict,
)
from gpuwise.app.claims.runner import CLAIM_IDS, parse_only, run_claims

__all__ = ["CLAIM_IDS", "ClaimResult", "ClaimsAnswer", "JudgedOn", "Measurement", "RatesUsed",
           "RuntimeUse", "Verdict", "parse_only", "run_claims"]
