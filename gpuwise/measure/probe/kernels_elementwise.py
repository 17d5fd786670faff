"""The kernel probe's memory-bound kernels: elementwise ops (mul, SiLU, both GELUs and their
backwards, division, square root, tanh, dropout masks), a CNN's pooling and batch norm, a decode
step's cache append, and (a CPU) the rate at which fresh memory is faulted in on first touch."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from typing import Any

from gpuwise.catalog.allocators import host_allocator
from gpuwise.measure.probe.kernel_plan import HEAD_DIM, SDPA_HEADS
from gpuwise.measure.probe.kernel_timer import Cycle, KernelTimer

_FRESH_CHILD = """
import json, torch
from gpuwise.measure.call_timing import median_call_s
torch.set_num_threads({threads})
existing = torch.empty({n})
existing.fill_(1.0)
fresh = median_call_s(lambda: torch.empty({n}).fill_(1.0), 9)
into = median_call_s(lambda: existing.fill_(1.0), 9)
held, by_held = [], []
for target in {held}:  # memory in use, touched, then the fresh fill again
    while sum(h.numel() * 4 for h in held) < target:
        held.append(torch.ones(2**25))
    by_held.append([target, median_call_s(lambda: torch.empty({n}).fill_(1.0), 5)])
print(json.dumps([fresh, into, by_held]))
"""


def _available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


class ElementwiseKernels(KernelTimer):
    """Bytes/s of memory-bound kernels."""

    def elementwise(self, dtype: str) -> dict[str, float]:
        t, n = self.t, self.plan.elementwise_elements
        self.step(f"elementwise {dtype}")
        a, b = self.tensor(n, dtype=dtype), self.tensor(n, dtype=dtype)
        out, positive = t.empty_like(a), a.abs()
        size = n * a.element_size()
        gelu, gelu_backward = t.nn.functional.gelu, t.ops.aten.gelu_backward
        return {
            "binary": 3 * size / self.median_s(lambda: t.mul(a, b, out=out)),
            "silu": 2 * size / self.median_s(lambda: t.nn.functional.silu(a)),
            "gelu": 2 * size / self.median_s(lambda: gelu(a, approximate="tanh")),
            "gelu_erf": 2 * size / self.median_s(lambda: gelu(a)),
            "gelu_backward": 3 * size / self.median_s(
                lambda: gelu_backward(b, a, approximate="tanh")),
            "gelu_erf_backward": 3 * size / self.median_s(lambda: gelu_backward(b, a)),
            "div": 3 * size / self.median_s(lambda: t.div(a, b, out=out)),
            "sqrt": 2 * size / self.median_s(lambda: t.sqrt(positive, out=out)),
            "tanh": 2 * size / self.median_s(lambda: t.tanh(a, out=out)),  # GPT-2's GELU
            "bernoulli": size / self.median_s(lambda: out.bernoulli_(0.9)),  # dropout masks
            **self._image_ops(a, dtype),
            "cat": self._append_rate(a, dtype),
        }

    def _append_rate(self, a: Any, dtype: str) -> float:
        """Bytes/s of a decode step's cache append: each call grows another layer's keys
        (heads, positions, dim), read cold, as DynamicCache's torch.cat does."""
        caches = Cycle(self.cold_copies(a.view(SDPA_HEADS, -1, HEAD_DIM)))
        row = self.tensor(SDPA_HEADS, 1, HEAD_DIM, dtype=dtype)
        for _ in caches.items:  # once round, untimed: the heap then holds the old caches' space
            self._append(row, caches)
        size = a.numel() * a.element_size()
        return 2 * size / self.median_s(partial(self._append, row, caches))

    def _append(self, row: Any, caches: Cycle) -> object:
        """DynamicCache's append: the layer's cache is replaced by a new, longer tensor, so
        the copy reads the old one cold and writes where another layer's old cache was."""
        grown = self.t.cat([caches.next(), row], dim=1)
        caches.items[caches.i] = grown
        return grown

    def _image_ops(self, a: Any, dtype: str) -> dict[str, float]:
        """A CNN's max-pool (3x3, stride 2, with indices) and batch norm over 32 px planes,
        forward and backward, in bytes/s of what a trace counts (every tensor argument and
        result: a pool's backward counts the input whose shape it takes)."""
        f, e, aten = self.t.nn.functional, a.element_size(), self.t.ops.aten
        images = a.view(-1, 4, 32, 32)
        stats = (self.t.zeros(4, dtype=a.dtype, device=a.device),
                 self.t.ones(4, dtype=a.dtype, device=a.device))
        pooled, indices = f.max_pool2d(images, 3, 2, 1, return_indices=True)
        pool_bytes = a.numel() * e + pooled.numel() * (e + 8)
        pool = partial(f.max_pool2d, images, 3, 2, 1, return_indices=True)
        pool_back = partial(aten.max_pool2d_with_indices_backward, pooled, images, [3, 3],
                            [2, 2], [1, 1], [1, 1], False, indices)
        norm = partial(f.batch_norm, images, *stats, training=False)
        return {
            "pool": pool_bytes / self.median_s(pool),
            "pool_backward": (pool_bytes + a.numel() * e) / self.median_s(pool_back),
            "batch_norm": 2 * a.numel() * e / self.median_s(norm),
            **self._norm_training(a.view(-1, min(64, a.numel() // 1024), 32, 32), dtype),
        }

    def _norm_training(self, images: Any, dtype: str) -> dict[str, float]:
        """Batch norm in training over a CNN's channels (64): statistics, then the scale and
        shift (input and output counted), and its backward (output gradient and input read,
        input gradient written)."""
        aten, size = self.t.ops.aten, images.numel() * images.element_size()
        channels = images.shape[1]
        weight, bias = self.tensor(channels, dtype=dtype), self.tensor(channels, dtype=dtype)
        mean, var = self.t.zeros_like(weight), self.t.ones_like(weight)
        train = partial(aten.native_batch_norm, images, weight, bias, mean, var, True, 0.1, 1e-5)
        _, saved_mean, saved_invstd = train()
        back = partial(aten.native_batch_norm_backward, images, images, weight, mean, var,
                       saved_mean, saved_invstd, True, 1e-5, [True, True, True])
        return {
            "batch_norm_train": 2 * size / self.median_s(train),
            "batch_norm_backward": 3 * size / self.median_s(back),
        }

    def fresh(self) -> dict[str, float]:
        """First-touch rate of newly mapped memory: fill a fresh tensor past the mmap
        threshold, less the same fill into an existing one. In a process of its own: here
        the heap left by the other measurements could hand back memory already touched."""
        self.step("fresh tensors")
        held = [n for n in self.plan.fresh_held if n <= _available_bytes() / 2]
        code = _FRESH_CHILD.format(n=self.plan.fresh_bytes // 4, threads=self.t.get_num_threads(),
                                   held=held)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, check=True)
        new, into, by_held = json.loads(done.stdout.strip().splitlines()[-1])
        rate = lambda seconds: self.plan.fresh_bytes / max(seconds - into, 1e-9)  # noqa: E731
        return {"bytes_per_s": rate(new), "threshold": host_allocator().mmap_threshold_max,
                "fill_fresh_s": new, "fill_existing_s": into,
                "by_held": [[0, rate(new)]] + [[n, rate(s)] for n, s in by_held]}
