"""What glibc does with a real run's allocations, traced: the check behind the host replay's
rules (docs/memory.md, "On a CPU"; catalog/data/allocators.toml, carved_by_small_bytes).

Each case of validate_cpu.py's suite (by number; default all 22) runs in a fresh
process as `gpuwise validate` runs it, under an LD_PRELOAD tracer of malloc and free that
records every call (malloc_trace/mtrace.c), and is compared with that process's own peak above
its baseline:

- glibc: the whole trace replayed through this machine's glibc, every block written, the
  high-water mark after the build above the resident set before it, as the process is
  measured (malloc_trace/replay.c); and again without the requests under 64 bytes, to show
  what the small ones do;
- rule: the traced tensors (64 KiB and more, in order, the forward, backward and optimizer
  marked, and a checkpointed layer's recomputation) run through the replay's heap
  (`host_replay.ResidentHeap.enter`): each chunk a freed tensor leaves is carved
  (`carved_by_small_bytes`); a training forward's pieces are kept for the run, every other
  phase's only the last `pinned_small_chunks`; beside it the rule before, under which a
  training step's backward and optimizer step carved nothing.

The rules are fed the process's own tensors here, so their errors are the allocator rules'
alone; `validate_cpu.py` checks them on the estimator's tensor lists.

Needs a C compiler (`cc`), torch and transformers (peft for the LoRA cases); about a minute a
case, a few hundred MB of trace each in a temporary folder.

Run:  .venv/bin/python benchmarks/malloc_trace.py [--cases 10,13,17] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from validate_cpu import CASES, describe

from gpuwise.app.validate import plan_kwargs
from gpuwise.catalog import resolve_model
from gpuwise.catalog.allocators import allocator_choice
from gpuwise.estimate import InferencePlan
from gpuwise.estimate.memory.host_replay import ResidentHeap
from gpuwise.measure.runs.jobs import inference_job, training_job

HERE = Path(__file__).resolve().parent / "malloc_trace"
ROOT = Path(__file__).resolve().parents[1]
RECORD = struct.Struct("QQII")
BUILD, RUN = 77777, 77779  # traced_child.py's markers
PHASES = {77781: "backward", 77783: "optimizer", 77785: "forward", 77787: "recompute",
          77789: "backward"}
TRACKED = 65536  # the replay's tensors (untracked_below_bytes)
TINY = 64


def build(folder: Path) -> tuple[Path, Path]:
    lib, replay = folder / "libmtrace.so", folder / "replay"
    for cmd in (["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(HERE / "mtrace.c")],
                ["cc", "-O2", "-o", str(replay), str(HERE / "replay.c")]):
        subprocess.run(cmd, check=True)
    return lib, replay


def trace(case: int, lib: Path, folder: Path) -> tuple[Path, int]:
    """Run the case traced; the trace's path and the process's peak above its baseline."""
    name, plan = CASES[case]
    kwargs = plan_kwargs(plan, "cpu")
    config = resolve_model(name).config
    job = inference_job(config, **kwargs) if isinstance(plan, InferencePlan) else (
        training_job(config, **kwargs))
    out = folder / f"case{case}.bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT),
               LD_PRELOAD=str(lib), MTRACE_OUT=str(out), MTRACE_MIN="0")
    proc = subprocess.run([sys.executable, str(HERE / "traced_child.py")], input=json.dumps(job),
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return out, json.loads(proc.stdout.strip().splitlines()[-1])["model_bytes"]


def records(path: Path) -> list[tuple[int, int, int, int]]:
    return list(RECORD.iter_unpack(path.read_bytes()))


def glibc_replay(replay: Path, path: Path, m1: int, m2: int, below: int = 0) -> float:
    out = subprocess.run([str(replay), str(path), str(m1), str(m2), str(below)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1]) * 2**20


class _ForwardOnly(ResidentHeap):
    """The rule before: a training step's backward and optimizer step carve nothing."""

    def enter(self, phase: str, training: bool) -> None:
        super().enter(phase, training)
        c = self.choice
        self.carve = c.carved_by_small_bytes if c and (self.for_run or not training) else 0


def rule_replay(recs: list, m1: int, training: bool, forward_only: bool = False) -> float:
    """The traced tensors through the replay's heap from the build on: its peak after the
    build, as the process is measured."""
    heap = (_ForwardOnly if forward_only else ResidentHeap)(choice=allocator_choice("glibc"))
    live: dict[int, int] = {}
    for n, (ptr, size, _, _) in enumerate(recs[m1:]):
        if size == RUN:  # the process's high-water mark is reset after the build
            heap.enter("forward", training)
            heap.peak_resident = heap.resident
        elif size in PHASES:  # the replay's rules change only where a phase begins
            heap.enter(PHASES[size], training)
        if size >= TRACKED:
            live[ptr] = n
            heap.malloc(n, size)
        elif size == 0 and ptr in live:
            heap.free(live.pop(ptr))
    return heap.peak_resident


def case_row(case: int, lib: Path, replay: Path, folder: Path) -> dict:
    name, plan = CASES[case]
    path, measured = trace(case, lib, folder)
    recs = records(path)
    m1 = max(n for n, r in enumerate(recs) if r[1] == BUILD)
    m2 = max(n for n, r in enumerate(recs) if r[1] == RUN)
    training = not isinstance(plan, InferencePlan)
    row = {"case": case, "model": name, "plan": describe(plan), "measured": measured,
           "glibc": glibc_replay(replay, path, m1, m2),
           "glibc_without_tiny": glibc_replay(replay, path, m1, m2, TINY),
           "rule": rule_replay(recs, m1, training),
           "forward_only_rule": rule_replay(recs, m1, training, forward_only=True)}
    path.unlink()
    print(f"[{case:2d}] {name:13s} {row['plan']:44s} measured {measured / 2**20:7.1f} MiB  "
          + "  ".join(f"{k} {100 * (row[k] / measured - 1):+5.1f}%"
                      for k in ("glibc", "glibc_without_tiny", "rule", "forward_only_rule")),
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(map(str, range(len(CASES)))))
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwise-trace-") as tmp:
        lib, replay = build(Path(tmp))
        rows = [case_row(int(c), lib, replay, Path(tmp)) for c in args.cases.split(",")]
    summary = {}
    for key in ("glibc", "rule", "forward_only_rule"):
        errors = [abs(r[key] / r["measured"] - 1) for r in rows]
        summary[key] = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors)}
        print(f"{key}: median |error| {100 * statistics.median(errors):.1f}%  worst "
              f"{100 * max(errors):.1f}%  over {len(rows)} cases")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
