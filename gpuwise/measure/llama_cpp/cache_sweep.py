"""How much of a working set this CPU serves from its caches: the read rate of arrays from
4 MiB to 1 GiB (each read whole, again and again, as token generation streams the weights),
and from it the sizes up to which a stream runs at the cache's rate and from which at the
memory's (docs/speed.md, "llama.cpp on this CPU"). The cache the OS reports is not the one a
process gets: on a shared VM here the reported 300 MiB L3 served 54-91 MiB at the cache's rate
and 76-152 MiB at memory's, as its neighbours' use of it moved."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuwise.estimate.speed.cache_share import CacheSpan
from gpuwise.measure.llama_cpp.record import CacheSweep

# 4 MiB .. 256 MiB 2^(1/4) apart, then 2^(1/2) apart to 1 GiB
SIZES_MIB = tuple(sorted({round(4 * 2 ** (k / 4)) for k in range(33) if k <= 24 or k % 2 == 0}))
READ_BYTES = 256 * 2**20  # bytes read per timing at each size (at least 2 passes)
PASSES = 2  # timings per size; the fastest counts (another process only slows a pass)
STEP = 1.3  # the beyond-cache rate must be this much slower than the cached one to count


def read_rates(sizes_mib: tuple[int, ...] = SIZES_MIB, threads: int = 1) -> dict[str, float]:
    """Bytes a second of `threads` threads each summing its share of a float32 working set of
    each size, by "<MiB>" (numpy lets go of the GIL in a sum: the threads run at once): the
    best of a pass up the sizes and one down, so that a slow spell (a neighbour, the clock
    rising at the start) marks no size alone."""
    rates: dict[str, float] = {}
    with ThreadPoolExecutor(threads) as pool:
        for mib in (*sizes_mib, *reversed(sizes_mib)):
            rate = _read_rate(pool, mib, threads)
            rates[str(mib)] = max(rate, rates.get(str(mib), 0.0))
    return rates


def _read_rate(pool: ThreadPoolExecutor, mib: int, threads: int) -> float:
    import numpy as np

    parts = [np.ones(mib * 2**20 // 4 // threads, dtype=np.float32) for _ in range(threads)]
    total = sum(p.nbytes for p in parts)
    reads = max(2, READ_BYTES // total)

    def read(part: Any) -> None:
        for _ in range(reads):
            part.sum()

    list(pool.map(read, parts))  # touch every page once before timing
    best = float("inf")
    for _ in range(PASSES):
        start = time.perf_counter()
        list(pool.map(read, parts))
        best = min(best, (time.perf_counter() - start) / reads)
    return total / best


def cache_span(rates: dict[str, float]) -> CacheSpan:
    """The span over which streams leave the cache. The cache's time a byte is the median of
    the three fastest sizes from 8 MiB (past the per-core caches), memory's that of the five
    slowest (the largest arrays can read faster again, on huge pages). The first size whose
    time, and the next one's, are past half-way between marks the cliff: `full` is the size
    before it, `none` the first from it within a tenth of memory's. No span (0, 0) where the
    two differ by less than STEP (no cache the sweep could see)."""
    points = sorted((int(k) * 2**20, 1.0 / v) for k, v in rates.items() if int(k) >= 8)
    times = sorted(t for _, t in points)
    cached, memory = statistics.median(times[:3]), statistics.median(times[-5:])
    if memory < STEP * cached or len(points) < 4:
        return CacheSpan(0.0, 0.0)
    half, near = (cached + memory) / 2, cached + 0.9 * (memory - cached)
    past = [t >= half for _, t in points] + [True]  # a stalled size alone is not the cliff
    cliff = next(i for i in range(len(points)) if past[i] and past[i + 1])
    if cliff == 0:
        return CacheSpan(0.0, 0.0)
    none = next((size for size, t in points[cliff:] if t >= near), points[cliff][0])
    return CacheSpan(float(points[cliff - 1][0]), float(none))


def sweep(threads: int) -> CacheSweep:
    """The sweep on `threads` threads (llama.cpp's default: one a core) as the probe saves it:
    rates by size, and the span found in them."""
    rates = read_rates(threads=threads)
    span = cache_span(rates)
    return CacheSweep(rates, span.full, span.none)
