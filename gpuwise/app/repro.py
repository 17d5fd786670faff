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
    """The study the options describe; `settings` are Study's other fields."""
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
