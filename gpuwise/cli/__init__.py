"""The `gpuwise` command: parse arguments, call one layer, render. Nothing else.

Each command group lives in its own module and registers itself on `common.app`;
importing a module here is what puts its commands on the command line.
"""

from __future__ import annotations

import sys

try:  # recent typer vendors its own click; its exceptions are the ones raised
    from typer._click import exceptions as click_errors  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - typer releases that use click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from gpuwise.cli import (
    cost,  # noqa: F401  (registers its commands)
    estimates,  # noqa: F401  (registers its commands)
    module,  # noqa: F401  (registers its commands)
    repro,  # noqa: F401  (registers its commands)
    watch,  # noqa: F401  (registers its commands)
)
from gpuwise.cli.common import app
from gpuwise.errors import GpuwiseError

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line on stderr and exit code 2, never a traceback."""
    try:
        app(args=_json_after_command(sys.argv[1:] if argv is None else argv),
            standalone_mode=False)  # fmt: skip
    except GpuwiseError as exc:
        _fail(exc.message, exc.hint)
    except click_errors.NoSuchOption as exc:
        hint = f"did you mean {' or '.join(exc.possibilities)}?" if exc.possibilities else ""
        _fail(exc.format_message(), hint or "see `gpuwise --help`")
    except click_errors.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "gpuwise"
        _fail(exc.format_message(), f"see `{cmd} --help`")
    except click_errors.Abort:
        _fail("aborted", "")
    except RuntimeError as exc:  # a real run that could not run (no torch, child failed)
        _fail(str(exc).splitlines()[0] if str(exc) else "run failed", "see the message above")


def _json_after_command(args: list[str]) -> list[str]:
    """`gpuwise --json infer ...` means `gpuwise infer --json ...`: the root's --json would
    otherwise apply only to the command-less main job and be dropped."""
    if len(args) > 1 and args[0] == "--json" and not args[1].startswith("-"):
        return [args[1], "--json", *args[2:]]
    return args


def _fail(message: str, hint: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    raise SystemExit(2)


if __name__ == "__main__":
    main()
