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
    """`app.lookup.hardware_named`, imported when a command runs (`--help` stays fast)."""
    from gpuwise.app.lookup import hardware_named as lookup

    return lookup(name)


def model_named(name: str) -> tuple[Any, Any]:
    """`app.lookup.model_named`, imported when a command runs."""
    from gpuwise.app.lookup import model_named as lookup

    return lookup(name)
