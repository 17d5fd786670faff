"""Run scaled_dot_product_attention in a trace as a CPU would. The meta device picks the math
path, which keeps the score matrix; a CPU runs a flash kernel that keeps none where its
selector picks it. Each call asks the CPU's own selector, with stride-0 stand-ins of the real
shapes, and runs the CPU flash op on meta where the CPU would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def cpu_attention() -> Iterator[None]:
    """Run sdpa as a CPU would: its flash kernel where the CPU's selector picks it."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    def stand_in(t: Any) -> Any:  # real shape and dtype, no memory: stride 0 but the last dim
        return torch.empty(t.shape[-1], dtype=t.dtype).expand(t.shape)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                flash = _flash_call(torch, stand_in, *args, **kwargs)
                if flash is not None:
                    return flash
            return func(*args, **kwargs)

    with Mode():
        yield


def _flash_call(torch: Any, stand_in: Any, q: Any, k: Any, v: Any, attn_mask: Any = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> Any:
    """The CPU flash op where the CPU would run it. It broadcasts grouped KV heads itself
    (`enable_gqa`: Qwen2.5's 14 query heads over 2 KV heads keep their 2-head K and V)."""
    heads, kv_heads = q.shape[1] if q.dim() == 4 else 0, k.shape[1] if k.dim() == 4 else 0
    grouped = enable_gqa and kv_heads and heads % kv_heads == 0
    if q.device.type != "meta" or not heads or (kv_heads != heads and not grouped):
        return None
    mask = stand_in(attn_mask) if attn_mask is not None else None
    choice = torch.ops.aten._fused_sdp_choice(stand_in(q), stand_in(k), stand_in(v), mask,
                                              dropout_p, is_causal, scale=scale,
                                              enable_gqa=enable_gqa)
    if choice != 1:  # 1: flash; anything else runs the math path as on meta
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
