"""The inputs of `gpuwise module`: `--input` shapes parsed, or the factory's own example
inputs, as meta tensors (no memory), with the batch replaced where asked."""

from __future__ import annotations

import re
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.runs.module_run import make_inputs

INT_DTYPES = {"int64": "int64", "long": "int64", "int32": "int32", "int": "int64",
              "bool": "bool", "uint8": "uint8"}
_SHAPE = re.compile(r"^\d+([x,]\d+)*$")


def parse_input(text: str) -> tuple[tuple[int, ...], str | None]:
    """'1x3x224x224' -> ((1, 3, 224, 224), None); '4x128:int64' -> ((4, 128), 'int64').
    No dtype: floating, in the module's dtype."""
    shape_text, _, dtype = text.strip().partition(":")
    if not _SHAPE.match(shape_text):
        raise GpuwiseError(f"--input {text!r} is not a shape like 1x3x224x224",
                           "dimensions joined by x, optionally :int64 for integer inputs "
                           "(token ids)")
    shape = tuple(int(v) for v in re.split("[x,]", shape_text))
    if any(v < 1 for v in shape) or any(v > 1 << 24 for v in shape):
        raise GpuwiseError(f"--input {text!r} has a dimension below 1 or above 16M",
                           "every dimension must be a sensible positive integer")
    if dtype and dtype.lower() not in INT_DTYPES:
        raise GpuwiseError(f"unknown input dtype {dtype!r}",
                           f"integer inputs take one of: {', '.join(INT_DTYPES)}; floating "
                           "inputs follow --dtype")
    return shape, INT_DTYPES[dtype.lower()] if dtype else None


def examples(made: Any, inputs: list[str], batch: int | None) -> tuple[Any, Any, list[str]]:
    """(module, meta example inputs, their labels) from the factory's result and --input."""
    import torch

    model, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if inputs:
        specs = [parse_input(t) for t in inputs]
        if batch:
            specs = [((batch, *s[1:]), d) for s, d in specs]
        return model, make_inputs(torch, specs, None, "meta"), [_label(s, d) for s, d in specs]
    if example is None:
        raise GpuwiseError("no example inputs: pass --input SHAPE (e.g. --input 1x3x224x224)",
                           "or let the factory return (module, example_inputs)")

    def rebatch(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = (batch, *t.shape[1:]) if batch and t.dim() else tuple(t.shape)
        return torch.empty(shape, dtype=t.dtype, device="meta")

    if isinstance(example, dict):
        example = {k: rebatch(v) for k, v in example.items()}
        labels = [f"{k}={_label(tuple(v.shape), str(v.dtype))}" for k, v in example.items()
                  if isinstance(v, torch.Tensor)]
        return model, example, labels
    items = example if isinstance(example, (tuple, list)) else (example,)
    example = tuple(rebatch(v) for v in items)
    return model, example, [_label(tuple(v.shape), str(v.dtype)) for v in example
                            if isinstance(v, torch.Tensor)]


def _label(shape: tuple[int, ...], dtype: str | None) -> str:
    text = "x".join(str(v) for v in shape)
    dtype = (dtype or "").removeprefix("torch.")
    return f"{text}:{dtype}" if dtype and not dtype.startswith(("float", "bfloat")) else text


