"""gpuwise.from_module against real runs on this CPU: a ResNet-18-style CNN, a ViT and a BERT
encoder built from code (tests/module_zoo.py), inference (no-grad forward) and a training
step. Memory: the estimate's model bytes (total minus the runtime overhead) against the
measured peak above the process baseline (VmHWM in a fresh process, as `gpuwise validate`).
Time: forward latency or step time against the median of repeats after two warm-ups.

With `--allocator-split` each case is timed once more in a process whose allocator faults
nothing in after the warm-ups (`module_run.NO_FAULTS_ENV`): the model less its "page
faults" rows is compared with that run, and the fault rows with what the faults cost (the
default run less the fault-free one), so the two kinds of error are seen apart.

The estimates are the public API's, `gpuwise.from_module(..., on="local")` (time: from the
profile `gpuwise probe` saved, loaded as users' is).

Run: .venv/bin/python benchmarks/validate_modules.py [--repeats 7] [--only resnet] [--json]
     [--no-memory] [--allocator-split] [--passes 3]

With `--passes N` the time runs are made N times over, and each case's median is compared
with its estimate (every pass's own summary is printed too).

The latest results, as `--json` writes them to stdout: benchmarks/results/modules_memory.json
(memory) and modules_time.json (`--no-memory --passes 5 --json`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from validate_cpu import ran_as_probed  # the same rule as the time suite's

import gpuwise
from gpuwise.app.validate import machine_vs_probe
from gpuwise.measure.probe.profile import STEADY

TESTS = str(Path(__file__).resolve().parents[1] / "tests")
sys.path.insert(0, TESTS)

# (label, factory, input specs (None: the factory's own), training, optimizer, dtype)
CASES = [
    ("resnet18 infer b8 112px", "resnet18", [((8, 3, 112, 112), None)], False, "adamw", None),
    ("resnet18 train b8 112px adamw", "resnet18", [((8, 3, 112, 112), None)], True, "adamw", None),
    ("resnet18 train b16 64px sgd", "resnet18", [((16, 3, 64, 64), None)], True, "sgd", None),
    (
        "resnet18 train b8 112px adamw bf16",
        "resnet18",
        [((8, 3, 112, 112), None)],
        True,
        "adamw",
        "bf16",
    ),
    ("vit-s/16 d6 infer b4 224px", "vit_small", [((4, 3, 224, 224), None)], False, "adamw", None),
    (
        "vit-s/16 d6 infer b4 224px bf16",
        "vit_small",
        [((4, 3, 224, 224), None)],
        False,
        "adamw",
        "bf16",
    ),
    (
        "vit-s/16 d6 train b2 224px adamw",
        "vit_small",
        [((2, 3, 224, 224), None)],
        True,
        "adamw",
        None,
    ),
    ("bert 4x256 infer b4 s128", "bert_small", None, False, "adamw", None),
    ("bert 4x256 train b4 s128 adamw", "bert_small", None, True, "adamw", None),
    ("bert 4x256 train b4 s128 adafactor", "bert_small", None, True, "adafactor", None),
]


def _example(factory: str, specs: list | None):
    import module_zoo
    import torch

    made = getattr(module_zoo, factory)()
    model, example = made if isinstance(made, tuple) else (made, None)
    if specs is not None:
        example = tuple(torch.empty(s, device="meta") for s, _ in specs)
    return model, example


def _busy_s() -> float:
    """CPU seconds all processes have used (from /proc/stat), and ours through children."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _timed_alone(fn):
    """Run fn and say what share of the CPUs other processes took meanwhile."""
    import resource
    import time

    start_wall, start_busy = time.perf_counter(), _busy_s()
    start_ours = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = fn()
    ours = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours_s = (ours.ru_utime - start_ours.ru_utime) + (ours.ru_stime - start_ours.ru_stime)
    wall = time.perf_counter() - start_wall
    others = max(0.0, _busy_s() - start_busy - ours_s) / (wall * (os.cpu_count() or 1))
    return result, others


def run_case(label: str, factory: str, specs: list | None, training: bool, optimizer: str,
             dtype: str | None, repeats: int, memory: bool = True, timing: bool = True,
             tries: int = 1, max_others: float = 1.0, split: bool = False) -> dict:
    from gpuwise.measure.runs.module_run import measure_module_memory, measure_module_time

    model, example = _example(factory, specs)
    est = gpuwise.from_module(model, example, training=training, optimizer=optimizer, dtype=dtype,
                      on="local")
    path = f"module_zoo:{factory}"
    kw = dict(training=training, optimizer=optimizer, dtype=dtype, sys_path=(TESTS,))
    mem = measure_module_memory(path, specs, **kw) if memory else None
    timed, others = {"seconds": None, "all_s": []}, 0.0
    drift = machine_vs_probe() if timing else {}  # as `gpuwise validate` does
    for _ in range(tries if timing else 0):  # keep the run other processes disturbed least
        run = _timed_alone(lambda: measure_module_time(path, specs, repeats=repeats, **kw))
        if timed["seconds"] is None or run[1] < others:
            timed, others = run
        if others <= max_others:
            break
    if mem is None:
        mem_est, mem_meas, mem_err, baseline = None, None, None, None
    else:
        mem_est, mem_meas = est.memory.model_bytes, mem.model_bytes
        mem_err, baseline = mem_est / mem_meas - 1, mem.baseline_bytes
    t_est, t_meas = est.seconds, timed["seconds"]
    fault_s = est.page_fault_s
    # The same pass under an allocator that faults nothing in: what the model less its fault
    # rows is checked against, and the measured cost of the faults (default less this).
    no_faults = (measure_module_time(path, specs, repeats=repeats, faults=False, **kw)["seconds"]
                 if timing and split else None)
    return {
        "case": label, "others_cpu_share": others,
        "memory_estimated": mem_est, "memory_measured": mem_meas, "memory_error": mem_err,
        "baseline_measured": baseline, "peak_phase": est.memory.peak_phase,
        "time_estimated": t_est, "time_measured": t_meas,
        "time_error": (t_est / t_meas - 1) if t_est and t_meas else None,
        "time_all_s": timed["all_s"], "time_rates": est.time_rates,
        "time_error_without_faults": ((t_est - fault_s) / t_meas - 1) if t_est and t_meas
        else None,
        "machine_vs_probe": drift, "fault_s_estimated": fault_s,
        "time_measured_without_faults": no_faults,
        "fault_s_measured": t_meas - no_faults if t_meas and no_faults else None,
        "model_error_without_faults": (t_est - fault_s) / no_faults - 1 if t_est and no_faults
        else None,
        "faults_estimated": est.page_fault_bytes,
        "faults_measured": timed.get("faulted_bytes_per_pass"),
        "breakdown": est.memory.breakdown,
    }


def _row(r: dict) -> str:
    mib = 2**20

    def num(value: float | None, scale: float, unit: str) -> str:
        return "NA" if value is None else f"{value * scale:7.1f}{unit}"

    def pct(value: float | None, digits: int) -> str:
        return "NA" if value is None else f"{100 * value:+.{digits}f}%"

    return (f"{r['case']:36} {num(r['memory_estimated'], 1 / mib, 'M'):>9} "
            f"{num(r['memory_measured'], 1 / mib, 'M'):>9} {pct(r['memory_error'], 2):>7}   "
            f"{num(r['time_estimated'], 1e3, 'ms'):>9} {num(r['time_measured'], 1e3, 'ms'):>9} "
            f"{pct(r['time_error'], 1):>7}  {100 * r['others_cpu_share']:3.0f}%   "
            f"{num(r['faults_estimated'], 1 / mib, 'M'):>7} "
            f"{num(r['faults_measured'], 1 / mib, 'M'):>7}   "
            + " ".join(f"{k} x{v:.2f}" for k, v in (r.get("machine_vs_probe") or {}).items()))


def _print_split(rows: list[dict]) -> None:
    """The model less its fault rows against runs that fault nothing in, and the fault rows
    against what the faults cost (the default allocator's time less the fault-free one)."""
    print(f"\n{'case':36} {'est - faults':>12} {'fault-free':>10} {'err':>7}   "
          f"{'faults est':>10} {'measured':>9}")
    for r in rows:
        if r["time_measured_without_faults"] is None:
            continue
        print(f"{r['case']:36} {1e3 * (r['time_estimated'] - r['fault_s_estimated']):10.1f}ms "
              f"{1e3 * r['time_measured_without_faults']:8.1f}ms "
              f"{100 * r['model_error_without_faults']:+6.1f}%   "
              f"{1e3 * r['fault_s_estimated']:8.1f}ms {1e3 * r['fault_s_measured']:7.1f}ms")
    print(f"the model less its fault rows, against fault-free runs: "
          f"{_summary(rows, 'model_error_without_faults')}")
    split = [r for r in rows if r["fault_s_measured"] is not None]
    print(f"faults over all cases: estimated {1e3 * sum(r['fault_s_estimated'] for r in split):.0f}"
          f" ms, measured {1e3 * sum(r['fault_s_measured'] for r in split):.0f} ms")


def _summary(rows: list[dict], key: str) -> str:
    errors = [abs(r[key]) for r in rows if r[key] is not None]
    if not errors:
        return "none"
    return f"median |error| {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}%"


def _one_pass(args: argparse.Namespace, memory: bool) -> list[dict]:
    rows = []
    for case in CASES:
        if args.only and args.only not in case[0]:
            continue
        r = run_case(*case, repeats=args.repeats, memory=memory, timing=not args.no_time,
                     tries=args.tries, max_others=args.max_others,
                     split=args.allocator_split)
        rows.append(r)
        if not args.json:
            print(_row(r), flush=True)
    return rows


def _over_passes(runs: list[list[dict]]) -> list[dict]:
    """Each case's median time over the passes against its estimate (memory: the first
    pass's), with every pass's measurement kept."""
    rows = []
    for same in zip(*runs, strict=True):
        first = same[0]
        measured = statistics.median(r["time_measured"] for r in same)
        est, faults = first["time_estimated"], first["fault_s_estimated"]
        rows.append({**first, "time_measured": measured, "time_error": est / measured - 1,
                     "time_error_without_faults": (est - faults) / measured - 1,
                     "time_measured_passes": [r["time_measured"] for r in same],
                     "machine_vs_probe_passes": [r["machine_vs_probe"] for r in same]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="run the cases whose label contains this")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--allocator-split", action="store_true",
                        help="time each case again under an allocator that faults nothing in")
    parser.add_argument("--no-memory", action="store_true", help="only the time runs")
    parser.add_argument("--no-time", action="store_true", help="only the memory runs")
    parser.add_argument(
        "--tries", type=int, default=3, help="time runs per case while other processes use the CPUs"
    )
    parser.add_argument(
        "--max-others",
        type=float,
        default=0.05,
        help="the share of the CPUs others may use during a time run",
    )
    parser.add_argument("--passes", type=int, default=1,
                        help="time the cases N times over; each case's median against its estimate")
    args = parser.parse_args()
    runs = []
    for n in range(1 if args.no_time else max(1, args.passes)):
        if not args.json:
            if args.passes > 1:
                print(f"pass {n + 1} of {args.passes}")
            print(f"{'case':36} {'mem est':>9} {'measured':>9} {'err':>7}   {'time est':>9} "
                  f"{'measured':>9} {'err':>7}  others  faulted: est measured   machine vs probe")
        runs.append(_one_pass(args, memory=not args.no_memory and n == 0))
    rows = runs[0] if len(runs) == 1 else _over_passes(runs)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    if len(runs) > 1:
        for n, run in enumerate(runs, 1):
            print(f"pass {n}: time {_summary(run, 'time_error')}")
        print(f"each case's median over the {len(runs)} passes against its estimate:")
    print(f"memory: {_summary(rows, 'memory_error')} over {len(rows)} cases")
    print(f"time:   {_summary(rows, 'time_error')} ({rows[0]['time_rates'] if rows else ''})")
    print(f"time without the allocator's page faults: {_summary(rows, 'time_error_without_faults')}")
    if args.allocator_split:
        _print_split(rows)
    steady = [r for r in rows if ran_as_probed(r.get("machine_vs_probe") or {}, r["case"])]
    print(f"where the machine ran within {STEADY:.0%} of the probe: "
          f"{_summary(steady, 'time_error')} over {len(steady)} cases")
    print("others: the share of the CPUs other processes used while the time was measured")


if __name__ == "__main__":
    main()
