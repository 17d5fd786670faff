"""The public path for validation scripts: a `gpuwise` command run as a user types it, in this
process (no start-up cost a case), its `--json` answer parsed. Validations produce their
estimates through this (or the public Python API `gpuwise.*`), never by calling the fitters or
private functions, so what they check is what users run (issue 37)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from gpuwise.cli import main


class CommandFailed(RuntimeError):
    """A command that exited non-zero: its arguments, exit code and what it said on stderr."""


def run_gpuwise(args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `gpuwise ARGS`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def gpuwise_json(*args: str) -> Any:
    """The parsed `--json` answer of `gpuwise ARGS --json`; CommandFailed where it exits non-zero."""
    code, out, err = run_gpuwise([*args, "--json"])
    if code != 0:
        raise CommandFailed(f"gpuwise {' '.join(args)} --json: exit {code}: {err.strip()[-400:]}")
    return json.loads(out)
