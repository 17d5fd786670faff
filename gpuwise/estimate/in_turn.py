"""How a list of independent estimates is run: in turn here, the default. Each is a pure
function of its arguments, so an app may run them side by side (app/side_by_side.py) and
pass that in instead: all at once (`MapAll`), or as a stream whose next item is chosen once
the results before it are in (`Stream`: advise's search, which leaves out what they rule
out)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
MapAll = Callable[[Callable[[T], R], list[T]], list[R]]
Stream = Callable[[Callable[[T], R], Iterator[T]], Iterator[tuple[T, R]]]


def in_turn(fn: Callable[[T], R], items: list[T]) -> list[R]:
    return [fn(x) for x in items]


def one_by_one(fn: Callable[[T], R], items: Iterator[T]) -> Iterator[tuple[T, R]]:
    """Each item with its result, the next item asked for once the last result is taken."""
    for x in items:
        yield x, fn(x)
