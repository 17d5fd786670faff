"""How a list of independent estimates is run: in turn here, the default. Each is a pure
function of its arguments, so an app may run them side by side (app/side_by_side.py) and
pass that in instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
MapAll = Callable[[Callable[[T], R], list[T]], list[R]]


def in_turn(fn: Callable[[T], R], items: list[T]) -> list[R]:
    return [fn(x) for x in items]
