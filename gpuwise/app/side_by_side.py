"""Independent pure work run side by side in worker processes, one a core (advise's
sizings: a serving simulation each), with its progress; in turn where there is one core or
little work. Results come back in the order of the items, as running them in turn gives."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
Progress = Callable[[str, float], None]
FEWEST = 4  # fewer items than this run in turn: starting the workers would take longer


def side_by_side(fn: Callable[[T], R], items: list[T], what: str,
                 progress: Progress | None = None) -> list[R]:
    """[fn(x) for x in items], on every core this process may use. `fn` and the items
    must pickle (a module-level function, frozen dataclasses); `what` names the items
    in the progress line."""
    workers = min(len(items), _cores())
    if workers < 2 or len(items) < FEWEST:
        out = []
        for i, item in enumerate(items):
            _report(progress, what, i, len(items))
            out.append(fn(item))
        return out
    # fork where there is one (the workers inherit the loaded catalogue, no imports again)
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(fn, item) for item in items]
        for done, _ in enumerate(as_completed(futures)):
            _report(progress, what, done, len(items))
        return [f.result() for f in futures]


def _report(progress: Progress | None, what: str, done: int, total: int) -> None:
    if progress is not None:
        progress(f"{what} {done + 1} of {total}", done / total)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
