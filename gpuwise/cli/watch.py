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

from gpuwise.cli.common import Html, Json, app, emit, html_output, write_html, wrote
from gpuwise.errors import GpuwiseError

RUN_AFTER_DASHES = {"allow_interspersed_args": False, "ignore_unknown_options": True}


@app.command(context_settings=RUN_AFTER_DASHES)
def watch(
    command: Annotated[list[str] | None, typer.Argument(
        help="the command to run, after --; with --report: the log files", show_default=False)] = None,
    report: Annotated[bool, typer.Option("--report", help="re-render the report of logs "
                                         "given as COMMAND")] = False,
    no_inject: Annotated[bool, typer.Option(
        "--no-inject", help="do not time the PyTorch loop from inside")] = False,
    no_sync: Annotated[bool, typer.Option(
        "--no-sync", help="no CUDA synchronisation at backward/optimizer ends")] = False,
    log: Annotated[str | None, typer.Option(help="the JSON lines log to write (default: "
                                            "gpuwise-watch-DATE-TIME.jsonl here)")] = None,
    interval: Annotated[float, typer.Option(help="seconds between sensor samples, 0.05 to "
                                            "10")] = 0.2,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", metavar="[HOST:]PORT", help="serve the job's metrics there for "
        "Prometheus while it runs (PORT alone: every interface; needs the [prometheus] "
        "extra; docs/watch.md)", show_default=False)] = None,
    job_name: Annotated[str | None, typer.Option(
        "--job-name", help="the job label of the metrics --prometheus serves (default: "
        "$SLURM_JOB_NAME, else the script's name)", show_default=False)] = None,
    as_json: Json = False, html: Html = None,
) -> None:
    """Run a command and measure it: data wait, compute, launch overhead, memory, energy."""
    from gpuwise.app.watch import judge_logs, open_exporter
    from gpuwise.report.watch_view import watch_view

    if report and prometheus is not None:
        raise GpuwiseError("--prometheus serves a running job's metrics, not a log's",
                           "gpuwise watch --prometheus 9400 -- python train.py")
    if report:  # the logs are files, not a command: --json and --html may follow them
        logs, trailing_json, trailing_html = _report_args(command or [])
        if not logs:
            raise GpuwiseError("--report needs a log file", "gpuwise watch --report run.jsonl")
        html = html_output(trailing_html or html)
        answer = judge_logs(logs)
        emit(watch_view(answer), as_json or trailing_json)
        write_html(html, lambda pages: pages.watch_page(answer))
        return
    html = html_output(html)
    if not 0.05 <= interval <= 10:
        raise GpuwiseError(f"--interval {interval} is out of range", "use 0.05 to 10 seconds")
    if job_name is not None and prometheus is None:
        raise GpuwiseError("--job-name labels the metrics of --prometheus, which is not given",
                           "gpuwise watch --prometheus 9400 --job-name NAME -- ...")
    path = Path(log or f"gpuwise-watch-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    live = not as_json and sys.stderr.isatty()
    options = {"interval_s": interval, "inject": not no_inject, "sync": not no_sync}
    if not command:
        raise GpuwiseError("no command to watch", "gpuwise watch -- python train.py ...")
    # bound before anything else happens: a port in use stops here, the job not started
    exporter = open_exporter(prometheus) if prometheus is not None else None
    try:
        code = _run(command, path, options, live, exporter, job_name)
    finally:
        if exporter is not None:
            exporter.close()
    try:
        answer = judge_logs([str(path)])
        record, renderable = watch_view(answer)
        if as_json:  # the command owns stdout: the report is its last line
            sys.stdout.write(json.dumps(record, default=str) + "\n")
            wrote(path, "the watch log; re-render: gpuwise watch --report LOG")
        else:
            from rich.console import Console

            Console(stderr=True).print(renderable)
        write_html(html, lambda pages: pages.watch_page(answer))
    except Exception as exc:  # the job's result matters more than our report
        sys.stderr.write(f"gpuwise watch: no report ({exc!r}); the log is {path}\n")
    sys.stdout.flush()
    exit_like(code)


def _report_args(args: list[str]) -> tuple[list[str], bool, Path | None]:
    """`--report LOG... [--json] [--html FILE]`: the logs, --json, and the --html file."""
    logs: list[str] = []
    as_json, html = False, None
    rest = iter(args)
    for arg in rest:
        if arg == "--json":
            as_json = True
        elif arg == "--html":
            value = next(rest, None)
            if value is None:
                raise GpuwiseError("--html needs a file name", "--html report.html")
            html = Path(value)
        elif arg.startswith("--html="):
            html = Path(arg.removeprefix("--html="))
        else:
            logs.append(arg)
    return logs, as_json, html


def _run(cmd: list[str], path: Path, options: dict[str, Any], live: bool, exporter: Any,
         job_name: str | None) -> int:
    from gpuwise.app.watch import run_job

    if not live:
        return run_job(cmd, path, options, None, exporter, job_name, _serving)
    from gpuwise.report.watch_live import LiveLine

    line = LiveLine(sys.stderr)
    line.start()
    try:
        return run_job(cmd, path, options, line.update, exporter, job_name, _serving)
    finally:
        line.stop()


def _serving(url: str) -> None:
    sys.stderr.write(f"gpuwise watch: metrics for Prometheus at {url}\n")
    sys.stderr.flush()


def exit_like(code: int) -> None:
    """Leave this process the way the command left: same exit code, or the same signal."""
    if code >= 0:
        raise SystemExit(code)
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    raise SystemExit(128 - code)  # if the signal did not end us (it is blocked, say)
