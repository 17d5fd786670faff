"""The runs of a study and the environment and arguments each one gets.

Each condition isolates one source of run-to-run variation (see estimate/repro_analysis.py).
Runs are ordered index-major (run 0 of every condition, then run 1, ...), so a drift of the
machine (heat, other load) touches every condition alike, and an interrupted study already has
some runs of each condition.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwise.errors import GpuwiseError, comma_choices
from gpuwise.estimate.repro.analysis import CONDITIONS
from gpuwise.measure.repro.program_api import (
    CUBLAS_WORKSPACE,
    DETERMINISTIC_VAR,
    OUT_VAR,
    SEED_VAR,
    THREADS_VAR,
)

MAX_THREAD_CHOICES = 16


@dataclass(frozen=True)
class RunSpec:
    """One run: its condition, its number within the condition, and its settings."""

    condition: str
    index: int
    seed: int
    threads: int | None  # None: the machine's default
    deterministic: bool

    @property
    def key(self) -> tuple[str, int]:
        return (self.condition, self.index)


def parse_conditions(text: str) -> tuple[str, ...]:
    """A comma list of condition names, checked."""
    return comma_choices(text, CONDITIONS, "unknown condition", "no conditions given")


def thread_choices(cpu_count: int | None = None) -> list[int]:
    """Thread counts the `threads` condition cycles through: 1 .. max(cores, 4), at most 16.

    At least four even on a small machine: more threads than cores only costs time, and each
    count is another order of the parallel reductions.
    """
    cores = cpu_count or os.cpu_count() or 1
    return list(range(1, min(max(cores, 4), MAX_THREAD_CHOICES) + 1))


def plan_runs(conditions: Sequence[str], runs: int, base_seed: int,
              threads: Sequence[int]) -> list[RunSpec]:
    """Every run of the study, index-major.

    The `seeds` runs use base_seed + 1 + i, never the fixed seed itself, so that no seeds run
    shares its seed with the fixed-seed runs (the F interval wants independent samples).
    """
    if runs < 1:
        raise GpuwiseError(f"--runs must be at least 1, got {runs}", "use --runs 5 or more")
    plan = []
    for i in range(runs):
        for name in conditions:
            plan.append(RunSpec(
                condition=name, index=i,
                seed=base_seed + 1 + i if name == "seeds" else base_seed,
                threads=threads[i % len(threads)] if name == "threads" else None,
                deterministic=name == "deterministic"))
    return plan


def child_env(spec: RunSpec, out_path: str, base: Mapping[str, str],
              device: str | None = None) -> dict[str, str]:
    """The environment of one run: its seed, threads, determinism and the API's report file."""
    env = dict(base)
    env[SEED_VAR] = str(spec.seed)
    env["PYTHONHASHSEED"] = str(spec.seed % 2**32)
    env[OUT_VAR] = out_path
    env[DETERMINISTIC_VAR] = "1" if spec.deterministic else "0"
    if spec.deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    if spec.threads is not None:
        for var in (THREADS_VAR, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(spec.threads)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def child_command(command: Sequence[str], spec: RunSpec, seed_flag: str | None) -> list[str]:
    """The user's command, with the program's own seed option appended when one is named."""
    if not command:
        raise GpuwiseError("no command to run", "put it after --: gpuwise repro -- python train.py")
    cmd = list(command)
    if seed_flag:
        cmd += [seed_flag, str(spec.seed)]
    return cmd
