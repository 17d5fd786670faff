"""`gpuwise repro`: run (or resume) a study of a training command, then analyse every run:
spread per condition, the arithmetic share of the variance, what a difference needs to be
detected (docs/repro.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwise.estimate.repro.analysis import StudyAnalysis, analyze
from gpuwise.measure.hardware.detect import detect_gpus
from gpuwise.measure.repro.plan import parse_conditions, thread_choices
from gpuwise.measure.repro.runner import Study, condition_runs, deterministic_conditions, run_study
from gpuwise.workload.limits import check_count, check_number

# A study runs each condition --runs times: a billion runs grew the plan in memory for minutes
# before the first run (issue 21), and 10,000 pin a spread far finer than any study needs.
# Runs at a time: more than the cores of any one machine. One run: 30 days at most.
MAX_RUNS, MAX_PARALLEL, MAX_TIMEOUT_S = 10_000, 1_024, 30 * 86400.0
# progress(run record, runs done, runs in all)
RunProgress = Callable[[dict[str, Any], int, int], None]


@dataclass(frozen=True)
class ReproAnswer:
    study: Study
    analysis: StudyAnalysis
    energy_notes: list[str]


def has_gpu() -> bool:
    return bool(detect_gpus(use_torch=False)[0])


def default_conditions(gpu: bool) -> str:
    """Off a GPU, thread counts stand in for the GPU's non-deterministic kernels."""
    return "same-seed,deterministic,seeds" + ("" if gpu else ",threads")


def new_study(command: tuple[str, ...], conditions: str, **settings: Any) -> Study:
    """The study the options describe; `settings` are Study's other fields. Each number is
    checked before anything runs or any file is opened."""
    check_count(settings.get("runs", 1), "--runs", MAX_RUNS, hint="use --runs 5 or more")
    check_count(settings.get("parallel", 1), "--parallel", MAX_PARALLEL,
                hint="runs at a time; more than one per core does not help")  # fmt: skip
    check_number(settings.get("timeout_s"), "--timeout", MAX_TIMEOUT_S,
                 hint="seconds before a run is killed; leave it out for no limit")  # fmt: skip
    return Study(command=command, conditions=parse_conditions(conditions),
                 threads=tuple(thread_choices()), **settings)  # fmt: skip


def repro(study: Study, fresh: bool, gpu: bool, detect: tuple[dict[str, float], bool],
          alpha: float, power: float, progress: RunProgress | None = None) -> ReproAnswer:  # fmt: skip
    """Run what the results file lacks, then analyse every run of the study."""
    records = run_study(study, progress, fresh=fresh)
    grouped = condition_runs(records, study.conditions)
    analysis = analyze(grouped, deterministic_conditions(gpu, grouped), detect[0], detect[1],
                       alpha, power)  # fmt: skip
    notes = sorted({str(r.get("energy_note")) for r in records if r.get("energy_note")})
    return ReproAnswer(study, analysis, notes)
