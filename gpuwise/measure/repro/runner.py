"""Run a study: the user's command, once per planned run, `parallel` at a time.

Each run is a fresh process with its own environment (plan.child_env) and its own API report
file; its wall time is measured around the process, so it includes interpreter start-up and
imports (the same for every condition, so ratios between conditions stay fair).
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.repro.analysis import ConditionRuns
from gpuwise.measure.repro.collect import parse_metric_patterns, read_api_report, run_metrics
from gpuwise.measure.repro.energy import EnergyMeter
from gpuwise.measure.repro.placement import hardware_key, placement
from gpuwise.measure.repro.plan import RunSpec, child_command, child_env, plan_runs
from gpuwise.measure.repro.store import ResultsFile, completed

TAIL_CHARS = 2000
Progress = Callable[[dict[str, Any], int, int], None]  # (record, done, total)


@dataclass(frozen=True)
class Study:
    """What to run and how; `command` is the user's program and its arguments."""

    command: tuple[str, ...]
    conditions: tuple[str, ...]
    runs: int
    results: Path
    base_seed: int = 0
    seed_flag: str | None = None
    metric_specs: tuple[str, ...] = ()
    parallel: int = 1
    devices: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES value per parallel slot, in turn
    threads: tuple[int, ...] = (1, 2, 3, 4)
    timeout_s: float | None = None

    def header(self) -> dict[str, Any]:
        return {"command": list(self.command), "seed_flag": self.seed_flag,
                "base_seed": self.base_seed, "metric_patterns": list(self.metric_specs),
                "conditions": list(self.conditions), "runs": self.runs}


class StudyLog:
    """The results file and the records of one study: opens (or resumes) the file, says which
    runs are left, and records each run as it finishes (appended, flushed, reported to
    `progress`), stopping early on a command that cannot work. The local runner and the Ray
    runner write through it, so a study resumes with either."""

    def __init__(self, study: Study, fresh: bool = False, progress: Progress | None = None) -> None:
        self.store = ResultsFile(study.results)
        old = self.store.open_study(study.header(), fresh)
        done = completed(old)
        plan = plan_runs(study.conditions, study.runs, study.base_seed, study.threads)
        self.todo = [spec for spec in plan if spec.key not in done]
        planned = {spec.key for spec in plan}
        self.records = [r for r in old if (r["condition"], r["index"]) in planned]
        self.total, self.finished = len(plan), len(plan) - len(self.todo)
        self.any_ok = bool(done)
        self.progress = progress

    def add(self, record: dict[str, Any]) -> None:
        self.store.append_run(record)
        self.records.append(record)
        self.finished += 1
        self.any_ok = self.any_ok or _check_first(record, self.any_ok)
        if self.progress:
            self.progress(record, self.finished, self.total)


def run_study(study: Study, progress: Progress | None = None, fresh: bool = False,
              energy: EnergyMeter | None = None) -> list[dict[str, Any]]:
    """Run what is not done yet; return every successful and failed run of the study."""
    if study.parallel < 1:
        raise GpuwiseError(f"--parallel must be at least 1, got {study.parallel}", "")
    patterns = parse_metric_patterns(list(study.metric_specs))
    log = StudyLog(study, fresh, progress)
    # Machine-wide counters cannot be split between concurrent runs.
    meter = (energy or EnergyMeter()) if study.parallel == 1 else None
    live: set[subprocess.Popen[str]] = set()
    stopping = threading.Event()
    slots: queue.Queue[str | None] = queue.Queue()
    for i in range(study.parallel):
        slots.put(study.devices[i % len(study.devices)] if study.devices else None)

    def one(spec: RunSpec) -> dict[str, Any]:
        if stopping.is_set():  # interrupted while this run was still queued
            return {}
        device = slots.get()
        try:
            return run_one(study, spec, patterns, meter, device, live)
        finally:
            slots.put(device)

    with ThreadPoolExecutor(max_workers=study.parallel) as pool:
        pending: set[Future[dict[str, Any]]] = {pool.submit(one, s) for s in log.todo}
        try:
            while pending:
                finished_now, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished_now:
                    log.add(future.result())
        except BaseException:  # interrupted: stop what runs; the finished runs are saved
            stopping.set()
            for future in pending:
                future.cancel()
            for proc in list(live):
                proc.kill()
            raise
    return log.records


def _check_first(record: dict[str, Any], any_ok: bool) -> bool:
    """Stop early on a command that cannot work: it fails, or reports nothing to compare."""
    if record["returncode"] != 0:
        if any_ok:
            return False
        last = (record.get("stderr_tail") or "").strip().splitlines()[-1:] or ["(no stderr)"]
        if record["returncode"] is None:  # it never finished: its worker or node died
            raise GpuwiseError(f"the run was lost: {last[0]}",
                               "the error is in the results file; run again to retry it")
        raise GpuwiseError(f"the command failed (exit {record['returncode']}): {last[0]}",
                           "run it by hand first; the full stderr tail is in the results file")
    if not record["metrics"] and record["params_hash"] is None:
        raise GpuwiseError("the run reported no metric",
                           "print a JSON line last, pass --metric NAME=REGEX, or call "
                           "gpuwise.report_metric(name, value)")
    return True


def run_one(study: Study, spec: RunSpec, patterns: Any, meter: EnergyMeter | None,
            device: str | None, live: set[subprocess.Popen[str]], node_id: str | None = None,
            cwd: str | None = None) -> dict[str, Any]:
    """Run one planned run to its end and return its record (also when it fails). `node_id`:
    the Ray node it runs on; `cwd`: where to start the command (None: here)."""
    with tempfile.TemporaryDirectory(prefix="gpuwise-repro-") as tmp:
        api_path = Path(tmp) / "api.jsonl"
        env = child_env(spec, str(api_path), os.environ, device)
        cmd = child_command(study.command, spec, study.seed_flag)
        before = meter.read() if meter and meter.available else None
        start = time.perf_counter()
        rc, out, err = _execute(cmd, env, study.timeout_s, live, cwd)
        wall = time.perf_counter() - start
        energy = meter.delta(before, meter.read()) if meter and before is not None else None
        api = read_api_report(api_path)
    record = asdict(spec) | {
        "device": device, "returncode": rc, "wall_s": wall, "energy_j": energy,
        "energy_note": meter.note() if meter else "NA: runs in parallel share the counters",
        "metrics": run_metrics(out, err, patterns, api), "params_hash": api.params_hash,
        "steps": api.steps, "deterministic_applied": api.deterministic_applied,
    } | placement(env, node_id)
    if rc != 0:
        record["stderr_tail"] = err[-TAIL_CHARS:]
    return record


def _execute(cmd: list[str], env: dict[str, str], timeout_s: float | None,
             live: set[subprocess.Popen[str]], cwd: str | None = None) -> tuple[int, str, str]:
    """Run one process to the end; `live` lets an interrupted study stop the runs in flight."""
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=cwd)
    except OSError as exc:
        raise GpuwiseError(f"cannot run {cmd[0]!r}: {exc.strerror}", "check the command") from exc
    live.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out, err + "\n(timed out)"
    finally:
        live.discard(proc)


def deterministic_conditions(has_gpu: bool, runs: Sequence[ConditionRuns]) -> list[str]:
    """Conditions whose runs must be bit-identical if the seed controls all randomness.

    On a CPU, kernels are deterministic at a fixed thread count, so `same-seed` and
    `deterministic` qualify; on a GPU only `deterministic`, and only where every run reported
    (through gpuwise.seed_everything) that it turned deterministic algorithms on.
    """
    names = []
    for c in runs:
        if c.name == "same-seed" and not has_gpu:
            names.append(c.name)
        if c.name == "deterministic" and (not has_gpu or (
                c.deterministic_applied and all(c.deterministic_applied))):
            names.append(c.name)
    return names


def condition_runs(
    records: Sequence[dict[str, Any]], conditions: Sequence[str]
) -> list[ConditionRuns]:
    """The records grouped by condition (run order), ready for estimate.repro_analysis.analyze."""
    ok = completed(list(records))
    out = []
    for name in conditions:
        runs = [ok[k] for k in sorted(k for k in ok if k[0] == name)]
        failed = {r["index"] for r in records if r["condition"] == name and r["returncode"] != 0}
        failed -= {r["index"] for r in runs}
        names = sorted({m for r in runs for m in r["metrics"]})
        kept = {m: [r for r in runs if m in r["metrics"] and math.isfinite(r["metrics"][m])]
                for m in names}
        out.append(ConditionRuns(
            name=name,
            metrics={m: [r["metrics"][m] for r in kept[m]] for m in names},
            hardware={m: [hardware_key(r) for r in kept[m]] for m in names},
            params_hashes=[r.get("params_hash") for r in runs],
            step_hashes=[[(int(s), str(h)) for s, h in r.get("steps") or []] for r in runs],
            wall_s=[float(r["wall_s"]) for r in runs],
            energy_j=[r.get("energy_j") for r in runs],
            deterministic_applied=[r.get("deterministic_applied") for r in runs],
            failed=len(failed)))
    return out
