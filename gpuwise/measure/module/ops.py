"""One dispatched aten op as a TracedOp: its FLOPs (torch.utils.flop_counter's formulas), the
bytes of the tensors it reads and writes, and a matmul shape for the roofline's size curves."""

from __future__ import annotations

import math
from typing import Any

from gpuwise.measure.module.op_counter import VIEW_OPS
from gpuwise.workload.traced import TracedOp

_DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
                "torch.float64": "fp64"}
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"}
_FLASH = "_scaled_dot_product_flash_attention_for_cpu"


def _flat(obj: Any, torch: Any) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _flat(x, torch)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _flat(x, torch)]
    return []


def tensor_bytes(t: Any) -> int:
    """Bytes an op touches in a tensor: its elements, but no more than its storage holds
    (an expanded tensor reads its few real elements)."""
    return min(t.numel() * t.element_size(), int(t.untyped_storage().nbytes()))


def _shape(name: str, args: Any, out: Any) -> tuple[int, int, int]:
    """(m, n, k) of a matmul-like op, as (m x k) @ (k x n)."""
    if name in ("mm", "addmm"):
        a, b = args[-2], args[-1]
        return a.shape[0], b.shape[1], a.shape[1]
    if name in ("bmm", "baddbmm"):
        a, b = args[-2], args[-1]
        return a.shape[0] * a.shape[1], b.shape[2], a.shape[2]
    if name == "convolution":  # implicit GEMM: output positions x out channels x window
        w = args[1]
        return out.numel() // out.shape[1], w.shape[0], math.prod(w.shape[1:])
    if name == "convolution_backward":
        grad_out, w = args[0], args[2]
        return grad_out.numel() // grad_out.shape[1], w.shape[0], math.prod(w.shape[1:])
    q, k = (args[0], args[1]) if name == _FLASH else (args[1], args[2])  # attention
    return q.shape[0] * q.shape[1] * q.shape[2], k.shape[2], q.shape[3]


def _attention_heads(name: str, args: Any) -> tuple[int, bool]:
    """(batch x heads, causal) of the CPU flash attention op and its backward."""
    if name == _FLASH:
        return args[0].shape[0] * args[0].shape[1], bool(args[4]) if len(args) > 4 else False
    if name == _FLASH + "_backward":
        return args[1].shape[0] * args[1].shape[1], bool(args[7]) if len(args) > 7 else False
    return 0, False


def _flops(torch: Any, packet: Any, name: str, args: Any, kwargs: dict, out: Any) -> float:
    from torch.utils import flop_counter as fc

    if packet in fc.flop_registry:
        return float(fc.flop_registry[packet](*args, **kwargs, out_val=out))
    if name == _FLASH:
        return float(fc.sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape))
    if name == _FLASH + "_backward":
        return float(fc.sdpa_backward_flop_count(args[0].shape, args[1].shape, args[2].shape,
                                                 args[3].shape))
    return float(sum(t.numel() for t in _flat(out, torch)))  # one per output element


# In-place ops that overwrite their first argument without reading it (random draws and
# fills, as dropout's `bernoulli_`): it counts once, as written, as the probe counts it.
_OVERWRITES = frozenset({"bernoulli_", "normal_", "uniform_", "random_", "exponential_",
                         "fill_", "zero_"})


def op_record(torch: Any, func: Any, name: str, args: Any, kwargs: dict, out: Any,
              phase: str, params: set[int]) -> TracedOp:
    """The TracedOp of one dispatched call; `params` are the storage keys of parameters."""
    inputs, outputs = _flat((args, kwargs), torch), _flat(out, torch)
    dtype = next((_DTYPE_NAMES.get(str(t.dtype), str(t.dtype)) for t in inputs + outputs
                  if t.is_floating_point()), "fp32")
    if name in VIEW_OPS:
        return TracedOp(name, phase, "view", 0.0, 0.0, dtype)
    read = inputs[1:] if name in _OVERWRITES else inputs  # self is written, not read
    moved = float(sum(tensor_bytes(t) for t in read + outputs))
    flops = _flops(torch, func.overloadpacket, name, args, kwargs, out)
    if name in _MATMULS or name.startswith(_FLASH):
        kind = "matmul" if name in _MATMULS else "attention"
        m, n, k = _shape(name, args, outputs[0])
        weights = float(sum(tensor_bytes(t) for t in inputs
                            if t.untyped_storage()._cdata in params))
        heads, causal = _attention_heads(name, args)
        return TracedOp(name, phase, kind, flops, moved, dtype, m, n, k, weights, heads, causal,
                        _conv_variant(name, args))
    return TracedOp(name, phase, "elementwise", flops, moved, dtype,
                    variant=_variant(name, args, kwargs))


def _variant(name: str, args: Any, kwargs: dict) -> str:
    """GELU's tanh approximation runs a kernel four times slower than the exact (erf) one
    on this CPU (fp32: 3.9 against 19.7 GB/s forward); batch norm in training computes its
    statistics first (a reduction over batch and positions per channel), about five times
    the time of inference's per-channel scale and shift."""
    if name in ("gelu", "gelu_", "gelu_backward") and kwargs.get("approximate") == "tanh":
        return "tanh"
    if name == "native_batch_norm" and len(args) > 5 and args[5]:
        return "train"
    return ""


def _conv_variant(name: str, args: Any) -> str:
    """A convolution's window and stride ("3x3/s1", "1x1/s2"; "/g" grouped): oneDNN runs
    different kernels for them, 1.5-3x apart per FLOP at equal GEMM sizes on this CPU."""
    if name not in ("convolution", "convolution_backward"):
        return ""
    weight, at = (args[1], 3) if name == "convolution" else (args[2], 4)
    stride, groups = list(args[at]), args[at + 5]
    window = "x".join(str(v) for v in weight.shape[2:])
    strides = "s" + "x".join(str(v) for v in sorted(set(stride)))
    return f"{window}/{strides}" + ("/g" if groups > 1 else "")
