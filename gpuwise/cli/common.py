"""What every command shares: the typer app, the option vocabulary, output and name lookups.

One idea has one option name, default and unit on every command (docs: README "Use").
Options renamed for that keep their old names for one release, unlisted: `RENAMED`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

# Old option name -> its name now. The old one is still accepted by every command that has the
# new one (with a note when stderr is a terminal: scripts' output and errors stay as they were);
# `--help` and shell completion show only the new one.
RENAMED = {
    "--output": "--new-tokens",  # advise, cost: generated tokens per request, as infer says
    "--utilisation": "--target-utilization",  # advise, cost: a replica's planned busy share
    "--measured-util": "--measured-utilization",  # advise, cost: the share watch measured
    "--devices": "--cuda-visible-devices",  # repro: not a count, the devices' ids
}

# Defaults of the ideas several commands share (check, infer, advise, cost); the same as
# InferencePlan's, which the main job uses.
PROMPT_TOKENS = 512
NEW_TOKENS = 128


def renamed_options(command: Any, args: list[str]) -> list[str]:
    """`args` with old option names (`RENAMED`) given their new names, where `command`
    has the new one; arguments after `--` (a command to run) are left alone."""
    known = {name for p in command.params for name in getattr(p, "opts", ())}
    out = list(args)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        old, eq, value = arg.partition("=")
        new = RENAMED.get(old)
        if new is None or new not in known:
            continue
        out[i] = new + eq + value
        if sys.stderr.isatty():
            sys.stderr.write(f"note: {old} is now {new}; the old name goes in a later release\n")
    return out


def _plain_help(text: str) -> str:
    # typer escapes '[' for rich markup even with markup off (`\[default: 1]`): undo it.
    return text.replace("\\[", "[")


def restore_argument_help(command: Any) -> None:
    """Give arguments back their help: click 8.3+ sets `Argument.help` itself, after typer
    (up to 0.20) set it, so an argument's description never reaches `--help`."""
    if command.callback is None:
        return
    from typer.utils import get_params_from_function

    declared = get_params_from_function(command.callback)
    for param in command.params:
        if param.param_type_name == "argument" and not getattr(param, "help", None):
            info = declared.get(param.name)
            param.help = getattr(info.default, "help", None) if info else None


class Command(TyperCommand):
    """A command that accepts its options' old names and prints plain help."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, renamed_options(self, args))

    def get_help(self, ctx: Any) -> str:
        restore_argument_help(self)
        return _plain_help(super().get_help(ctx))

    def format_arguments(self, ctx: Any, formatter: Any) -> None:
        """Nothing: typer lists the arguments with the options (click 8.5 would again)."""


class Group(TyperGroup):
    """A command group whose help is plain text too."""

    def get_help(self, ctx: Any) -> str:
        return _plain_help(super().get_help(ctx))


class App(typer.Typer):
    """typer.Typer whose commands are `Command`s."""

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **kwargs: Any) -> Callable[[Any], Any]:
        return super().command(name, cls=cls or Command, **kwargs)


app = App(cls=Group, no_args_is_help=False, rich_markup_mode=None,
          pretty_exceptions_enable=False, invoke_without_command=True,
          help="The truth about GPUs for machine learning: will it run, how fast, rent or buy, "
               "am I using it well.")

Model = Annotated[str, typer.Argument(
    help="catalogue id or alias (`gpuwise models`), a config.json, a model folder, a .gguf or "
         ".safetensors checkpoint, or a Hugging Face hub id", show_default=False)]
On = Annotated[str, typer.Option("--on", help="catalogue device id or alias (`gpuwise "
                                 "hardware`), or 'local': this machine")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object")]
Batch = Annotated[int, typer.Option("--batch", help="sequences per batch")]
Prompt = Annotated[int, typer.Option("--prompt", help="prompt tokens per request")]
NewTokens = Annotated[int, typer.Option("--new-tokens", help="tokens generated per request")]
Attention = Annotated[str, typer.Option("--attention", help="attention kernel: eager, sdpa or "
                                        "flash")]
Ops = Annotated[bool, typer.Option("--ops", help="print the per-operation roofline table")]
Seq = Annotated[int, typer.Option("--seq", help="tokens per training sequence")]
Dtype = Annotated[str | None, typer.Option(
    "--dtype", help="training precision: fp32, bf16, fp16, mixed-bf16 or mixed-fp16 (default: "
    "mixed-bf16, or mixed-fp16 on a device without bf16 matrix units: a T4, a V100)",
    show_default=False)]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adamw, adamw_fused (torch fused=True), "
                                        "sgd, adafactor, adamw8bit or paged_adamw8bit "
                                        "(bitsandbytes)")]
Checkpointing = Annotated[bool, typer.Option(
    "--checkpointing", help="activation checkpointing: keep layer inputs only, recompute the "
    "rest in backward")]


Html = Annotated[Path | None, typer.Option(
    "--html", metavar="FILE", show_default=False, dir_okay=False,
    help="also write a self-contained HTML report with plots to FILE (opens offline; needs "
         "pip install 'gpuwise[html]'); replaces only gpuwise's own reports")]


def html_output(path: Path | None) -> Path | None:
    """The --html file, checked before any work: plotly is installed and the file is new,
    empty or a gpuwise report (never a user's file). Imports no plotting code."""
    if path is None:
        return None
    import importlib.util

    from gpuwise.errors import GpuwiseError
    from gpuwise.report.html.output import check_output

    if importlib.util.find_spec("plotly") is None:
        raise GpuwiseError("--html needs plotly, which is not installed",
                           "pip install 'gpuwise[html]'")
    return check_output(path)


def write_html(path: Path | None, build: Callable[[Any], Any]) -> None:
    """Write the HTML report `build(gpuwise.report.html.pages)` makes to `path` (nothing
    without --html: the pages and their figures are imported only here), and name it on
    stderr (stdout may be --json)."""
    if path is None:
        return
    from dataclasses import replace
    from importlib.metadata import version

    from gpuwise.report.html import pages
    from gpuwise.report.html.output import write_page

    page = build(pages)
    stamp = f"gpuwise {version('gpuwise')}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    size = write_page(path, replace(page, subtitle=f"{page.subtitle} {stamp}".strip()))
    wrote(path, f"HTML report, {size / 2**20:.1f} MiB")


def wrote(path: Path, what: str) -> None:
    """Name a file a command wrote, on stderr: the terminal sees it, --json stays parseable."""
    sys.stderr.write(f"wrote {path} ({what})\n")
    sys.stderr.flush()


def roofs(hw: Any) -> Any:
    """`app.roofs.roofs_for`, imported when a report needs it."""
    from gpuwise.app.roofs import roofs_for

    return roofs_for(hw)


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
