"""What `gpuwise watch` costs a training loop, measured side by side in one run.

1. The loop with and without the hooks, in one process: an MLP (512-1024-1024-1, AdamW,
   batch 64, a DataLoader; ~25 ms steps on a small CPU) runs in blocks of BLOCK steps,
   alternately plain and inside `gpuwise.watch(auto=True)` (the hooks `gpuwise watch`
   injects, writing the log), in both orders, PAIRS times. Adjacent blocks share the
   machine's load, so the median of the paired ratios is the overhead even on a busy machine.
   Operator counting (3 steps per process, left out of the timings) is off here.
2. The hooks' fixed cost per step: the same with a trivial step (a 1x1 linear layer).
3. The sampler, which runs in the `gpuwise` process beside the job: its CPU time per sample,
   and the share of one core at the default 0.2 s interval.
4. With --whole: whole runs as subprocesses (plain, `gpuwise watch`, `--no-inject`),
   interleaved. Each run is ~5 s, so on a shared machine the load changes between runs and
   the spread swamps a 1% effect; the in-process pairs above are the figure to quote.

Target: overhead <= 1% of step time.
Run:  .venv/bin/python benchmarks/watch_overhead.py [--pairs 15] [--block 8] [--whole]
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
steps, width = int(sys.argv[1]), 512
data = TensorDataset(torch.randn(64 * steps, width), torch.randn(64 * steps, 1))
model = torch.nn.Sequential(torch.nn.Linear(width, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
marks = []
for x, y in DataLoader(data, batch_size=64):
    marks.append(time.perf_counter())
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
marks.append(time.perf_counter())
print(json.dumps({"step_s": (marks[-1] - marks[40]) / (len(marks) - 41)}))
"""


def run_job(variant: str, steps: int, workdir: Path) -> float:
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
    return float(json.loads(out.splitlines()[0])["step_s"])


def whole_runs(repeats: int, steps: int) -> dict[str, list[float]]:
    variants = ("plain", "watch", "watch --no-inject")
    times: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            order = variants if r % 2 == 0 else variants[::-1]  # interleaved, both orders
            for v in order:
                times[v].append(run_job(v, steps, Path(tmp)))
    return times


def mlp_loop(width: int, hidden: int, batch: int) -> Callable[[int], float]:
    """A training loop; `run(n)` does n steps and returns the mean step time."""
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

    def run(n: int) -> float:
        done, start = 0, time.perf_counter()
        while done < n:
            for x, y in loader:
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                opt.zero_grad()
                done += 1
                if done == n:
                    break
        return (time.perf_counter() - start) / n

    return run


def paired(run: Callable[[int], float], pairs: int, block: int) -> tuple[float, float]:
    """(median step time without watch, median ratio with/without) over adjacent blocks."""
    import gpuwise
    from gpuwise.measure.watch.inject import _gpuwise_watch_recorder as recorder

    recorder.COUNT_STEPS = ()  # a one-off cost, not a per-step one
    run(block)  # warm-up
    plain_times, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            watched = None
            for first_plain in (i % 2 == 0, i % 2 != 0):
                if first_plain:
                    plain = run(block)
                else:
                    with gpuwise.watch(Path(tmp) / "b.jsonl", auto=True, sample=False):
                        watched = run(block)
            plain_times.append(plain)
            ratios.append(watched / plain)  # type: ignore[operator]
    return statistics.median(plain_times), statistics.median(ratios)


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
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--whole", action="store_true", help="also whole runs (noisy)")
    parser.add_argument("--repeats", type=int, default=5, help="whole runs per variant")
    parser.add_argument("--steps", type=int, default=120, help="steps per whole run")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    step, ratio = paired(mlp_loop(512, 1024, 64), args.pairs, args.block)
    print(f"MLP loop, {args.pairs} pairs of {args.block}-step blocks (measured): step "
          f"{1e3 * step:.2f} ms, with watch's hooks {ratio - 1:+.2%} "
          f"({1e6 * step * (ratio - 1):+.0f} us per step)")  # fmt: skip
    tiny, tiny_ratio = paired(mlp_loop(1, 1, 1), args.pairs, 200)
    cost = tiny * (tiny_ratio - 1)
    print(f"trivial loop (measured): step {1e6 * tiny:.0f} us, hooks' fixed cost "
          f"{1e6 * cost:.0f} us per step: 1% of any step longer than {1e5 * cost:.1f} ms")  # fmt: skip
    ms = sampler_cost_ms()
    print(f"sampler (measured): {ms:.2f} ms of CPU per sample = {ms / 200:.2%} of one core "
          f"at 0.2 s; on this machine at most {ms / 200 / (os.cpu_count() or 1):.2%} of a "
          "job that uses every core")  # fmt: skip
    if args.whole:
        times = whole_runs(args.repeats, args.steps)
        base = statistics.median(times["plain"])
        print(f"whole runs ({args.repeats} interleaved repeats, {args.steps} steps; measured)")
        for variant, values in times.items():
            med = statistics.median(values)
            print(f"  {variant:<18} median step {1e3 * med:7.2f} ms  overhead "
                  f"{med / base - 1:+6.2%}  (spread {(max(values) - min(values)) / med:.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
