"""The progress bar of long work: on a terminal's stderr, and nothing under --json or when
stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

WIDTH = 40


@contextmanager
def progress_bar(quiet: bool) -> Iterator[Callable[[str, float], None] | None]:
    """Yields progress(what, share done from 0 to 1), or None when quiet."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn(f"{{task.description:<{WIDTH}}}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("probing", total=1.0)
        yield lambda what, done: bar.update(task, description=what[:WIDTH], completed=done)


@contextmanager
def runs_bar(quiet: bool) -> Iterator[Callable[[dict[str, Any], int, int], None] | None]:
    """Yields progress(run record, runs done, runs in all), or None when quiet."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("runs", total=None)

        def progress(record: dict[str, Any], done: int, total: int) -> None:
            what = f"{record.get('condition', '')} #{record.get('index', '')}"
            bar.update(task, description=what, completed=done, total=total)

        yield progress
