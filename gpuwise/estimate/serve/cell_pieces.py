"""A llama.cpp sequence's cells as pieces (cells.py): the runs, windows and scattered cells it
took at once, in order, and the KV tiles of ggml-cpu's flash attention they fall in, scanned
a piece at a time as the sequence takes more."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, islice

from gpuwise.estimate.speed.ggml_time import FA_TILE


@dataclass
class SeqTiles:
    """A sequence's KV tiles in the order its positions first reach them, with that position;
    scanned up to its `piece`-th piece's `offset`-th cell (`scanned` cells in all)."""

    order: list[int] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    scanned: int = 0
    piece: int = 0
    offset: int = 0

    def update(self, pieces: list[Piece], held: int) -> None:
        """Its cells (`pieces`, `held` of them) from the first not yet scanned."""
        if self.scanned == held:
            return
        pos, skip = self.scanned - self.offset, self.offset  # where the piece starts
        for i in range(self.piece, len(pieces)):
            piece = pieces[i]
            for tile, k in _tiles(piece, skip):
                if tile not in self.seen:
                    self.seen.add(tile)
                    self.order.append(tile)
                    self.firsts.append(pos + k)
            pos, skip = pos + len(piece), 0
            self.piece, self.offset = i, len(piece)
        self.scanned = held


def _tiles(piece: Piece, skip: int) -> Iterator[tuple[int, int]]:
    """The KV tiles a piece's cells from its `skip`-th on fall in, in order, each with the
    index of its first such cell: a run (or every n-th cell) a tile at a time, others a
    cell at a time."""
    if isinstance(piece, range) and 0 < piece.step < FA_TILE:
        if skip >= len(piece):
            return
        start, step = piece.start, piece.step
        first, last = piece[skip] // FA_TILE, piece[-1] // FA_TILE
        for tile in range(first, last + 1):
            yield tile, max(skip, -(-(tile * FA_TILE - start) // step))
        return
    for k, cell in enumerate(islice(piece, skip, None), skip):
        yield cell // FA_TILE, k


def as_range(cells: Sequence[int]) -> Sequence[int]:
    """`cells` as a range where they form one (a run, or every n-th cell), else as they are."""
    if len(cells) < 2:
        return range(cells[0], cells[0] + 1) if cells else range(0)
    step = cells[1] - cells[0]
    if step <= 0:
        return cells
    as_range = range(cells[0], cells[-1] + 1, step)
    return as_range if len(as_range) == len(cells) and list(as_range) == cells else cells


@dataclass(frozen=True)
class Window:
    """Cells a sequence took as every free cell of a span: the span's start and its mask
    then (1 where a cell was free, so now this sequence's)."""

    start: int
    mask: bytes
    count: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return compress(range(self.start, self.start + len(self.mask)), self.mask)


Piece = Sequence[int] | Window  # cells a sequence took at once (SharedCells._own)


FREE = b"\x01" + bytes(255)  # bytes.translate: 1 where a cell is free (label 0), else 0


def nth_free(own: bytearray, start: int, end: int, need: int) -> int:
    """The cell past the `need`-th free one of `own[start:end]` (which holds that many)."""
    return _past_nth(own, start, end, need, free=True)


def nth_taken(own: bytearray, start: int, end: int, need: int) -> int:
    """The `need`-th cell of `own[start:end]` in use (which holds that many)."""
    return _past_nth(own, start, end, need, free=False) - 1


def _past_nth(own: bytes | bytearray, lo: int, hi: int, need: int, free: bool) -> int:
    """The cell past the `need`-th free (or taken) one of `own[lo:hi]`: the span halved
    while long, counting in C the half it keeps, then walked."""
    while hi - lo > 16:
        if need >= hi - lo:
            return hi  # every cell left is one (the span holds `need`)
        mid = (lo + hi) >> 1
        have = own.count(0, lo, mid) if free else (mid - lo) - own.count(0, lo, mid)
        if have >= need:
            hi = mid
        else:
            lo, need = mid, need - have
    if free:
        for _ in range(need):
            lo = own.find(0, lo, hi) + 1
        return lo
    for cell in range(lo, hi):
        need -= own[cell] != 0
        if not need:
            return cell + 1
    raise AssertionError("fewer cells in use than counted")


def cyclic(cells: bytes | bytearray, labels: Sequence[int]) -> bytes:
    """`cells` with their free ones labelled in turn, the i-th labels[i % n] (n <= 255): in C,
    a span of 255 free cells at a time."""
    names, out, base, pos = bytes(labels), [], 0, 0
    if cells.count(0) < 256:
        return _cyclic(cells, names, 0)[0]
    while cells.count(0, pos) > 255:
        cut = _past_nth(cells, pos, len(cells), 255, free=True)
        chunk, base = _cyclic(cells[pos:cut], names, base)
        out.append(chunk)
        pos = cut
    out.append(_cyclic(cells[pos:], names, base)[0])
    return b"".join(out)


def _cyclic(cells: bytes | bytearray, names: bytes, base: int) -> tuple[bytes, int]:
    """`cells` (255 or fewer free) labelled from names[base] on; and where the next begins.
    The free cells so far at each cell are its free mask times 1 + 256 + 256^2 ... (bytes
    that never carry), that is (mask x (256^size - 1)) / 255; the count c labels a free cell
    names[(base + c - 1) % n], in C by bytes.translate."""
    n, size = len(names), len(cells)
    if not size:
        return b"", base
    free = int.from_bytes(cells.translate(FREE), "little")
    counts = ((((free << (8 * size)) - free) // 255) & ((1 << (8 * size)) - 1)).to_bytes(
        size, "little")
    turn = (base - 1) % n
    table = ((names[turn:] + names[:turn]) * (256 // n + 1))[:256]
    mine = int.from_bytes(counts.translate(table), "little") & free * 255
    return (int.from_bytes(cells, "little") | mine).to_bytes(size, "little"), (base + counts[-1]) % n
