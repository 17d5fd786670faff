"""The kernel probe's attention: scaled_dot_product_attention per (batch x head), head dim 64,
at decode (one query against a cache read cold), causal prefill, non-causal attention, and
their backwards."""

from __future__ import annotations

from functools import partial
from typing import Any

from gpuwise.measure.probe.kernel_plan import HEAD_DIM
from gpuwise.measure.probe.kernel_timer import Cycle, KernelTimer


class AttentionKernels(KernelTimer):
    """SDPA forward and backward."""

    def sdpa(self, dtype: str) -> dict[str, list[list[float]]]:
        heads, plan = self.plan.sdpa_heads, self.plan
        decode, prefill = [], []
        for kv in plan.sdpa_decode_kv:
            self.step(f"sdpa {dtype} decode kv {kv}")
            query = self.tensor(1, heads, 1, HEAD_DIM, dtype=dtype)
            keys = self.tensor(1, heads, kv, HEAD_DIM, dtype=dtype)
            caches = Cycle([(k, k.clone()) for k in self.cold_copies(keys, 2)])
            decode.append([kv, self.median_s(partial(self._attend_cold, query, caches)) / heads])
        for n in plan.sdpa_prefill_q:
            self.step(f"sdpa {dtype} prefill {n}")
            qkv = [self.tensor(1, heads, n, HEAD_DIM, dtype=dtype) for _ in range(3)]
            prefill.append([n, self.median_s(partial(self._attend, qkv, True)) / heads])
        full = []
        for n in plan.sdpa_full_q:
            self.step(f"sdpa {dtype} non-causal {n}")
            qkv = [self.tensor(1, heads, n, HEAD_DIM, dtype=dtype) for _ in range(3)]
            full.append([n, self.median_s(partial(self._attend, qkv, False)) / heads])
        backward = [[n, self._sdpa_backward_s(n, dtype, True)] for n in plan.sdpa_backward_q]
        full_backward = [[n, self._sdpa_backward_s(n, dtype, False)] for n in plan.sdpa_full_q]
        return {"decode": decode, "prefill": prefill, "full": full, "backward": backward,
                "full_backward": full_backward}

    def _sdpa_backward_s(self, n: int, dtype: str, causal: bool) -> float:
        """Seconds per (batch x head) of SDPA's backward at q = kv = n: causal (a decoder's
        training step) or not (an encoder's or a ViT's, twice the work at equal length)."""
        self.step(f"sdpa {dtype} {'' if causal else 'non-causal '}backward {n}")
        heads = self.plan.sdpa_heads
        qkv = [self.tensor(1, heads, n, HEAD_DIM, dtype=dtype).requires_grad_()
               for _ in range(3)]
        out = self._attend(qkv, causal)
        step = partial(self.t.autograd.grad, out, qkv, self.t.ones_like(out), retain_graph=True)
        return self.median_s(step) / heads

    def _attend_cold(self, query: Any, caches: Cycle) -> object:
        """A decode step's attention: its layer's keys and values are not in cache (the step
        streamed every other layer's weights since it last read them)."""
        keys, values = caches.next()
        return self.t.nn.functional.scaled_dot_product_attention(query, keys, values)

    def _attend(self, qkv: list[Any], causal: bool) -> object:
        return self.t.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal)
