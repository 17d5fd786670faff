"""The probe against independent references, side by side in one run.

- Bandwidth: `benchmarks/triad.c` (STREAM-style read/copy/triad, OpenMP, gcc -O3
  -march=native) over fp32 arrays of the probe's size, with the probe's thread count.
- Matmul: numpy.matmul (numpy's own BLAS, not torch's) fp32 at 4096^3, best of several,
  against the probe's best fp32 point.

Target: every ratio probe / reference >= 0.90. Memory bandwidth on a shared VM drifts by a
third from minute to minute, so C and the probe alternate for several rounds and the ratio
is the median of each round's probe / C.

    .venv/bin/python benchmarks/probe_vs_reference.py [--quick] [--rounds 7] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from gpuwise.measure.probe import (
    DEFAULT_CACHE_BYTES,
    Backend,
    ProbePlan,
    TorchBackend,
    probe_with,
    run_probe,
)

HERE = Path(__file__).resolve().parent
TARGET = 0.90
KINDS = ("read", "copy", "triad")


def build_c(where: Path) -> Path:
    """Compile triad.c into `where`."""
    gcc = shutil.which("gcc")
    if gcc is None:
        sys.exit("ERROR: gcc not found\nHINT: apt-get install gcc (the reference is plain C)")
    exe = where / "triad"
    cmd = [gcc, "-O3", "-march=native", "-fopenmp", str(HERE / "triad.c"), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def c_stream(exe: Path, elements: int, threads: int, repeats: int) -> dict[str, float]:
    """One run of the C reference: its JSON result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "close"}
    out = subprocess.run([str(exe), str(elements), str(repeats)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


BLAS_SCRIPT = """
import sys, time
import numpy as np
size, repeats = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
out = np.empty((size, size), dtype=np.float32)
np.matmul(a, b, out=out)
best = float("inf")
for _ in range(repeats):
    start = time.perf_counter()
    np.matmul(a, b, out=out)
    best = min(best, time.perf_counter() - start)
print(2 * size**3 / best)
"""


def blas_fp32(size: int, repeats: int) -> float:
    """Best fp32 FLOP/s of numpy.matmul at size^3, in a separate process: numpy's BLAS
    threads spin for a while after each call and would slow the probe's own threads."""
    cmd = [sys.executable, "-c", BLAS_SCRIPT, str(size), str(repeats)]
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def probe_stream(backend: Backend, plan: ProbePlan) -> dict[str, float]:
    """The probe's own bandwidth measurement (no matmul): GB/s by kind."""
    profile = probe_with(backend, replace(plan, matmul_shapes=()), fingerprint="bench")
    return {r.kind: r.gbs or float("nan") for r in profile.bandwidth}


def _row(name: str, probe: float | None, reference: float, ratio: float | None, how: str) -> str:
    verdict = "NA" if ratio is None else ("ok" if ratio >= TARGET else "BELOW TARGET")
    shown = f"{probe:10.2f}" if probe else f"{'NA':>10}"
    ratio_text = f"{ratio:6.3f}" if ratio else f"{'NA':>6}"
    return f"{name:<21}{shown}{reference:11.2f}  {ratio_text}  {verdict:<7}{how}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="compare the quick probe's matmul")
    parser.add_argument("--rounds", type=int, default=7, help="alternating C / probe rounds")
    parser.add_argument("--repeats", type=int, default=20, help="passes per round (best of)")
    parser.add_argument("--blas-size", type=int, default=4096)
    parser.add_argument("--blas-repeats", type=int, default=5)
    args = parser.parse_args()

    backend = TorchBackend()
    cache = backend.cache_bytes() or DEFAULT_CACHE_BYTES
    plan = replace(ProbePlan.for_mode(args.quick, cache), stream_repeats=args.repeats)
    threads = backend.threads() or 1
    elements = plan.array_bytes // 4
    # Host memory bandwidth drifts by 30% from minute to minute on a shared VM: C and the
    # probe alternate, and each round's ratio compares neighbours in time.
    ratios: dict[str, list[float]] = {k: [] for k in KINDS}
    best_c: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    best_p: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_c(Path(tmp))
        for _ in range(args.rounds):
            ref = c_stream(exe, elements, threads, args.repeats)
            got = probe_stream(backend, plan)
            for kind in KINDS:
                ratios[kind].append(got[kind] / ref[f"{kind}_gbs"])
                best_c[kind] = max(best_c[kind], ref[f"{kind}_gbs"])
                best_p[kind] = max(best_p[kind], got[kind])
    backend.close()

    blas_before = blas_fp32(args.blas_size, args.blas_repeats)
    started = time.perf_counter()
    profile = run_probe(quick=args.quick, backend="torch-cpu")
    probe_s = time.perf_counter() - started
    blas = max(blas_before, blas_fp32(args.blas_size, args.blas_repeats))
    best = profile.matmul_best.get("fp32")

    print(f"machine: {profile.device} | {threads} threads | LLC {cache / 2**20:.0f} MiB | "
          f"arrays 3 x {plan.array_bytes / 2**20:.0f} MiB fp32")
    print(f"bandwidth: {args.rounds} rounds, C then probe, best of {args.repeats} passes each")
    print(f"{'':<21}{'probe':>10}{'reference':>11}  {'ratio':>6}  (bandwidth: best of rounds;"
          " ratio: median over rounds of probe / C in the same round)")
    for kind in KINDS:
        median = statistics.median(ratios[kind])
        rounds = "rounds " + " ".join(f"{r:.2f}" for r in ratios[kind])
        print(_row(f"{kind} GB/s", best_p[kind], best_c[kind], median, rounds))
    shape = f"{best.m}x{best.n}x{best.k}" if best else "NA"
    mode = "quick" if args.quick else "full"
    gflops = best.flops_per_s / 1e9 if best else None
    print(_row("fp32 matmul GFLOP/s", gflops, blas / 1e9, gflops and gflops * 1e9 / blas,
               f"numpy.matmul {args.blas_size}^3 best of 2x{args.blas_repeats}; "
               f"probe ({mode}, {probe_s:.0f} s) best at {shape}"))
    bf16 = profile.best_flops_per_s("bf16")
    costs = ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in profile.overhead_s.items() if v)
    print(f"probe also: bf16 best {bf16 / 1e9 if bf16 else float('nan'):.1f} GFLOP/s; "
          f"overhead {costs}")
    for note in profile.notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
