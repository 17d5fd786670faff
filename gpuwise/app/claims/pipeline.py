"""Claim: a GPU at 30% has a data-pipeline problem. The experiment: `gpuwise watch` on a training
job whose DataLoader is slow (it loads a batch in (1 - 0.3) / 0.3 times the step's compute, so
the model computes about 30% of the time), then on the same job with worker processes loading
ahead. On a CPU the job's device is the CPU, and "busy" is the share of each step not spent
waiting for data; on a GPU it is also the GPU's busy % as NVML reads it."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import timed_here
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, RuntimeUse, Verdict
from gpuwise.app.watch import WatchAnswer, judge_logs, run_job
from gpuwise.catalog.claims import claim_thresholds
from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.verdict import input_share

ID = "pipeline"
TITLE = "A GPU at 30% has a data-pipeline problem"
CLAIM = ("A device that is busy only about 30% of the time is usually waiting for its input: "
         "feeding it faster, not a faster device, is the fix.")
JOB = Path(__file__).parent / "jobs" / "loader_job.py"


@dataclass(frozen=True)
class WatchedRun:
    label: str  # "slow loader" or "4 workers"
    bound: str  # watch's verdict: input-bound, host-bound, compute-bound, no-steps
    input_share: float  # waiting for data and host-to-device copies, of the step time
    step_s: float | None  # median step
    gpu_util_percent: float | None
    cpu_percent: float | None

    @property
    def busy_share(self) -> float:
        """The share of each step not spent waiting for the input."""
        return 1.0 - self.input_share


def rule() -> str:
    limit = watch_thresholds().input_bound_share
    return (f"holds when `gpuwise watch` finds the slow-loader job input-bound (waiting for "
            f"data {limit:.0%} of the step or more, its own threshold) and, with loader workers "
            "and nothing else changed, no longer input-bound")


def judge(slow: WatchedRun, fed: WatchedRun) -> Verdict:
    if "no-steps" in (slow.bound, fed.bound):
        return Verdict(None, "watch saw no training steps", rule())
    words = (f"busy {slow.busy_share:.0%} of each step with a slow loader ({slow.bound}), "
             f"{fed.busy_share:.0%} with {fed.label} ({fed.bound})")
    if slow.bound != "input-bound":
        return Verdict(False, f"{words}: the slow loader did not make the job input-bound",
                       rule())
    if fed.bound == "input-bound":
        return Verdict(False, f"{words}: workers did not remove the wait", rule())
    return Verdict(True, words, rule())


def run(ctx: Context) -> ClaimResult:
    busy = claim_thresholds().target_busy_share
    workers = math.ceil((1 - busy) / busy) + 1  # enough to load ahead of the compute
    steps = ctx.pick(30, 120)
    shape = (["--width", "4096", "--layers", "8", "--batch", "2048"] if ctx.on_gpu else
             ["--width", "2048", "--layers", "2", "--batch", "32"])
    base = [sys.executable, str(JOB), "--device", ctx.device, "--steps", str(steps),
            "--busy", str(busy), *shape]
    sleep_file = ctx.workdir / "loader-sleep.txt"
    ctx.step("watch: the job with a slow loader", 0.0)
    slow = _watched(ctx, "slow loader", [*base, "--sleep-out", str(sleep_file)], "slow")
    sleep = sleep_file.read_text().strip()
    ctx.step(f"watch: the job with {workers} loader workers", 0.5)
    fed = _watched(ctx, f"{workers} workers",
                   [*base, "--workers", str(workers), "--sleep-per-batch", sleep], "workers")
    runs = (slow, fed)
    table = [("job", "watch's verdict", "waiting for data", "busy", "median step",
              "GPU busy (NVML)")]
    for r in runs:
        table.append((r.label, r.bound, f"{r.input_share:.0%}", f"{r.busy_share:.0%}",
                      f"{r.step_s * 1e3:.1f} ms" if r.step_s else "-",
                      f"{r.gpu_util_percent:.0f}%" if r.gpu_util_percent is not None else "-"))
    device = "GPU" if ctx.on_gpu else "CPU"
    notes = [] if ctx.on_gpu else [
        "no GPU here: the job computes on the CPU, which stands in for the GPU; 'busy' is the "
        "share of each step spent computing rather than waiting for data (watch's measurement), "
        "not a utilisation counter"]
    notes.append("this shows that a job at about 30% because of its loader is found input-bound "
                 "and fixed by loading ahead; not that every job at 30% has that cause (a loop "
                 "of operators too small for the device is also idle most of the time: watch "
                 "calls it host-bound)")
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"`gpuwise watch` on a {steps}-step training loop on the {device} whose DataLoader "
        f"takes {float(sleep) * 1e3:.1f} ms a batch ({(1 - busy) / busy:.2f}x the step's "
        f"measured compute), first loading in the loop's process, then with {workers} "
        "worker processes.",
        judge(slow, fed),
        f"busy {slow.busy_share:.0%} -> {fed.busy_share:.0%} with {workers} workers",
        tuple(m for r in runs for m in (
            Measurement(f"{r.label}: waiting for data", round(r.input_share, 4), "share of step",
                        "measured"),
            Measurement(f"{r.label}: median step", r.step_s, "s", "measured"),
            *((Measurement(f"{r.label}: GPU busy", r.gpu_util_percent, "%", "measured"),)
              if r.gpu_util_percent is not None else ()))),
        {"labels": [r.label for r in runs], "input_share": [r.input_share for r in runs],
         "busy_share": [r.busy_share for r in runs], "step_s": [r.step_s for r in runs],
         "bound": [r.bound for r in runs],
         "gpu_util_percent": [r.gpu_util_percent for r in runs],
         "threshold": watch_thresholds().input_bound_share},
        tuple(table), tuple(notes),
        judged_on=JudgedOn((RuntimeUse("pytorch", "fp32", ("training loop",)),), timed_here(
            f"watched here by `gpuwise watch` on the {device}"
            + (" with NVML's busy %" if ctx.on_gpu else ""))),
    )


def _watched(ctx: Context, label: str, cmd: list[str], name: str) -> WatchedRun:
    log = ctx.workdir / f"watch-{name}.jsonl"
    code = run_job(cmd, log, {"interval_s": 0.2, "inject": True, "sync": True})
    if code != 0:
        raise GpuwiseError(f"the watched job ({label}) failed with exit code {code}",
                           f"run it by hand: {' '.join(cmd)}")
    return watched_run(label, judge_logs([str(log)]))


def watched_run(label: str, answer: WatchAnswer) -> WatchedRun:
    s = answer.summary
    return WatchedRun(label, answer.verdict.bound, input_share(s), s.step_s_median,
                      s.gpu_util_percent, s.cpu_percent)
