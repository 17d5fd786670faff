"""Meta-device stand-ins for a trace: the module's tensors and the example inputs with their
shapes and dtypes and no memory. torch is imported inside."""

from __future__ import annotations

from typing import Any

from gpuwise.errors import GpuwiseError

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def require_torch() -> Any:
    """torch, or an error that says how to install it."""
    try:
        import torch
    except ImportError:
        raise GpuwiseError("tracing a module needs torch", "pip install 'gpuwise[torch]'") from None
    return torch


def torch_dtype(name: str | None) -> Any:
    """The torch dtype of "fp32", "bf16" or "fp16" (None: None)."""
    torch = require_torch()
    if name is None:
        return None
    if name not in DTYPES:
        raise GpuwiseError(f"unknown dtype {name!r}", f"choose one of: {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])


def meta_like(t: Any, dtype: Any, grad: bool) -> Any:
    """A meta stand-in of `t`, floating ones cast to `dtype`."""
    torch = require_torch()
    cast = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    out = torch.empty(t.shape, dtype=cast, device="meta")
    return out.requires_grad_(grad and out.is_floating_point())


def meta_inputs(example: Any, dtype: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) on meta from tensors, shapes (tuples of ints), or lists/dicts of them."""
    torch = require_torch()

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return meta_like(x, dtype, False)
        if isinstance(x, (tuple, list)) and x and all(isinstance(v, int) for v in x):
            if any(v < 1 for v in x):
                raise GpuwiseError(f"input shape {tuple(x)} has a dimension below 1",
                                   "every dimension must be a positive integer")
            return torch.empty(tuple(x), dtype=dtype or torch.float32, device="meta")
        return x  # a non-tensor argument (a flag, None) passes through

    if isinstance(example, dict):
        return (), {k: one(v) for k, v in example.items()}
    if isinstance(example, torch.Tensor) or (
        isinstance(example, (tuple, list)) and example and all(isinstance(v, int) for v in example)
    ):
        return (one(example),), {}
    if isinstance(example, (tuple, list)):
        return tuple(one(x) for x in example), {}
    raise GpuwiseError(f"example inputs of type {type(example).__name__} are not understood",
                       "pass a tensor, a shape tuple, or a tuple/dict of them")
