"""A walk over heap events for the replay tests: what is held after each event."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpuwise.workload.traced import HeapEvent


def walk(events: Iterable[HeapEvent]) -> Iterator[tuple[HeapEvent, set[int], int]]:
    """Each event with the keys held and their bytes after it. A tensor given back that is
    not held raises KeyError: given back only while it is held."""
    sizes: dict[int, int] = {}
    held: set[int] = set()
    nbytes = 0
    for e in events:
        if e.nbytes:
            held.add(e.key)
            sizes[e.key] = e.nbytes
            nbytes += e.nbytes
        else:
            held.remove(e.key)
            nbytes -= sizes[e.key]
        yield e, held, nbytes


def held_at_end(events: Iterable[HeapEvent]) -> set[int]:
    last: set[int] = set()
    for _, held, _ in walk(events):
        last = held
    return set(last)


def most_held(events: Iterable[HeapEvent]) -> int:
    """The most tensors held at once."""
    return max((len(held) for _, held, _ in walk(events)), default=0)


def peak_bytes(events: Iterable[HeapEvent]) -> int:
    return max((nbytes for *_, nbytes in walk(events)), default=0)
