"""`gpuwise claims`: run the experiments (all, or those named), each on its own share of one
progress bar; an experiment that cannot run here gives a result that says why, and the others
go on."""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from gpuwise.app.claims import (
    bandwidth_decode,
    energy,
    memory_bound,
    memory_fits,
    pipeline,
    quantized_cpu,
    reproducibility,
)
from gpuwise.app.claims.context import Context
from gpuwise.app.claims.result import ClaimResult, ClaimsAnswer, not_measured
from gpuwise.errors import GpuwiseError, comma_choices
from gpuwise.measure.llama_cpp.bench import others_share
from gpuwise.measure.probe.run import others_cpu_s
from gpuwise.units import format_bytes


@dataclass(frozen=True)
class Experiment:
    module: ModuleType
    quick_s: float  # about how long it takes on a 2-core CPU: its share of the progress bar
    full_s: float


# The explainer's order.
EXPERIMENTS = (
    Experiment(memory_fits, 2, 2),
    Experiment(bandwidth_decode, 10, 60),
    Experiment(memory_bound, 1, 1),
    Experiment(quantized_cpu, 4, 30),
    Experiment(pipeline, 7, 15),
    Experiment(reproducibility, 12, 40),
    Experiment(energy, 4, 12),
)
CLAIM_IDS = tuple(e.module.ID for e in EXPERIMENTS)
# progress(what is running, share of the whole run done from 0 to 1)
Progress = Callable[[str, float], None]


def parse_only(text: str | None) -> tuple[str, ...]:
    """`--only` as claim ids, checked (None or empty: every claim)."""
    if not text:
        return CLAIM_IDS
    return comma_choices(text, CLAIM_IDS, "no claim", "--only names no claim")


def run_claims(quick: bool, only: tuple[str, ...] = CLAIM_IDS,
               progress: Progress | None = None, command: str = "") -> ClaimsAnswer:
    """Run the experiments of the claims in `only`, in the explainer's order."""
    chosen = [e for e in EXPERIMENTS if e.module.ID in only]
    weights = [e.quick_s if quick else e.full_s for e in chosen]
    started = time.perf_counter()
    results: list[ClaimResult] = []
    with tempfile.TemporaryDirectory(prefix="gpuwise-claims-") as tmp:
        ctx = Context(quick, Path(tmp))
        done = 0.0
        for experiment, weight in zip(chosen, weights, strict=True):
            share = weight / sum(weights)
            title = experiment.module.TITLE
            if progress is not None:
                ctx.progress = _stepper(progress, title, done, share)
                ctx.step(title, 0.0)
            results.append(_run_one(experiment.module, ctx))
            done += share
        machine = _machine(ctx)
    if progress is not None:
        progress("done", 1.0)
    return ClaimsAnswer(machine, quick, tuple(results), time.perf_counter() - started, command)


def _stepper(progress: Progress, title: str, start: float,
             share: float) -> Callable[[str, float], None]:
    def step(what: str, done: float) -> None:
        progress(what or title, start + share * done)

    return step


def _run_one(module: ModuleType, ctx: Context) -> ClaimResult:
    """The experiment's result, timed; one that cannot run here says why (the others go on)."""
    started, others_before = time.perf_counter(), others_cpu_s()
    try:
        result: ClaimResult = module.run(ctx)
    except KeyboardInterrupt:
        raise
    except GpuwiseError as exc:
        return not_measured(module.ID, module.TITLE, module.CLAIM,
                            exc.message + (f" ({exc.hint})" if exc.hint else ""),
                            seconds=time.perf_counter() - started)
    except Exception as exc:  # a run that failed (a child process, a missing library)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return not_measured(module.ID, module.TITLE, module.CLAIM,
                            f"the experiment failed: {text}",
                            seconds=time.perf_counter() - started)
    wall = time.perf_counter() - started
    busy = others_share(others_before, wall)
    notes = result.notes
    if busy is not None and busy >= BUSY_SHARE:
        notes = (*notes, f"other processes used {busy:.0%} of the CPUs during this experiment: "
                         "its times may be slow; run it again when the machine is idle")
    return replace(result, seconds=wall, notes=notes)


# Other processes' share of the CPUs during an experiment above which its times are flagged
# (the probe's contention note uses the same 10%).
BUSY_SHARE = 0.1


def _machine(ctx: Context) -> dict[str, object]:
    m = ctx.machine
    return {"cpu": m.cpu_model, "cores": m.logical_cores, "arch": platform.machine(),
            "ram_bytes": m.ram_total_bytes, "ram": format_bytes(m.ram_total_bytes),
            "gpus": [g.name for g in m.gpus],
            "gpu_note": m.gpu_unavailable_reason or ""}
