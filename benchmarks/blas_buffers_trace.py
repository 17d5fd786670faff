"""The BLAS's packing buffers, traced: the measurements behind catalog/data/allocators.toml
[blas_packing] and estimate/memory/blas_buffers.py (docs/memory.md, "The CPU process").

Each product runs in a fresh process under malloc_trace's LD_PRELOAD tracer of malloc and free,
after a tiny warm-up: the blocks taken during the call and still held after it (not its
output) are what its threads keep. `--threads` runs the product on that many (OMP_NUM_THREADS,
MKL_DYNAMIC=FALSE, so MKL takes them all on a machine with fewer cores). Printed: the threads
that kept a buffer and the largest buffer, against the rule's. `--step CASE` runs a case of
validate_cpu.py's suite traced instead and compares the packing buffers its process still
holds at the end (taken after the build; the warm-up's are in the baseline) with the rule's
for the whole step.

Needs a C compiler (`cc`) and torch; seconds a product, a minute or more a step.

Run:  .venv/bin/python benchmarks/blas_buffers_trace.py [--threads 2] [512x768x2304 ...]
      .venv/bin/python benchmarks/blas_buffers_trace.py --threads 4 --step 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import malloc_trace as mt

from gpuwise.catalog import resolve_model
from gpuwise.catalog.allocators import blas_packing
from gpuwise.estimate.memory.blas_buffers import blas_buffer_bytes, buffer_bytes, held_bytes
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape

START, END = 987654321, 987654323  # marker requests around the product
CHILD = f"""
import ctypes, sys, torch
libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p
m, k, n, batched = (int(v) for v in sys.argv[1:5])
a = torch.randn(8, 8); torch.mm(a, a)
x = torch.randn(24, m, k) if batched else torch.randn(m, k)
w = torch.randn(24, k, n) if batched else torch.randn(k, n)
libc.free(ctypes.c_void_p(libc.malloc({START})))
y = torch.bmm(x, w) if batched else torch.mm(x, w)
libc.free(ctypes.c_void_p(libc.malloc({END})))
"""
SHAPES = ["512x768x2304", "64x768x2304", "512x576x576", "2048x768x768", "512x768x50257",
          "512x64x512b"]


def _env(lib: Path, threads: int, out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_DYNAMIC="FALSE", LD_PRELOAD=str(lib),
               MTRACE_OUT=str(out), MTRACE_MIN=str(mt.TRACKED))
    return env


def kept(lib: Path, folder: Path, spec: str, threads: int) -> list[int]:
    """The blocks one product's threads keep: `spec` is m x k x n, "b" at the end batched."""
    m, k, n = (int(v) for v in spec.rstrip("b").split("x"))
    out = folder / "product.bin"
    args = [str(m), str(k), str(n), str(int(spec.endswith("b")))]
    subprocess.run([sys.executable, "-c", CHILD, *args], env=_env(lib, threads, out), check=True)
    recs = mt.records(out)
    start = next(i for i, r in enumerate(recs) if r[1] == START)
    live: dict[int, int] = {}
    for ptr, size, _tid, _flags in recs[start + 1:]:
        if size == END:
            break
        if size:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    batch = 24 if spec.endswith("b") else 1
    return sorted(s for s in live.values() if s != batch * m * n * 4)  # not the output


def step(lib: Path, folder: Path, case: int, threads: int) -> None:
    name, plan = mt.CASES[case]
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_DYNAMIC="FALSE")
    path, _ = mt.trace(case, lib, folder)
    recs = mt.records(path)
    built = max(n for n, r in enumerate(recs) if r[1] == mt.BUILD)  # the warm-up's: baseline
    live: dict[int, int] = {}
    for ptr, size, _tid, _flags in recs[built:]:
        if size >= mt.TRACKED:
            live[ptr] = size
        elif size == 0:
            live.pop(ptr, None)
    rule = blas_packing()
    traced = sum(s for s in live.values() if s % 4096 == rule.header_bytes)  # buffers' shape
    s = Shape(plan.batch, plan.seq, plan.seq, 4, 4, 4, plan.attention, logits_tokens=plan.seq)
    arch = from_config(resolve_model(name).config)
    est = blas_buffer_bytes(arch, [s], threads, training=True)
    print(f"{name} {mt.describe(plan)} on {threads} threads: traced {traced / 2**20:.2f} MiB, "
          f"rule {est / 2**20:.2f} MiB ({100 * (est / traced - 1):+.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES, help="m x k x n, 'b' batched")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", type=int, help="a fp32 training case of validate_cpu.py")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="blas-"))
    lib, _ = mt.build(folder)
    if args.step is not None:
        step(lib, folder, args.step, args.threads)
        return
    rule = blas_packing()
    for spec in args.shapes:
        blocks = kept(lib, folder, spec, args.threads)
        m, k, n = (int(v) for v in spec.rstrip("b").split("x"))
        gemm = (m, n, k, spec.endswith("b"))
        est = held_bytes([gemm], args.threads, rule)
        each = buffer_bytes(rule, m, n, k, 1 if spec.endswith("b") else args.threads)
        print(f"{spec:>14s} on {args.threads}: {len(blocks)} kept, largest "
              f"{max(blocks, default=0):>9,d} B, all {sum(blocks):>11,d} B | rule {each:>9,d} B "
              f"each, all {est:>11,d} B")


if __name__ == "__main__":
    main()
