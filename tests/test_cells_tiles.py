"""A sequence's KV tiles (estimate/serve/cells.py `_SeqTiles`), scanned a piece at a time as
cells arrive, are those of walking every cell from the first: the tiles in the order its
positions reach them, each with the first position in it."""

from __future__ import annotations

import random

from gpuwise.estimate.serve.cells import FA_TILE, _SeqTiles, _Window


def _reference(cells: list[int]) -> tuple[list[int], list[int]]:
    order, firsts, seen = [], [], set()
    for pos, cell in enumerate(cells):
        if cell // FA_TILE not in seen:
            seen.add(cell // FA_TILE)
            order.append(cell // FA_TILE)
            firsts.append(pos)
    return order, firsts


def _piece(rng: random.Random, at: int) -> range | _Window | list[int]:
    kind = rng.randrange(4)
    n = rng.randrange(1, 300)
    if kind == 0:
        return range(at, at + n)
    if kind == 1:
        return range(at, at + n * (step := rng.choice((2, 3, 7, 64, 100))), step)
    if kind == 2:
        mask = bytes(rng.random() < 0.6 for _ in range(n)) + b"\x01"
        return _Window(at, mask, mask.count(1))
    return sorted(rng.sample(range(at, at + 4 * n), n))


def test_tiles_scanned_a_piece_at_a_time_are_those_of_every_cell() -> None:
    rng = random.Random(7)
    for _ in range(200):
        tiles, pieces, cells = _SeqTiles(), [], []
        for _ in range(rng.randrange(1, 12)):
            piece = _piece(rng, rng.randrange(0, 20_000))
            pieces.append(piece)
            cells += list(piece)
            if rng.random() < 0.7:
                tiles.update(pieces, len(cells))
                assert (tiles.order, tiles.firsts) == _reference(cells)
        tiles.update(pieces, len(cells))
        assert (tiles.order, tiles.firsts) == _reference(cells)
