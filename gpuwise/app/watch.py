"""`gpuwise watch`: run a training job under the sampler (or read the logs of one), then
summarise it and give the verdict with its evidence (docs/watch.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwise.estimate.watch.summary import WatchSummary, summarize
from gpuwise.estimate.watch.verdict import Verdict, verdict
from gpuwise.measure.watch.log import LogTail, read_log
from gpuwise.measure.watch.runner import run_watched

# on_records(records new in the log, the latest sample or None): for a live view
OnRecords = Callable[[list[dict[str, Any]], dict[str, Any] | None], None]


@dataclass(frozen=True)
class WatchAnswer:
    summary: WatchSummary
    verdict: Verdict
    meta: dict[str, Any]  # the log(s), the command, its exit code, what was unavailable


def judge_logs(paths: list[str]) -> WatchAnswer:
    """Read the logs (one per rank), summarise, judge."""
    log = read_log(paths)
    summary = summarize(log)
    meta = {"log": ", ".join(paths), "cmd": log.header.get("cmd"), "gpus": log.header.get("gpus"),
            "exit_code": (log.end or {}).get("exit_code"), "unavailable": log.unavailable,
            "notes": list(log.notes)}  # fmt: skip
    return WatchAnswer(summary, verdict(summary), meta)


def run_job(cmd: list[str], path: Path, options: dict[str, Any],
            on_records: OnRecords | None = None) -> int:  # fmt: skip
    """Run the job to completion, logging to `path`; its exit code."""
    if on_records is None:
        return run_watched(cmd, path, **options).exit_code
    tail = LogTail(path)
    return run_watched(cmd, path, **options,
                       tick=lambda s: on_records(tail.read_new(), s.latest)).exit_code  # fmt: skip
