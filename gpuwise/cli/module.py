"""`gpuwise module path.to.module:factory --input 1x3x224x224`: estimate any PyTorch module."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from gpuwise.cli.common import Json, On, app, emit
from gpuwise.errors import GpuwiseError

INT_DTYPES = {"int64": "int64", "long": "int64", "int32": "int32", "int": "int64",
              "bool": "bool", "uint8": "uint8"}  # fmt: skip
_SHAPE = re.compile(r"^\d+([x,]\d+)*$")


def parse_input(text: str) -> tuple[tuple[int, ...], str | None]:
    """'1x3x224x224' -> ((1, 3, 224, 224), None); '4x128:int64' -> ((4, 128), 'int64').
    No dtype: floating, in the module's dtype."""
    shape_text, _, dtype = text.strip().partition(":")
    if not _SHAPE.match(shape_text):
        raise GpuwiseError(f"--input {text!r} is not a shape like 1x3x224x224",
                           "dimensions joined by x, optionally :int64 for integer inputs "
                           "(token ids)")  # fmt: skip
    shape = tuple(int(v) for v in re.split("[x,]", shape_text))
    if any(v < 1 for v in shape) or any(v > 1 << 24 for v in shape):
        raise GpuwiseError(f"--input {text!r} has a dimension below 1 or above 16M",
                           "every dimension must be a sensible positive integer")  # fmt: skip
    if dtype and dtype.lower() not in INT_DTYPES:
        raise GpuwiseError(f"unknown input dtype {dtype!r}",
                           f"integer inputs take one of: {', '.join(INT_DTYPES)}; floating "
                           "inputs follow --dtype")  # fmt: skip
    return shape, INT_DTYPES[dtype.lower()] if dtype else None


def _examples(made: Any, inputs: list[str], batch: int | None) -> tuple[Any, Any, list[str]]:
    """(module, meta example inputs, their labels) from the factory's result and --input."""
    import torch

    from gpuwise.measure.runs.module_run import make_inputs

    model, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if inputs:
        specs = [parse_input(t) for t in inputs]
        if batch:
            specs = [((batch, *s[1:]), d) for s, d in specs]
        return model, make_inputs(torch, specs, None, "meta"), [_label(s, d) for s, d in specs]
    if example is None:
        raise GpuwiseError("no example inputs: pass --input SHAPE (e.g. --input 1x3x224x224)",
                           "or let the factory return (module, example_inputs)")  # fmt: skip

    def rebatch(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = (batch, *t.shape[1:]) if batch and t.dim() else tuple(t.shape)
        return torch.empty(shape, dtype=t.dtype, device="meta")

    if isinstance(example, dict):
        example = {k: rebatch(v) for k, v in example.items()}
        labels = [f"{k}={_label(tuple(v.shape), str(v.dtype))}" for k, v in example.items()
                  if isinstance(v, torch.Tensor)]  # fmt: skip
        return model, example, labels
    items = example if isinstance(example, (tuple, list)) else (example,)
    example = tuple(rebatch(v) for v in items)
    return model, example, [_label(tuple(v.shape), str(v.dtype)) for v in example
                            if isinstance(v, torch.Tensor)]  # fmt: skip


def _label(shape: tuple[int, ...], dtype: str | None) -> str:
    text = "x".join(str(v) for v in shape)
    dtype = (dtype or "").removeprefix("torch.")
    return f"{text}:{dtype}" if dtype and not dtype.startswith(("float", "bfloat")) else text


@app.command()
def module(
    factory: Annotated[str, typer.Argument(help="package.module:function returning a module "
                                                "or (module, example_inputs)")],
    input: Annotated[list[str] | None, typer.Option("--input", help="input shape, e.g. "
                     "1x3x224x224 or 4x128:int64; repeat for several inputs")] = None,
    dtype: Annotated[str | None, typer.Option(help="fp32, bf16 or fp16 (default: as built)")] = None,
    train: Annotated[bool, typer.Option("--train", help="a training step, not inference")] = False,
    batch: Annotated[int | None, typer.Option("--batch", help="replace every input's "
                                                              "first dimension")] = None,
    optimizer: Annotated[str, typer.Option(help="adamw, sgd or adafactor")] = "adamw",
    on: On = "local",
    ops: Annotated[bool, typer.Option("--ops", help="print the per-operation table")] = False,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Any PyTorch module: traced on the meta device (no memory, no weights), then memory and
    time estimated like the built-in models."""
    from gpuwise.app.from_module import from_module
    from gpuwise.measure.module.trace import load_factory
    from gpuwise.report.module_view import module_view

    if batch is not None and batch < 1:
        raise GpuwiseError(f"--batch must be a positive integer, got {batch}", "e.g. --batch 8")
    build = load_factory(factory)
    try:
        made = build()
    except Exception as exc:  # noqa: BLE001 - the user's factory failed: one line
        raise GpuwiseError(f"{factory}() failed: {type(exc).__name__}: {exc}",
                           "the factory must build the module without arguments") from None  # fmt: skip
    model, example, labels = _examples(made, input or [], batch)
    est = from_module(model, example, training=train, dtype=dtype, optimizer=optimizer, on=on,
                      name=factory.partition(":")[2])  # fmt: skip
    emit(module_view(est, labels, ops), as_json)
