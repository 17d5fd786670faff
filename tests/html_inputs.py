"""One answer of each command whose HTML report the tests draw, made quickly and offline:
catalogue models on catalogue hardware for the estimates, a synthetic two-rank watch log, a
synthetic repro study and the H200 probe profile kept in benchmarks/results."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from gpuwise.app.check import CheckAnswer, check
from gpuwise.app.infer import InferAnswer, infer
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.app.probe import ProbeAnswer
from gpuwise.app.repro import ReproAnswer, new_study
from gpuwise.app.serve import Load, ReplicaOptions, ServeAnswer, Slo, serve
from gpuwise.app.train import TrainAnswer, train
from gpuwise.app.watch import WatchAnswer, judge_logs
from gpuwise.estimate.repro.analysis import ConditionRuns, analyze
from gpuwise.measure.probe.profile import Profile
from gpuwise.workload.plans import InferencePlan, TrainingPlan
from gpuwise.workload.requests import Lengths

REPO = Path(__file__).resolve().parent.parent
H200_PROBE = REPO / "benchmarks" / "results" / "gpu_h200" / "probe.json"
MODEL, DEVICE = "llama-3-8b", "h100"


def check_answer() -> CheckAnswer:
    resolved, arch = model_named(MODEL)
    return check(resolved, arch, hardware_named(DEVICE), InferencePlan())


def infer_answer() -> InferAnswer:
    resolved, arch = model_named(MODEL)
    return infer(resolved, arch, hardware_named(DEVICE), InferencePlan())


def train_answer() -> TrainAnswer:
    resolved, arch = model_named(MODEL)
    plan = TrainingPlan(batch=1, seq=2048, gpus=8, zero=3)
    return train(resolved, arch, hardware_named(DEVICE), plan)


def serve_answer(sweep: bool = True) -> ServeAnswer:
    resolved, arch = model_named(MODEL)
    plan = InferencePlan(runtime="vllm")
    load = Load(Lengths(512, 128, "fixed", "fixed"), rate=5.0, requests=200)
    return serve(resolved, arch, hardware_named(DEVICE), plan, ReplicaOptions(1, None, None, 0, None),
                 load, Slo(0.5, 0.03), 1, sweep)


def probe_answer(tmp_path: Path) -> ProbeAnswer:
    profile = Profile.from_json(H200_PROBE.read_text())
    return ProbeAnswer(profile, tmp_path / "probe-h200.json")


def watch_log(path: Path, seconds: float = 30.0, ranks: int = 2) -> Path:
    """A two-GPU data-parallel job that waits for data ~40% of each step, rank 1 slower
    before the all-reduce, rank 0's memory creeping: every panel and mark of the timeline."""
    rng = random.Random(0)
    t0 = 1_800_000_000.0
    lines: list[dict[str, Any]] = [{
        "kind": "header", "format": "gpuwise-watch/1", "cmd": ["torchrun", "train.py"], "t": t0,
        "host": "test", "interval_s": 0.2, "gpus": [{"index": i, "name": "NVIDIA H100"} for i in range(ranks)],
        "inject": True, "source": "gpuwise watch", "unavailable": {},
    }]
    energy = [0.0] * ranks
    t = t0
    while t < t0 + seconds:
        gpus = []
        for i in range(ranks):
            busy = 55 + 25 * math.sin(t / 3 + i) + rng.uniform(-5, 5)
            power = 250 + 3.5 * busy
            energy[i] += power * 0.2
            gpus.append({"index": i, "util_percent": round(busy, 1), "sm_percent": round(0.7 * busy, 1),
                         "mem_used_bytes": int((40 + 0.2 * (t - t0) + 2 * i) * 2**30),
                         "power_w": round(power, 1), "energy_j": round(energy[i], 1)})
        lines.append({"kind": "sample", "t": t, "cpu_percent": 60.0, "per_core": [60.0] * 4,
                      "iowait_percent": 1.0, "rss_bytes": 6 * 2**30, "gpus": gpus,
                      "cpu_energy_j": None})
        t += 0.2
    for rank in range(ranks):
        start = t0 + 1.0
        for step in range(int((seconds - 2) / 0.3)):
            data = 0.12 + rng.uniform(0, 0.02)
            before = 0.05 + (0.04 if rank == 1 else 0.0)
            backward = 0.09 + (0.0 if rank == 1 else 0.04)
            step_s = data + before + backward + 0.02
            lines.append({"kind": "step", "rank": rank, "world": ranks, "pid": 100 + rank,
                          "source": "inject", "step": step, "t_start": start, "step_s": step_s,
                          "samples": 32, "ops": 400, "counted": False,
                          "rss_bytes": int((5 + 0.01 * step * (rank == 0)) * 2**30),
                          "device_mem_bytes": None, "dispatch_us": None, "data_s": data,
                          "h2d_s": 0.0, "forward_s": 0.0, "backward_s": backward,
                          "optimizer_s": 0.02})
            start += step_s
    lines.append({"kind": "end", "t": t, "exit_code": 0})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def watch_answer(tmp_path: Path) -> WatchAnswer:
    return judge_logs([str(watch_log(tmp_path / "job.jsonl"))])


def repro_runs(runs: int = 6) -> list[ConditionRuns]:
    """Four conditions of a study whose loss moves a little with the arithmetic and more
    with the seed; accuracy identical with the seed fixed (an exactly-zero share)."""
    rng = random.Random(1)

    def condition(name: str, seed_sd: float, arith_sd: float) -> ConditionRuns:
        loss = [2.0 + rng.gauss(0, seed_sd) + rng.gauss(0, arith_sd) for _ in range(runs)]
        acc = [0.71 + rng.gauss(0, seed_sd) for _ in range(runs)] if seed_sd else [0.71] * runs
        return ConditionRuns(name, {"loss": loss, "accuracy": acc}, [None] * runs,
                             [[] for _ in range(runs)], [10.0 + rng.random() for _ in range(runs)],
                             [None] * runs)

    return [condition("same-seed", 0.0, 0.002), condition("deterministic", 0.0, 0.0),
            condition("threads", 0.0, 0.004), condition("seeds", 0.01, 0.002)]


def repro_answer(tmp_path: Path) -> ReproAnswer:
    runs = repro_runs()
    study = new_study(("python", "train.py"), "same-seed,deterministic,threads,seeds", runs=6,
                      results=tmp_path / "repro.jsonl")
    return ReproAnswer(study, analyze(runs), ["energy not measured here"], tuple(runs))
