"""llama.cpp's unified KV cache as cells (docs/serve.md, "A step's time"): where a step's
tokens land, how far a ubatch's attention spans, and when a finished request's cells go.

- `find_slot` (src/llama-kv-cache.cpp): a ubatch's tokens take free cells one by one from the
  cache's head, wrapping at the end; it starts from the first cell instead when the head is
  more than twice the ubatch past the number of cells in use. The head moves past the last
  cell taken (`apply_ubatch`).
- `get_n_kv`: a ubatch's attention spans the cells up to the highest in use, padded to 256,
  every sequence's and the free ones between, all but its own masked out.
- tools/server/server-context.cpp: when a new request takes a slot, every idle slot's cells
  are saved to the host-memory prompt cache and cleared from the unified KV cache
  (`cache_idle_slots`, on by default with `--cache-ram`); so only the running requests' cells
  stay, and a finished request's stay until the next one starts.
- ggml-cpu's flash attention (ggml/src/ggml-cpu/ops.cpp `flash_attn_ext_tiled`, for a ubatch
  of 64 tokens or more): tiles of 64 queries by 64 cells (common.h GGML_FA_TILE_Q/KV). A tile
  where every query has every cell masked is skipped after reading its mask; any other is
  computed whole, masked cells and padded queries included. So a decoding sequence in a
  prompt's first query tile makes every tile holding its cells computed, and a prompt whose
  cells fill holes between other sequences' computes the tiles it shares with them."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, islice, repeat

from gpuwise.estimate.speed.ggml_time import FA_TILE

PAD = 256  # get_n_kv: n_kv padded to max(n_pad, 256)
UBATCH = 512  # llama-server's n_ubatch (common/common.h)


@dataclass
class Ubatch:
    """One ubatch as placed: its (sequence, first position, tokens) parts in batch order, the
    cells its attention spans, and on the tiled path (FA_TILE tokens or more) the (query, cell)
    pairs of the tiles flash attention computes and of those it skips (0, 0 otherwise)."""

    parts: list[tuple[int, int, int]]
    span: int
    computed: int = 0
    skipped: int = 0


@dataclass
class _SeqTiles:
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


@dataclass
class SharedCells:
    size: int
    tiled: bool = False  # attention on ggml-cpu's tiled path (Ubatch.computed, .skipped)
    head: int = 0
    used: int = 0
    top: int = 0  # one past the highest cell in use
    free: bytearray = field(init=False)  # 1 where a cell is free
    # a sequence's cells in the order it took them, as pieces: ranges where they form one
    owned: dict[int, list[Piece]] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # and how many
    idle: deque[int] = field(default_factory=deque)  # finished requests whose cells stay
    tiles: dict[int, _SeqTiles] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = bytearray(b"\x01") * self.size

    def start(self, seq: int) -> None:
        """A new request takes a slot, and every idle slot's cells go (`cache_idle_slots`)."""
        if seq in self.owned:
            return
        self.owned[seq], self.held[seq] = [], 0
        while self.idle:
            self.release(self.idle.popleft())

    def finish(self, seq: int) -> None:
        self.idle.append(seq)

    def release(self, seq: int) -> None:
        for piece in self.owned.pop(seq, []):
            self._set(piece, 1)
        self.tiles.pop(seq, None)
        self.used -= self.held.pop(seq, 0)
        self.top = self.free.rfind(0, 0, self.top) + 1

    def cells(self, seq: int) -> list[int]:
        """`seq`'s cells in the order it took them."""
        return list(chain.from_iterable(self.owned.get(seq, [])))

    def _own(self, seq: int, cells: Piece, mark: bool = True) -> None:
        """`seq` takes `cells` (distinct, free): marked taken (`mark`: else the caller has),
        kept as a piece."""
        if not isinstance(cells, (range, _Window)):
            cells = _as_range(cells)
        if mark:
            self._set(cells, 0)
        self.owned.setdefault(seq, []).append(cells)
        self.held[seq] = self.held.get(seq, 0) + len(cells)

    def _window(self, start: int, count: int, stop: int | None = None) -> _Window | None:
        """The first `count` free cells from `start` on (before `stop`), taken: every free
        cell up to the last of them, so marked by one slice and kept as that span's mask."""
        end = self._past_free(start, count, self.size if stop is None else stop)
        mask = bytes(self.free[start:end])
        window = _Window(start, mask, mask.count(1))
        if not window.count:
            return None
        self.free[start:end] = bytes(end - start)
        return window

    def _past_free(self, start: int, count: int, stop: int) -> int:
        """The cell past the `count`-th free cell from `start` (past the last before `stop`
        where there are fewer): free cells counted a chunk at a time in C, the last walked."""
        free, pos, need = self.free, start, count
        while pos < stop:
            end = min(stop, pos + max(64, 2 * need))
            have = free.count(1, pos, end)
            if have >= need:
                cells = compress(range(pos, end), memoryview(free)[pos:end])
                return next(islice(cells, need - 1, None)) + 1
            need, pos = need - have, end
        return free.rfind(1, start, stop) + 1 or start

    def take(self, work: list[tuple[int, int]]) -> list[Ubatch]:
        """Cells for a batch of (sequence, tokens), in ubatches of UBATCH tokens (llama_decode
        splits a batch in order: llama-batch.cpp split_simple); each ubatch as placed."""
        out: list[Ubatch] = []
        ubatch: list[tuple[int, int]] = []
        room = UBATCH
        for seq, n in work:
            while n:
                part = min(n, room)
                ubatch.append((seq, part))
                n, room = n - part, room - part
                if not room:
                    out.append(self._placed(ubatch))
                    ubatch, room = [], UBATCH
        if ubatch:
            out.append(self._placed(ubatch))
        return out

    def _placed(self, parts: list[tuple[int, int]]) -> Ubatch:
        starts = [self.held.get(seq, 0) for seq, _ in parts]
        self._ubatch(parts)
        rows = [(seq, start, n) for (seq, n), start in zip(parts, starts, strict=True)]
        ub = Ubatch(rows, self.span())
        if self.tiled and sum(n for _, n in parts) >= FA_TILE:
            ub.computed, ub.skipped = self._flash(rows, ub.span // FA_TILE)
        return ub

    def _flash(self, rows: list[tuple[int, int, int]], kv_tiles: int) -> tuple[int, int]:
        """(computed, skipped) (query, cell) pairs of a ubatch's tiled flash attention: each
        tile of FA_TILE queries computes the KV tiles holding a cell any of its queries sees (a
        sequence's own up to the query's position), and reads the mask of the others."""
        bounds, row = [], 0
        for seq, start, n in rows:
            bounds.append((row, row + n, seq, start))
            row += n
        computed = skipped = 0
        for q0 in range(0, row, FA_TILE):
            q1 = min(row, q0 + FA_TILE)
            seen = []
            for r0, r1, seq, start in bounds:
                if r0 < q1 and r1 > q0:
                    tiles = self.tiles.setdefault(seq, _SeqTiles())
                    tiles.update(self.owned.get(seq, []), self.held.get(seq, 0))
                    seen.append((tiles.order, bisect_right(tiles.firsts, start + min(q1, r1) - 1 - r0)))
            k = seen[0][1] if len(seen) == 1 else len(set().union(*(o[:n] for o, n in seen)))
            computed += FA_TILE * FA_TILE * k
            skipped += (q1 - q0) * FA_TILE * (kv_tiles - k)
        return computed, skipped

    def take_run(self, seqs: list[int], steps: int) -> None:
        """Cells for `steps` decode steps of one token of each of `seqs`: as many ubatches,
        placed a run of free cells at a time (`_steps`) where the rules allow, one ubatch at
        a time where a step starts from the first cell."""
        n, one = len(seqs), [(seq, 1) for seq in seqs]
        while steps > 0 and n:
            below = self.head > self.used + 2 * n and self.free.find(1, 0, self.head) >= 0
            placed = 0 if below else self._steps(seqs, steps)
            if not placed:
                self._ubatch(one)
            steps -= placed or 1

    def _steps(self, seqs: list[int], steps: int) -> int:
        """Whole decode steps from the head, as one ubatch a step would place them: a step
        takes the next n = len(seqs) free cells, so the steps take the next free cells in
        order, the i-th to seqs[i % n]. A step starts from the first cell instead once the
        head leads the cells in use by over 2n; the lead after the j-th step (the cell past
        its last less the cells then in use) never falls as j grows, so the steps stop after
        the first that leaves it over 2n, and at the cache's end (a step cut short there is
        left to _ubatch); returns the steps placed."""
        n, head = len(seqs), self.head
        if self._free(head, head + steps * n):  # free from the head on: the lead stays
            cells: Sequence[int] = range(head, head + (1 if head - self.used > 2 * n
                                                       else steps) * n)
        else:
            found = self._next_free(head, steps * n)
            steps = len(found) // n
            used = self.used
            first = bisect_right(range(1, steps + 1), 2 * n,  # the lead never falls
                                 key=lambda j: found[j * n - 1] + 1 - (used + j * n))
            steps = min(steps, first + 1)
            cells = found[:steps * n]
            if cells:  # every free cell up to the last is taken: one slice
                self.free[head:cells[-1] + 1] = bytes(cells[-1] + 1 - head)
                for i, seq in enumerate(seqs):
                    self._own(seq, cells[i::n], mark=False)
                return self._stepped(cells, n)
        if not cells:
            return 0
        for i, seq in enumerate(seqs):
            self._own(seq, cells[i::n])
        return self._stepped(cells, n)

    def _stepped(self, cells: Sequence[int], n: int) -> int:
        self.used += len(cells)
        self.top = max(self.top, cells[-1] + 1)
        self.head = (cells[-1] + 1) % self.size
        return len(cells) // n

    def _next_free(self, start: int, count: int, stop: int | None = None) -> list[int]:
        """Up to `count` free cells from `start` on, in order, before `stop` (the end)."""
        stop = self.size if stop is None else stop
        return list(islice(compress(range(start, stop), memoryview(self.free)[start:stop]), count))

    def _set(self, cells: Piece, free: int) -> None:
        """Mark `cells` free (1) or taken (0): a slice where they are a range or a window
        (freed: the window's mask OR'd into the span), else each."""
        if isinstance(cells, range):
            self.free[cells.start:cells.stop:cells.step] = bytes([free]) * len(cells)
        elif isinstance(cells, _Window):
            assert free, "a window is taken as it is made"
            start, end = cells.start, cells.start + len(cells.mask)
            now = int.from_bytes(self.free[start:end], "little")
            self.free[start:end] = (now | int.from_bytes(cells.mask, "little")).to_bytes(
                end - start, "little")
        else:  # scattered: a loop in C
            deque(map(self.free.__setitem__, cells, repeat(free)), maxlen=0)

    def _free(self, start: int, end: int) -> bool:
        return end <= self.size and self.free.find(0, start, end) < 0

    def _moved(self, end: int) -> None:
        """The cells from the head to `end` taken: the head past them."""
        self.top, self.used = max(self.top, end), self.used + end - self.head
        self.head = end % self.size

    def _ubatch(self, parts: list[tuple[int, int]]) -> None:
        """One ubatch's (sequence, tokens) parts placed as find_slot places them."""
        n = sum(k for _, k in parts)
        if self.used + n > self.size:
            return  # the scheduler keeps within the cache; nothing to place
        cell = 0 if self.head > self.used + 2 * n else self.head
        if self._free(cell, cell + n):  # the usual case: free cells from the head on
            self.head = cell
            for seq, k in parts:
                self._own(seq, range(cell, cell + k))
                cell += k
            self._moved(cell)
            return
        for seq, k in parts:  # the next free cells, wrapping at the end
            first = self._window(cell, k)
            rest = k - (len(first) if first else 0)
            wrapped = self._window(0, rest, cell) if rest else None
            for window in (first, wrapped):
                if window is not None:
                    self._own(seq, window, mark=False)
                    cell = window.start + len(window.mask)
                    self.top = max(self.top, cell)
        self.used += n
        self.head = cell % self.size

    def span(self) -> int:
        """Cells a ubatch's attention spans now."""
        return min(self.size, max(PAD, -(-self.top // PAD) * PAD))


def _as_range(cells: Sequence[int]) -> Sequence[int]:
    """`cells` as a range where they form one (a run, or every n-th cell), else as they are."""
    if len(cells) < 2:
        return range(cells[0], cells[0] + 1) if cells else range(0)
    step = cells[1] - cells[0]
    if step <= 0:
        return cells
    as_range = range(cells[0], cells[-1] + 1, step)
    return as_range if len(as_range) == len(cells) and list(as_range) == cells else cells


@dataclass(frozen=True)
class _Window:
    """Cells a sequence took as every free cell of a span: the span's start and its mask
    then (1 where a cell was free, so now this sequence's)."""

    start: int
    mask: bytes
    count: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return compress(range(self.start, self.start + len(self.mask)), self.mask)


Piece = Sequence[int] | _Window  # cells a sequence took at once (SharedCells._own)
