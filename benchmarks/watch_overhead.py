"""What `gpuwise watch` costs a training loop, measured side by side in one run.

1. The loop with and without the hooks, in one process on one torch thread: an MLP
   (512-1024-1024-1, AdamW, batch 64, a DataLoader; ~15-20 ms steps here) runs in blocks of
   BLOCK steps, alternately plain and inside `gpuwise.watch(auto=True)` (the hooks
   `gpuwise watch` injects, writing the log), PAIRS times; each watched block is compared
   with the mean of the plain blocks just before and after it, in CPU time of the process
   and in wall time, and the median of these ratios is the overhead. Operator counting (3
   steps per process, left out of the timings) is off here.
2. The hooks' fixed cost per step: the same with a trivial step (a 1x1 linear layer).
3. The sampler, which runs in the `gpuwise` process beside the job: its CPU time per sample,
   and the share of one core at the default 0.2 s interval.
4. With --whole: whole runs as subprocesses (plain, `gpuwise watch`, `--no-inject`; the
   job on one torch thread), interleaved, each reporting its mean wall and CPU time per
   step after step 40. Each run takes seconds, so on a shared machine the load changes
   between runs and the spread swamps a 1% effect; the in-process pairs are finer.

Target: overhead <= 1% of step time.
Run:  .venv/bin/python benchmarks/watch_overhead.py [--pairs 40] [--block 4] [--whole]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

JOB = r"""
import json, sys, time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)  # CPU time without spin-waits: comparable across a busy machine
steps, width = int(sys.argv[1]), 512
data = TensorDataset(torch.randn(64 * steps, width), torch.randn(64 * steps, 1))
model = torch.nn.Sequential(torch.nn.Linear(width, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
marks, cpu = [], []
for x, y in DataLoader(data, batch_size=64):
    marks.append(time.perf_counter())
    cpu.append(time.process_time())
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
marks.append(time.perf_counter())
cpu.append(time.process_time())
n = len(marks) - 41
print(json.dumps({"step_s": (marks[-1] - marks[40]) / n, "cpu_s": (cpu[-1] - cpu[40]) / n}))
"""


def run_job(variant: str, steps: int, workdir: Path) -> tuple[float, float]:
    script = workdir / "job.py"
    script.write_text(JOB)
    cmd = [sys.executable, str(script), str(steps)]
    gpuwise = [sys.executable, "-c", "from gpuwise.cli import main; main()", "watch", "--json",
               "--log", str(workdir / "w.jsonl")]  # fmt: skip
    if variant == "watch":
        cmd = [*gpuwise, "--", *cmd]
    elif variant == "watch --no-inject":
        cmd = [*gpuwise, "--no-inject", "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    got = json.loads(out.splitlines()[0])
    return float(got["step_s"]), float(got["cpu_s"])


def whole_runs(repeats: int, steps: int) -> dict[str, list[tuple[float, float]]]:
    variants = ("plain", "watch", "watch --no-inject")
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            order = variants if r % 2 == 0 else variants[::-1]  # interleaved, both orders
            for v in order:
                times[v].append(run_job(v, steps, Path(tmp)))
    return times


def mlp_loop(width: int, hidden: int, batch: int) -> Callable[[int], tuple[float, float]]:
    """A training loop; `run(n)` does n steps: (mean wall time, mean CPU time) per step."""
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
    if hidden > 1:
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(batch * 64, width),
                                          torch.randn(batch * 64, 1))  # fmt: skip
    loader = torch.utils.data.DataLoader(data, batch_size=batch)

    def run(n: int) -> tuple[float, float]:
        done, start, cpu = 0, time.perf_counter(), time.process_time()
        while done < n:
            for x, y in loader:
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                opt.zero_grad()
                done += 1
                if done == n:
                    break
        return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n

    return run


def paired(run: Callable[[int], tuple[float, float]], pairs: int,
           block: int) -> tuple[tuple[float, float], tuple[float, float]]:  # fmt: skip
    """Median (wall, CPU) step time without watch, and the median (wall, CPU) ratio of a
    watched block to the mean of the plain blocks just before and after it (a linear drift
    in the machine's load cancels). CPU time (all threads of this process) moves less with
    other processes' load than wall time: on a shared machine it is the one to read."""
    import gpuwise
    from gpuwise.measure.watch.inject import _gpuwise_watch_recorder as recorder

    recorder.COUNT_STEPS = ()  # a one-off cost, not a per-step one
    run(block)  # warm-up
    plain_times, ratios = [], []  # of (wall, cpu)
    with tempfile.TemporaryDirectory() as tmp:
        before = run(block)
        for _ in range(pairs):
            with gpuwise.watch(Path(tmp) / "b.jsonl", auto=True, sample=False):
                watched = run(block)
            after = run(block)
            plain_times.append(before)
            ratios.append(tuple(2 * w / (b + a) for w, b, a in zip(watched, before, after,
                                                                   strict=True)))  # fmt: skip
            before = after
    return _medians(plain_times), _medians(ratios)  # type: ignore[arg-type]


def _medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def sampler_cost_ms(reads: int = 100) -> float:
    from gpuwise.measure.watch.inject._gpuwise_watch_recorder import JsonlLog
    from gpuwise.measure.watch.sampler import Sampler

    with tempfile.TemporaryDirectory() as tmp:
        sampler = Sampler(JsonlLog(str(Path(tmp) / "s.jsonl")), os.getpid())
        times = []
        for _ in range(reads):
            start = time.thread_time()
            sampler._write(sampler.read())
            times.append(time.thread_time() - start)
    return 1e3 * statistics.fmean(times)  # the mean: every 10th reading also lists the tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--whole", action="store_true", help="also whole runs (noisy)")
    parser.add_argument("--repeats", type=int, default=5, help="whole runs per variant")
    parser.add_argument("--steps", type=int, default=120, help="steps per whole run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, in-process part")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # one thread: its CPU time does not count spin-waits
    print(
        f"torch threads (in-process part): {args.threads}; machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
    )
    (wall, cpu), (wall_ratio, cpu_ratio) = paired(mlp_loop(512, 1024, 64), args.pairs, args.block)
    print(f"MLP loop, {args.pairs} pairs of {args.block}-step blocks (measured): step "
          f"{1e3 * wall:.2f} ms wall, {1e3 * cpu:.2f} ms CPU; with watch's hooks: CPU time "
          f"{cpu_ratio - 1:+.2%}, wall time {wall_ratio - 1:+.2%}")  # fmt: skip
    (tiny_wall, tiny_cpu), (_, tiny_ratio) = paired(mlp_loop(1, 1, 1), args.pairs, 200)
    cost = tiny_cpu * (tiny_ratio - 1)
    print(f"trivial loop (measured): step {1e6 * tiny_wall:.0f} us wall, {1e6 * tiny_cpu:.0f} us "
          f"CPU; the hooks' fixed cost: {1e6 * cost:.0f} us of CPU per step, 1% of any step "
          f"longer than {1e5 * cost:.1f} ms")  # fmt: skip
    ms = sampler_cost_ms()
    print(f"sampler (measured): {ms:.2f} ms of CPU per sample = {ms / 200:.2%} of one core "
          f"at 0.2 s; on this machine at most {ms / 200 / (os.cpu_count() or 1):.2%} of a "
          "job that uses every core")  # fmt: skip
    if args.whole:
        times = whole_runs(args.repeats, args.steps)
        base = _medians(times["plain"])
        print(f"whole runs ({args.repeats} interleaved repeats, {args.steps} steps; measured)")
        for variant, values in times.items():
            wall, cpu = _medians(values)
            spread = (max(v[0] for v in values) - min(v[0] for v in values)) / wall
            print(f"  {variant:<18} step {1e3 * wall:7.2f} ms wall ({wall / base[0] - 1:+6.2%}, "
                  f"spread {spread:.0%}), {1e3 * cpu:7.2f} ms CPU ({cpu / base[1] - 1:+6.2%})")  # fmt: skip


if __name__ == "__main__":
    main()
