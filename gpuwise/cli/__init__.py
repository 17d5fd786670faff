"""The `gpuwise` command: parse arguments, call one layer, render. Nothing else.

Each command group lives in its own module and registers itself on `common.app`;
importing a module here is what puts its commands on the command line.
"""

from __future__ import annotations

import copy
import os
import re
import sys

import typer
from typer.main import get_command_name

try:  # recent typer vendors its own click; its exceptions are the ones raised
    from typer._click import exceptions as click_errors  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - typer releases that use click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from gpuwise.cli import (
    claims,  # noqa: F401  (registers its commands)
    cost,  # noqa: F401  (registers its commands)
    estimates,  # noqa: F401  (registers its commands)
    module,  # noqa: F401  (registers its commands)
    plan,  # noqa: F401  (registers its commands)
    repro,  # noqa: F401  (registers its commands)
    serve,  # noqa: F401  (registers its commands)
    watch,  # noqa: F401  (registers its commands)
)
from gpuwise.cli.common import app
from gpuwise.errors import GpuwiseError, did_you_mean
from gpuwise.files import shown

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line on stderr and exit code 2, never a traceback."""
    _ignore_tiny_columns()
    args = _json_after_command(sys.argv[1:] if argv is None else argv)
    try:
        _with_only_named(args)(args=args, standalone_mode=False)
    except GpuwiseError as exc:
        _fail(exc.message, exc.hint)
    except click_errors.UsageError as exc:
        _fail(*_usage_error(exc))
    except click_errors.Abort:
        _fail("aborted", "")
    except RuntimeError as exc:  # a real run that could not run (no torch, child failed)
        _fail(str(exc).splitlines()[0] if str(exc) else "run failed", "see the message above")


# click and typer each add "Did you mean ...?" to a mistyped command: said once, in the hint.
_SUGGESTION = re.compile(r"\s*\(?Did you mean[^?]*\?\)?")


def _usage_error(exc: click_errors.UsageError) -> tuple[str, str]:
    """The message without suggestions, and a hint: the suggestions (once each) and --help."""
    message = _SUGGESTION.sub("", exc.format_message()).strip()
    see = f"see `{exc.ctx.command_path if exc.ctx else 'gpuwise'} --help`"
    names = list(getattr(exc, "possibilities", None) or ())
    typo = re.match(r"No such command '(.*)'", message)
    if not names and typo and exc.ctx is not None and hasattr(exc.ctx.command, "list_commands"):
        names = did_you_mean(typo.group(1), exc.ctx.command.list_commands(exc.ctx))
    if not names:
        return message, see
    return message, f"did you mean {' or '.join(repr(n) for n in dict.fromkeys(names))}? ({see})"


def _with_only_named(args: list[str]) -> typer.Typer:
    """The app with only the command that `args` name outright: typer builds the click
    command of every command it holds (reading each one's options), tens of milliseconds
    at each run, of which a run uses one. Anything else (no command, an option first, a
    command group, a name that is no command) gets the whole app, so the listing, the
    errors and their suggestions are as they were."""
    if not args or args[0].startswith("-"):
        return app
    named = [c for c in app.registered_commands
             if (c.name or get_command_name(getattr(c.callback, "__name__", ""))) == args[0]]
    if len(named) != 1:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = named, []
    return only


def _ignore_tiny_columns() -> None:
    """COLUMNS below 20 (0, say) would make rich print nothing: read it as unset."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.isdigit() and int(columns) >= 20):
        del os.environ["COLUMNS"]


def _json_after_command(args: list[str]) -> list[str]:
    """`gpuwise --json infer ...` means `gpuwise infer --json ...`: the root's --json would
    otherwise apply only to the command-less main job and be dropped."""
    if len(args) > 1 and args[0] == "--json" and not args[1].startswith("-"):
        return [args[1], "--json", *args[2:]]
    return args


def _fail(message: str, hint: str) -> None:
    sys.stderr.write(f"error: {shown(message, 300)}\n")  # megabytes are not echoed back
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    raise SystemExit(2)


if __name__ == "__main__":
    main()
