"""What every command shares: the typer app, option types, output and name lookups."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False, invoke_without_command=True,
                  help="The truth about GPUs for machine learning: will it run, how fast.")  # fmt: skip

On = Annotated[str, typer.Option("--on", help="catalogue hardware name, or 'local'")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object")]
Batch = Annotated[int, typer.Option("--batch", help="sequences per batch")]
Attention = Annotated[str, typer.Option("--attention", help="eager, sdpa or flash")]


def emit(view: tuple[Any, Any], as_json: bool) -> None:
    """Print a view's JSON record or its terminal rendering."""
    obj, renderable = view
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
        return
    from rich.console import Console

    Console().print(renderable)


def hardware_named(name: str) -> Any:
    """A catalogue device by name, or this machine's best device for 'local'."""
    if name.strip().lower() in ("local", "here", "this"):
        from gpuwise.measure.hardware.detect import detect_local

        return detect_local().best_device()
    from gpuwise.catalog.hardware import find_hardware

    return find_hardware(name)


def model_named(name: str) -> tuple[Any, Any]:
    """A catalogue model (or config path) and its architecture."""
    from gpuwise.catalog.models import resolve_model
    from gpuwise.workload import from_config

    model = resolve_model(name)
    return model, from_config(model.config, model.name)
