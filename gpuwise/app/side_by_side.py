"""Independent pure work run side by side in worker processes, one a core (advise's
sizings: a serving simulation each), with its progress; in turn where there is one core or
little work. Results come back in the order of the items, as running them in turn gives."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
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
    with Workers(what, progress) as run:
        return run(fn, items)


class Workers:
    """One pool of worker processes for several lists of work in turn (advise's waves of
    sizings), started by the first list long enough to need it, so that the workers fork
    from the process as it is then (what it has computed and kept, they have)."""

    def __init__(self, what: str, progress: Progress | None = None) -> None:
        self.what, self.progress = what, progress
        self.done = 0  # items finished over every list, for the progress line
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def __call__(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        total = self.done + len(items)
        if _cores() < 2 or (self._pool is None and len(items) < FEWEST):
            out = []
            for item in items:
                _report(self.progress, self.what, self.done, total)
                out.append(fn(item))
                self.done += 1
            return out
        futures = [self._workers().submit(fn, item) for item in items]
        for _ in as_completed(futures):
            _report(self.progress, self.what, self.done, total)
            self.done += 1
        return [f.result() for f in futures]

    def stream(self, fn: Callable[[T], R], items: Iterator[T]) -> Iterator[tuple[T, R]]:
        """Each item with its result as it comes, one item a worker at a time: the next is
        taken from `items` once a worker is free, so it is chosen knowing every result
        before it (estimate/in_turn.py `Stream`)."""
        if _cores() < 2:
            for item in items:
                _report(self.progress, self.what, self.done, self.done + 1)
                yield item, fn(item)
                self.done += 1
            return
        pending: dict[Future[R], T] = {}
        ended = False
        while True:
            while not ended and len(pending) < _cores():
                try:
                    item = next(items)
                except StopIteration:
                    ended = True
                    break
                pending[self._workers().submit(fn, item)] = item
            if not pending:
                return
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                _report(self.progress, self.what, self.done, self.done + len(pending))
                self.done += 1
                yield pending.pop(f), f.result()

    def _workers(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # fork where there is one (the workers inherit the loaded catalogue, no imports
            # again)
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else None)
            self._pool = ProcessPoolExecutor(_cores(), mp_context=context)
        return self._pool


def _report(progress: Progress | None, what: str, done: int, total: int) -> None:
    if progress is not None:
        progress(f"{what} {done + 1} of {total}", done / total)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
