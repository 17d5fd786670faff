"""The optimizers real runs, module runs, traces and the kernel probe build, made alike (torch,
transformers and bitsandbytes imported inside)."""

from __future__ import annotations

from typing import Any


def make_optimizer(name: str, params: list) -> Any:
    """The optimizer `name` ("adamw", "sgd", "adafactor" or "adamw8bit") over `params`, as
    the real runs make it (Adafactor with a fixed learning rate, SGD with momentum)."""
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    try:
        import bitsandbytes
    except ImportError as exc:
        raise RuntimeError("the adamw8bit optimizer needs bitsandbytes and a CUDA GPU") from exc
    return bitsandbytes.optim.AdamW8bit(params, lr=1e-3)
