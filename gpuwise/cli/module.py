"""`gpuwise module path.to.module:factory --input 1x3x224x224`: estimate any PyTorch module."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuwise.cli.common import Html, Json, On, Ops, app, emit, html_output, roofs, write_html
from gpuwise.errors import GpuwiseError


@app.command()
def module(
    factory: Annotated[str, typer.Argument(help="package.module:function returning a module "
                                                "or (module, example_inputs)", show_default=False)],
    input: Annotated[list[str] | None, typer.Option("--input", help="input shape, e.g. "
                     "1x3x224x224 or 4x128:int64; repeat for several inputs (default: the "
                     "example inputs the factory returns)")] = None,
    dtype: Annotated[str | None, typer.Option(help="precision: fp32, bf16 or fp16 (default: "
                                              "as built)")] = None,
    train: Annotated[bool, typer.Option("--train", help="a training step, not inference")] = False,
    batch: Annotated[int | None, typer.Option("--batch", help="replace every input's first "
                                              "dimension (default: the inputs' own)")] = None,
    optimizer: Annotated[str, typer.Option(help="adamw, sgd or adafactor (with --train)")] = "adamw",
    on: On = "local",
    ops: Ops = False,
    as_json: Json = False,
    html: Html = None,
) -> None:
    """Any PyTorch module: traced on the meta device (no memory, no weights), then memory and
    time estimated like the built-in models."""
    from gpuwise.app.module import module_from_factory
    from gpuwise.report.module_view import module_view

    html = html_output(html)
    if batch is not None and batch < 1:
        raise GpuwiseError(f"--batch must be a positive integer, got {batch}", "e.g. --batch 8")
    est, labels = module_from_factory(factory, input or [], batch, training=train, dtype=dtype,
                                      optimizer=optimizer, on=on)
    emit(module_view(est, labels, ops), as_json)
    write_html(html, lambda pages: pages.module_page(est, labels, roofs(est.hardware)))
