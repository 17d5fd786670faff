"""Time a kernel the way the probe does, and make its operands: the median of repeated calls
after a warm-up (on a GPU, batches of calls queued back to back), random tensors in [-1, 1),
and enough copies of an operand that cycling through them reads past the last-level cache."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gpuwise.measure.call_timing import median_call_s
from gpuwise.measure.probe.kernel_plan import CUDA_BATCH, KernelPlan

Progress = Callable[[str, float], None]


class Cycle:
    """Hands out the weight copies in turn, so each call reads a weight not in cache."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.i = items, 0

    def next(self) -> Any:
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]


class KernelTimer:
    """Times kernels on one device for the probe's kernel groups (their base class), counting
    the steps done for the progress callback."""

    def __init__(self, torch: Any, device: Any, plan: KernelPlan, progress: Progress | None):
        self.t, self.device, self.plan, self.progress = torch, device, plan, progress
        self.done, self.total = 0, plan.steps()
        self.skipped: dict[str, tuple[int, float]] = {}  # grid: (points, slowest predicted s)
        self.types = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def step(self, label: str) -> None:
        if self.progress:
            self.progress(label, min(self.done / self.total, 0.999))
        self.done += 1

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.t.cuda.synchronize()

    def call_s(self, op: Callable[[], object]) -> float:
        self.sync()
        start = time.perf_counter()
        op()
        self.sync()
        return max(time.perf_counter() - start, 1e-7)

    def median_s(self, op: Callable[[], object]) -> float:
        """Median seconds of one call after warm-up, repeated to about `target_s`."""
        op()
        warm = self.call_s(op)
        if warm >= self.plan.slow_call_s / 4:  # a slow call varies little: one more is enough
            return (warm + self.call_s(op)) / 2
        if self.device.type == "cuda":
            return self._batched_s(op, warm)
        lo, hi = self.plan.repeats
        return median_call_s(op, max(lo, min(hi, int(self.plan.target_s / warm))), self.sync)

    def _batched_s(self, op: Callable[[], object], warm: float) -> float:
        """On a GPU: the median over three batches of back-to-back calls, per call. One
        synchronised call adds the launch and the wait (tens of microseconds) to a kernel
        that may take a few; queued back to back, a call costs the longer of the kernel and
        the host's dispatch of it, as in a model's eager run."""
        calls = max(1, min(CUDA_BATCH, int(self.plan.target_s / 3 / warm)))
        batches = []
        for _ in range(3):
            self.sync()
            start = time.perf_counter()
            for _ in range(calls):
                op()
            self.sync()
            batches.append((time.perf_counter() - start) / calls)
        return statistics.median(batches)

    def tensor(self, *shape: int, dtype: str) -> Any:
        # Values in [-1, 1): no denormals or overflow to slow or break a kernel.
        return self.t.rand(*shape, device=self.device).sub_(0.5).to(self.types[dtype])

    def cold_copies(self, first: Any, per_item: int = 1, limit: int | None = None) -> list[Any]:
        """`first` and its copies, enough that cycling through them (`per_item` tensors of its
        size read per call) reads past the last-level cache on every call (at most `limit`)."""
        size = first.numel() * first.element_size() * per_item
        copies = self.plan.cold_set_bytes // size
        copies = copies if limit is None else min(limit, copies)
        return [first] + [first.clone() for _ in range(copies - 1)]

    def weights(self, k: int, n: int, dtype: str) -> list[Any]:
        return self.cold_copies(self.tensor(n, k, dtype=dtype), limit=64)
