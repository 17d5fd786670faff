"""`gpuwise watch -- cmd ...`: run a training job, watch it, say where time and energy went."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuwise.cli.common import Json, app, emit
from gpuwise.errors import GpuwiseError

RUN_AFTER_DASHES = {"allow_interspersed_args": False, "ignore_unknown_options": True}


@app.command(context_settings=RUN_AFTER_DASHES)
def watch(
    command: Annotated[list[str] | None, typer.Argument(
        help="the command to run, after --; with --report: the log files", show_default=False)] = None,
    report: Annotated[bool, typer.Option("--report", help="re-render the report of logs "
                                         "given as COMMAND")] = False,  # fmt: skip
    no_inject: Annotated[bool, typer.Option(
        "--no-inject", help="do not time the PyTorch loop from inside")] = False,
    no_sync: Annotated[bool, typer.Option(
        "--no-sync", help="no CUDA synchronisation at backward/optimizer ends")] = False,
    log: Annotated[str | None, typer.Option(help="the JSON lines log to write (default: "
                                            "gpuwise-watch-DATE-TIME.jsonl here)")] = None,  # fmt: skip
    interval: Annotated[float, typer.Option(help="seconds between sensor samples, 0.05 to "
                                            "10")] = 0.2,  # fmt: skip
    as_json: Json = False,
) -> None:  # fmt: skip
    """Run a command and measure it: data wait, compute, launch overhead, memory, energy."""
    from gpuwise.app.watch import judge_logs
    from gpuwise.report.watch_view import watch_view

    if report:  # the logs are files, not a command: --json may follow them
        logs = [c for c in command or [] if c != "--json"]
        if not logs:
            raise GpuwiseError("--report needs a log file", "gpuwise watch --report run.jsonl")
        emit(watch_view(judge_logs(logs)), as_json or len(logs) < len(command or []))
        return
    if not 0.05 <= interval <= 10:
        raise GpuwiseError(f"--interval {interval} is out of range", "use 0.05 to 10 seconds")
    path = Path(log or f"gpuwise-watch-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    live = not as_json and sys.stderr.isatty()
    code = _run(command or [], path, {"interval_s": interval, "inject": not no_inject,
                                  "sync": not no_sync}, live)  # fmt: skip
    try:
        record, renderable = watch_view(judge_logs([str(path)]))
        if as_json:  # the command owns stdout: the report is its last line
            sys.stdout.write(json.dumps(record, default=str) + "\n")
        else:
            from rich.console import Console

            Console(stderr=True).print(renderable)
    except Exception as exc:  # the job's result matters more than our report
        sys.stderr.write(f"gpuwise watch: no report ({exc!r}); the log is {path}\n")
    sys.stdout.flush()
    exit_like(code)


def _run(cmd: list[str], path: Path, options: dict[str, Any], live: bool) -> int:
    from gpuwise.app.watch import run_job

    if not live:
        return run_job(cmd, path, options)
    from gpuwise.report.watch_live import LiveLine

    line = LiveLine(sys.stderr)
    line.start()
    try:
        return run_job(cmd, path, options, line.update)
    finally:
        line.stop()


def exit_like(code: int) -> None:
    """Leave this process the way the command left: same exit code, or the same signal."""
    if code >= 0:
        raise SystemExit(code)
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    raise SystemExit(128 - code)  # if the signal did not end us (it is blocked, say)
