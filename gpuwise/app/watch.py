"""`gpuwise watch`: run a training job under the sampler (or read the logs of one), then
summarise it and give the verdict with its evidence (docs/watch.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwise.estimate.watch.log_records import WatchLog
from gpuwise.estimate.watch.summary import WatchSummary, summarize
from gpuwise.estimate.watch.verdict import Verdict, verdict
from gpuwise.measure.watch.exporter import SERVED_ENV, MetricsServer, default_job_name, serve
from gpuwise.measure.watch.log import LogTail, read_log
from gpuwise.measure.watch.runner import run_watched

# on_records(records new in the log, the latest sample or None): for a live view
OnRecords = Callable[[list[dict[str, Any]], dict[str, Any] | None], None]


@dataclass(frozen=True)
class WatchAnswer:
    summary: WatchSummary
    verdict: Verdict
    meta: dict[str, Any]  # the log(s), the command, its exit code, what was unavailable
    log: WatchLog | None = None  # the records judged: the HTML report's timeline


def judge_logs(paths: list[str]) -> WatchAnswer:
    """Read the logs (one per rank), summarise, judge."""
    log = read_log(paths)
    summary = summarize(log)
    meta = {"log": ", ".join(paths), "cmd": log.header.get("cmd"), "gpus": log.header.get("gpus"),
            "exit_code": (log.end or {}).get("exit_code"), "unavailable": log.unavailable,
            "notes": list(log.notes)}
    return WatchAnswer(summary, verdict(summary), meta, log)


def open_exporter(spec: str) -> MetricsServer:
    """The metrics server of `--prometheus [HOST:]PORT`, bound (not yet serving a log): open
    it before the job starts, so that a port in use stops everything with one error."""
    return serve(spec)


def run_job(cmd: list[str], path: Path, options: dict[str, Any],
            on_records: OnRecords | None = None, exporter: MetricsServer | None = None,
            job_name: str | None = None,
            on_serving: Callable[[str], None] | None = None) -> int:
    """Run the job to completion, logging to `path`; its exit code. With `exporter`, its
    metrics are served there from the log (labelled `job_name`) while it runs;
    `on_serving(url)` is told once the job has started and the metrics are served."""
    extra: dict[str, Any] = {}
    if exporter is not None:
        name = job_name or default_job_name(cmd)

        def serving() -> None:
            exporter.attach(path, name)
            if on_serving is not None:
                on_serving(exporter.url)

        extra["env"] = {SERVED_ENV: exporter.url}
        extra["on_start"] = serving
    if on_records is None:
        return run_watched(cmd, path, **options, **extra).exit_code
    tail = LogTail(path)
    return run_watched(cmd, path, **options, **extra,
                       tick=lambda s: on_records(tail.read_new(), s.latest)).exit_code
