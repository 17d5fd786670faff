"""Claim: fixing the seed does not make GPU training reproducible. The experiment: a `gpuwise
repro` study of a small training run (jobs/repro_job.py), the seed fixed while only the
arithmetic changes (on a CPU the thread count, which reorders the parallel sums; on a GPU the
default kernels, which add with atomics), against runs with different seeds, and the share of
the seed-to-seed variance that the arithmetic alone makes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpuwise.app import repro as repro_app
from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import timed_here
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, RuntimeUse, Verdict
from gpuwise.estimate.repro.analysis import StudyAnalysis

ID = "reproducibility"
TITLE = "A fixed seed does not make training reproducible"
CLAIM = ("Fixing the random seed does not make GPU training reproducible: the order in which "
         "parallel hardware adds numbers changes the result.")
JOB = Path(__file__).parent / "jobs" / "repro_job.py"
METRIC = "train_loss"


@dataclass(frozen=True)
class ConditionOutcome:
    name: str
    runs: int
    bit_identical: bool | None
    sd: float | None
    share: float | None  # of the seeds-varied variance
    share_low: float | None
    share_high: float | None


def arithmetic_condition(on_gpu: bool) -> str:
    """The fixed-seed condition in which only the arithmetic changes between runs."""
    return "same-seed" if on_gpu else "threads"


def conditions(on_gpu: bool) -> str:
    return "same-seed,deterministic,seeds" if on_gpu else "same-seed,seeds,threads"


def rule(on_gpu: bool) -> str:
    what = ("the GPU's default kernels" if on_gpu else
            "the CPU thread count (standing in for a GPU's parallel order)")
    return (f"holds when runs with the seed fixed are not bit-identical (parameter hashes) when "
            f"only {what} changes: the '{arithmetic_condition(on_gpu)}' condition of "
            "`gpuwise repro`")


def outcomes(analysis: StudyAnalysis) -> dict[str, ConditionOutcome]:
    out = {}
    shares = analysis.shares.get(METRIC, {})
    for name, s in analysis.conditions.items():
        spread = s.metrics.get(METRIC)
        share = shares.get(name)
        out[name] = ConditionOutcome(name, s.runs, s.bit_identical,
                                     spread.sd if spread else None,
                                     share.ratio if share else None,
                                     share.low if share else None,
                                     share.high if share else None)
    return out


def judge(found: dict[str, ConditionOutcome], on_gpu: bool) -> Verdict:
    name = arithmetic_condition(on_gpu)
    c = found.get(name)
    if c is None or c.runs < 2 or c.bit_identical is None:
        return Verdict(None, f"the '{name}' runs could not be compared", rule(on_gpu))
    if c.bit_identical:
        return Verdict(False, f"the {c.runs} '{name}' runs were bit-identical: the seed fixed "
                       "the result", rule(on_gpu))
    words = f"the {c.runs} '{name}' runs differ"
    if c.share is not None:
        words += (f"; the arithmetic's share of the seed-to-seed variance: {_pct(c.share)} "
                  f"(95% interval {_pct(c.share_low)} to {_pct(c.share_high)})")
    return Verdict(True, words, rule(on_gpu))


def _pct(x: float | None) -> str:
    """A share as a percentage, or in powers of ten where it is under 0.1%."""
    if x is None:
        return "NA"
    return f"{100 * x:.2g}%" if x == 0 or x >= 1e-3 else f"{x:.2g}"


def run(ctx: Context) -> ClaimResult:
    on_gpu = ctx.on_gpu
    runs = ctx.pick(3, 8)
    command = (sys.executable, str(JOB), "--device", ctx.device, "--steps", str(ctx.pick(30, 60)))
    parallel = 1 if on_gpu else max(1, min(ctx.cores, 4))
    study = repro_app.new_study(command, conditions(on_gpu), runs=runs,
                                results=ctx.workdir / "repro.jsonl", parallel=parallel)
    total = runs * len(study.conditions)

    def progress(record: dict[str, object], done: int, all_runs: int) -> None:
        ctx.step(f"repro: {record.get('condition', '')} run {done}/{all_runs}", done / all_runs)

    ctx.step(f"repro: {total} runs", 0.0)
    answer = repro_app.repro(study, True, on_gpu, ({}, False), 0.05, 0.8, progress)
    found = outcomes(answer.analysis)
    table = [("condition", "runs", "bit-identical", f"sd of {METRIC}", "share of seeds' variance")]
    for c in found.values():
        table.append((c.name, str(c.runs), _yes(c.bit_identical), _num(c.sd),
                      "-" if c.share is None else
                      f"{_pct(c.share)} ({_pct(c.share_low)} to {_pct(c.share_high)})"))
    arithmetic = found.get(arithmetic_condition(on_gpu))
    notes = [f.message for f in answer.analysis.findings]
    same = found.get("same-seed")
    if not on_gpu and same is not None and same.bit_identical:
        notes.insert(0, f"on this CPU at a fixed thread count the {same.runs} same-seed runs were "
                        "bit-identical: the seed does fix a CPU run whose thread count is fixed")
    if not on_gpu:
        notes.append("no GPU here: the thread count stands in for the GPU's parallel order; "
                     "where a GPU is present the study compares its default kernels with "
                     "deterministic ones instead")
    summary = ("not compared" if arithmetic is None or arithmetic.bit_identical is None else
               f"'{arithmetic.name}' runs {'identical' if arithmetic.bit_identical else 'differ'}"
               + (f", the arithmetic's share of the variance {_pct(arithmetic.share)}"
                  if arithmetic.share is not None else ""))
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"`gpuwise repro` of a small training run ({study.runs} runs per condition: "
        f"{', '.join(study.conditions)}; {'GPU' if on_gpu else 'CPU'}), the final training "
        "loss evaluated in float64 and the parameters hashed after each run.",
        judge(found, on_gpu), summary,
        tuple(m for c in found.values() for m in (
            Measurement(f"{c.name}: sd of {METRIC}", c.sd, "", "measured"),
            *((Measurement(f"{c.name}: share of seeds' variance", c.share, "share", "measured",
                           f"95% interval {_pct(c.share_low)} to {_pct(c.share_high)}"),)
              if c.share is not None else ()))),
        {"conditions": list(found), "sd": [c.sd for c in found.values()],
         "bit_identical": [c.bit_identical for c in found.values()],
         "share": [c.share for c in found.values()],
         "share_low": [c.share_low for c in found.values()],
         "share_high": [c.share_high for c in found.values()],
         "arithmetic_condition": arithmetic_condition(on_gpu)},
        tuple(table), tuple(notes),
        judged_on=JudgedOn((RuntimeUse("pytorch", "fp32", ("training runs",)),), timed_here(
            f"runs compared here ({'GPU' if on_gpu else 'CPU'})")),
    )


def _yes(x: bool | None) -> str:
    return "NA" if x is None else "yes" if x else "no"


def _num(x: float | None) -> str:
    return "NA" if x is None else f"{x:.3g}"
