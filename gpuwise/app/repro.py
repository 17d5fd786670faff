"""`gpuwise repro`: run (or resume) a study of a training command, then analyse every run:
spread per condition, the arithmetic share of the variance, what a difference needs to be
detected (docs/repro.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwise.estimate.repro.analysis import ConditionRuns, StudyAnalysis, analyze
from gpuwise.measure.hardware.detect import detect_gpus
from gpuwise.measure.repro.plan import parse_conditions, thread_choices
from gpuwise.measure.repro.ray_runner import RayCluster, RaySettings
from gpuwise.measure.repro.runner import Study, condition_runs, deterministic_conditions, run_study
from gpuwise.workload.limits import check_count, check_number

# A study runs each condition --runs times: a billion runs grew the plan in memory for minutes
# before the first run (issue 21), and 10,000 pin a spread far finer than any study needs.
# Runs at a time: more than the cores of any one machine. One run: 30 days at most.
MAX_RUNS, MAX_PARALLEL, MAX_TIMEOUT_S = 10_000, 1_024, 30 * 86400.0
# What one replica may ask Ray for: more than any one node has is refused by the cluster check.
MAX_RAY_CPUS, MAX_RAY_GPUS = 4_096.0, 1_024.0
# progress(run record, runs done, runs in all)
RunProgress = Callable[[dict[str, Any], int, int], None]


@dataclass(frozen=True)
class Placement:
    """Where some of a study's runs ran: one kind of hardware, the nodes, how many runs."""

    hardware: str
    nodes: list[str]
    runs: int


@dataclass(frozen=True)
class ReproAnswer:
    study: Study
    analysis: StudyAnalysis
    energy_notes: list[str]
    runs: tuple[ConditionRuns, ...] = ()  # what each run reported: the HTML report's spread
    placement: list[Placement] = field(default_factory=list)
    ray: dict[str, Any] | None = None  # the cluster and what each replica asked for


def ray_cluster(address: str | None, cpus: float, gpus: float | None) -> RayCluster:
    """A Ray cluster to run replicas on (connect with `with`); each number is checked first."""
    check_number(cpus, "--ray-cpus", MAX_RAY_CPUS, zero_ok=True,
                 hint="CPUs each replica asks Ray for, for example 1")
    check_number(gpus, "--ray-gpus", MAX_RAY_GPUS, zero_ok=True,
                 hint="GPUs each replica asks Ray for, for example 1 (or 0.5 to share one)")
    return RayCluster(RaySettings(address or None, cpus, gpus))


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
                hint="runs at a time; more than one per core does not help")
    check_number(settings.get("timeout_s"), "--timeout", MAX_TIMEOUT_S,
                 hint="seconds before a run is killed; leave it out for no limit")
    return Study(command=command, conditions=parse_conditions(conditions),
                 threads=tuple(thread_choices()), **settings)


def repro(study: Study, fresh: bool, gpu: bool, detect: tuple[dict[str, float], bool],
          alpha: float, power: float, progress: RunProgress | None = None,
          cluster: RayCluster | None = None) -> ReproAnswer:
    """Run what the results file lacks (here, or as Ray tasks on `cluster`, connected), then
    analyse every run of the study."""
    if cluster is not None:
        records = cluster.run(study, progress, fresh=fresh)
    else:
        records = run_study(study, progress, fresh=fresh)
    grouped = condition_runs(records, study.conditions)
    analysis = analyze(grouped, deterministic_conditions(gpu, grouped), detect[0], detect[1],
                       alpha, power)
    notes = sorted({str(r.get("energy_note")) for r in records if r.get("energy_note")})
    ray = None if cluster is None else {
        "address": cluster.address, "cpus_per_replica": cluster.cpus,
        "gpus_per_replica": cluster.gpus, "nodes": len(cluster.nodes)}
    return ReproAnswer(study, analysis, notes, tuple(grouped), placement(records), ray)


def placement(records: Sequence[dict[str, Any]]) -> list[Placement]:
    """The finished runs by hardware, with the nodes they ran on (host name, and the start of
    Ray's node id under Ray), most runs first; runs recorded before gpuwise kept where they
    ran are left out."""
    by: dict[str, tuple[set[str], list[int]]] = {}
    for r in records:
        if r.get("returncode") != 0 or r.get("hardware") is None:
            continue
        nodes, count = by.setdefault(str(r["hardware"]), (set(), [0]))
        node_id = r.get("node_id")
        nodes.add(f"{r.get('node')} ({str(node_id)[:8]})" if node_id else str(r.get("node")))
        count[0] += 1
    return sorted((Placement(h, sorted(n), c[0]) for h, (n, c) in by.items()),
                  key=lambda p: (-p.runs, p.hardware))
