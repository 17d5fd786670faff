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
4. The Prometheus exporter (`--prometheus`, `gpuwise.watch(prometheus=...)`): its CPU time
   per scrape (reading the log's new records, the window's summary and verdict, the text
   format) on a log growing like a real job's (steps of STEP_S, one scrape every 15 s, the
   window full), for 1 and 8 ranks; and the MLP loop of (1) again, with and without the
   exporter side by side: blocks inside `gpuwise.watch(auto=True)` alone and inside
   `gpuwise.watch(auto=True, prometheus=...)`, each against the plain blocks around it,
   while another process scrapes it every --scrape-interval seconds (1 s: 15x the usual).
   Under `gpuwise watch --prometheus` the exporter runs in the watching process, not in the
   job's: there it takes a share of one core and never the job's interpreter.
5. With --whole: whole runs as subprocesses (plain, `gpuwise watch`, `--no-inject`,
   `--prometheus` scraped every --scrape-interval; the job on one torch thread),
   interleaved, each reporting its mean wall and CPU time per step after step 40. Each run
   takes seconds, so on a shared machine the load changes between runs and the spread
   swamps a 1% effect; the in-process pairs are finer.

Target: overhead <= 1% of step time.
Run:  .venv/bin/python benchmarks/watch_overhead.py [--pairs 40] [--block 4] [--whole]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


# Scrapes http://127.0.0.1:PORT/metrics every INTERVAL seconds until killed, as Prometheus
# would (a refused connection, while nothing listens, is skipped).
SCRAPER = r"""
import sys, time, urllib.request
url, every = f"http://127.0.0.1:{sys.argv[1]}/metrics", float(sys.argv[2])
while True:
    time.sleep(every)
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def scraper(port: int, every: float) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", SCRAPER, str(port), str(every)])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def run_job(variant: str, steps: int, workdir: Path, scrape_s: float = 1.0) -> tuple[float, float]:
    script = workdir / "job.py"
    script.write_text(JOB)
    cmd = [sys.executable, str(script), str(steps)]
    gpuwise = [sys.executable, "-c", "from gpuwise.cli import main; main()", "watch", "--json",
               "--log", str(workdir / "w.jsonl")]
    port = free_port()
    if variant == "watch":
        cmd = [*gpuwise, "--", *cmd]
    elif variant == "watch --no-inject":
        cmd = [*gpuwise, "--no-inject", "--", *cmd]
    elif variant == "watch --prometheus":
        cmd = [*gpuwise, "--prometheus", f"127.0.0.1:{port}", "--", *cmd]
    with scraper(port, scrape_s) if variant == "watch --prometheus" else contextlib.nullcontext():
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    got = json.loads(out.splitlines()[0])
    return float(got["step_s"]), float(got["cpu_s"])


def whole_runs(repeats: int, steps: int, scrape_s: float) -> dict[str, list[tuple[float, float]]]:
    variants = ("plain", "watch", "watch --no-inject", "watch --prometheus")
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            order = variants if r % 2 == 0 else variants[::-1]  # interleaved, both orders
            for v in order:
                times[v].append(run_job(v, steps, Path(tmp), scrape_s))
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
                                          torch.randn(batch * 64, 1))
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


def paired(run: Callable[[int], tuple[float, float]], pairs: int, block: int,
           **watch: Any) -> tuple[tuple[float, float], tuple[float, float]]:
    """Median (wall, CPU) step time without watch, and the median (wall, CPU) ratio of a
    watched block to the mean of the plain blocks just before and after it (a linear drift
    in the machine's load cancels). CPU time (all threads of this process) moves less with
    other processes' load than wall time: on a shared machine it is the one to read.
    `watch`: more arguments of the watched blocks' `gpuwise.watch()` (prometheus=...)."""
    import gpuwise
    from gpuwise.measure.watch.inject import _gpuwise_watch_recorder as recorder

    recorder.COUNT_STEPS = ()  # a one-off cost, not a per-step one
    run(block)  # warm-up
    plain_times, ratios = [], []  # of (wall, cpu)
    with tempfile.TemporaryDirectory() as tmp:
        before = run(block)
        for _ in range(pairs):
            with gpuwise.watch(Path(tmp) / "b.jsonl", auto=True, sample=False, **watch):
                watched = run(block)
            after = run(block)
            plain_times.append(before)
            ratios.append(tuple(2 * w / (b + a) for w, b, a in zip(watched, before, after,
                                                                   strict=True)))
            before = after
    return _medians(plain_times), _medians(ratios)  # type: ignore[arg-type]


def with_and_without_exporter(pairs: int, block: int, scrape_s: float) -> None:
    """The MLP loop's paired blocks twice, interleaved by half: watched alone, and watched
    with the exporter serving (and being scraped); each against its own plain blocks."""
    run = mlp_loop(512, 1024, 64)
    port = free_port()
    alone, served = [], []
    with scraper(port, scrape_s):
        for half in range(2):
            for arm in (("alone", "served") if half == 0 else ("served", "alone")):
                kwargs = {"prometheus": f"127.0.0.1:{port}"} if arm == "served" else {}
                (alone if arm == "alone" else served).append(
                    paired(run, pairs // 2, block, **kwargs)[1])
    for name, got in (("watch's hooks", alone), ("hooks + exporter", served)):
        wall, cpu = statistics.fmean(g[0] for g in got), statistics.fmean(g[1] for g in got)
        print(f"  {name:<17} CPU time {cpu - 1:+.2%}, wall time {wall - 1:+.2%}")


def synthetic_steps(ranks: int, steps: int, first: int, t0: float, step_s: float) -> list[str]:
    """JSON lines of `steps` steps per rank (and the samples of their span), as a log has."""
    lines = []
    for rank in range(ranks):
        for i in range(first, first + steps):
            lines.append(json.dumps({
                "kind": "step", "rank": rank, "world": ranks, "pid": 100 + rank,
                "source": "inject", "step": i, "t_start": t0 + i * step_s, "step_s": step_s,
                "data_s": 0.2 * step_s, "h2d_s": 0.0, "forward_s": 0.0, "backward_s": 0.5 * step_s,
                "optimizer_s": 0.1 * step_s, "samples": 64, "ops": None, "counted": False,
                "rss_bytes": 2 * 10**9 + i * 1000, "device_mem_bytes": 10**10}))
    start, end = t0 + first * step_s, t0 + (first + steps) * step_s
    for k in range(int((end - start) / 0.2)):
        lines.append(json.dumps({
            "kind": "sample", "t": start + 0.2 * k, "cpu_percent": 50.0, "per_core": [50.0] * 32,
            "iowait_percent": 0.5, "rss_bytes": 3 * 10**10,
            "gpus": [{"index": g, "util_percent": 90, "sm_percent": 70, "mem_used_bytes": 6 * 10**10,
                      "mem_total_bytes": 8 * 10**10, "power_w": 600.0,
                      "energy_j": 1e6 + 600.0 * (start + 0.2 * k - t0)}
                     for g in range(ranks)], "cpu_energy_j": None}))
    return lines


def exporter_cost_ms(ranks: int, step_s: float = 0.02, scrape_s: float = 15.0,
                     scrapes: int = 8) -> float:
    """Median CPU time of one scrape (this thread: reading the new records, the families,
    the text format), the log growing by `scrape_s` of steps between scrapes."""
    from prometheus_client import generate_latest

    from gpuwise.measure.watch.exporter import serve

    per_scrape = int(scrape_s / step_s)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "x.jsonl"
        header = {"kind": "header", "format": "gpuwise-watch/1", "cmd": ["train.py"], "t": 0.0,
                  "host": "bench", "interval_s": 0.2, "gpus": ["GPU"] * ranks, "inject": True,
                  "unavailable": {}}
        first = 8 * per_scrape  # the window is full from the first scrape on
        log.write_text("\n".join([json.dumps(header), *synthetic_steps(ranks, first, 0, 0.0,
                                                                       step_s)]) + "\n")
        server = serve("127.0.0.1:0")
        server.attach(log, "bench", refresh_s=0.0)
        generate_latest(server.registry)
        times = []
        for k in range(scrapes):
            with log.open("a") as f:
                f.write("\n".join(synthetic_steps(ranks, per_scrape, first + k * per_scrape,
                                                  0.0, step_s)) + "\n")
            start = time.thread_time()
            generate_latest(server.registry)
            times.append(time.thread_time() - start)
        server.close()
    return 1e3 * statistics.median(times)


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
    parser.add_argument("--scrape-interval", type=float, default=1.0,
                        help="seconds between scrapes of the exporter (Prometheus: 15-60)")
    parser.add_argument("--no-exporter", action="store_true", help="skip the exporter's part")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # one thread: its CPU time does not count spin-waits
    print(
        f"torch threads (in-process part): {args.threads}; machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
    )
    (wall, cpu), (wall_ratio, cpu_ratio) = paired(mlp_loop(512, 1024, 64), args.pairs, args.block)
    print(f"MLP loop, {args.pairs} pairs of {args.block}-step blocks (measured): step "
          f"{1e3 * wall:.2f} ms wall, {1e3 * cpu:.2f} ms CPU; with watch's hooks: CPU time "
          f"{cpu_ratio - 1:+.2%}, wall time {wall_ratio - 1:+.2%}")
    (tiny_wall, tiny_cpu), (_, tiny_ratio) = paired(mlp_loop(1, 1, 1), args.pairs, 200)
    cost = tiny_cpu * (tiny_ratio - 1)
    print(f"trivial loop (measured): step {1e6 * tiny_wall:.0f} us wall, {1e6 * tiny_cpu:.0f} us "
          f"CPU; the hooks' fixed cost: {1e6 * cost:.0f} us of CPU per step, 1% of any step "
          f"longer than {1e5 * cost:.1f} ms")
    ms = sampler_cost_ms()
    print(f"sampler (measured): {ms:.2f} ms of CPU per sample = {ms / 200:.2%} of one core "
          f"at 0.2 s; on this machine at most {ms / 200 / (os.cpu_count() or 1):.2%} of a "
          "job that uses every core")
    if not args.no_exporter:
        for ranks in (1, 8):
            costs = {every: exporter_cost_ms(ranks, scrape_s=every) for every in (15.0, 1.0)}
            print(f"exporter, {ranks} rank(s) of 20 ms steps (measured): a scrape every 15 s "
                  f"takes {costs[15.0]:.1f} ms of CPU = {costs[15.0] / 15e3:.2%} of one core; "
                  f"every 1 s, {costs[1.0]:.1f} ms = {costs[1.0] / 1e3:.2%} (in the watching "
                  "process under `gpuwise watch`)")
        print(f"MLP loop, {args.pairs} pairs of {args.block}-step blocks, mean of 2 halves, "
              f"scraped every {args.scrape_interval:g} s (measured), against plain blocks:")
        with_and_without_exporter(args.pairs, args.block, args.scrape_interval)
    if args.whole:
        times = whole_runs(args.repeats, args.steps, args.scrape_interval)
        base = _medians(times["plain"])
        print(f"whole runs ({args.repeats} interleaved repeats, {args.steps} steps; measured)")
        for variant, values in times.items():
            wall, cpu = _medians(values)
            spread = (max(v[0] for v in values) - min(v[0] for v in values)) / wall
            print(f"  {variant:<19} step {1e3 * wall:7.2f} ms wall ({wall / base[0] - 1:+6.2%}, "
                  f"spread {spread:.0%}), {1e3 * cpu:7.2f} ms CPU ({cpu / base[1] - 1:+6.2%})")


if __name__ == "__main__":
    main()
