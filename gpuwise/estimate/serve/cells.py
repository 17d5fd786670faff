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
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat

from gpuwise.estimate.serve.cell_pieces import (
    FA_TILE,
    FREE,
    Piece,
    SeqTiles,
    Window,
    as_range,
    cyclic,
    nth_free,
    nth_taken,
)

_SeqTiles, _Window = SeqTiles, Window  # as the tests name them

PAD = 256  # get_n_kv: n_kv padded to max(n_pad, 256)
UBATCH = 512  # llama-server's n_ubatch (common/common.h)
# A cell holds its owner's label, 0 where free: a request's cells go in one pass over the
# cache (bytes.translate). 254 labels; every owner past them shares the last, and its
# cells go one piece at a time.
OVERFLOW = 255
_SAME = bytes(range(256))
_TAKE = [bytes([label]) + _SAME[1:] for label in range(256)]  # translate: free cells to label
_LABEL = [bytes([label]) for label in range(256)]


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
class SharedCells:
    size: int
    tiled: bool = False  # attention on ggml-cpu's tiled path (Ubatch.computed, .skipped)
    head: int = 0
    used: int = 0
    top: int = 0  # one past the highest cell in use
    own: bytearray = field(init=False)  # each cell's owner's label, 0 where free
    # a sequence's cells in the order it took them, as pieces (ranges where they form one):
    # kept where the order is read (tiled attention) or its label is shared, else []
    owned: dict[int, list[Piece]] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # and how many
    label: dict[int, int] = field(default_factory=dict)
    spare: list[int] = field(default_factory=lambda: list(range(OVERFLOW - 1, 0, -1)))
    idle: deque[int] = field(default_factory=deque)  # finished requests whose cells stay
    tiles: dict[int, SeqTiles] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.own = bytearray(self.size)

    @property
    def free(self) -> bytearray:
        """1 where a cell is free."""
        return self.own.translate(FREE)

    def start(self, seq: int) -> None:
        """A new request takes a slot, and every idle slot's cells go (`cache_idle_slots`)."""
        if seq in self.owned:
            return
        self.owned[seq], self.held[seq] = [], 0
        if self.idle:
            self._release(self.idle)
            self.idle.clear()

    def finish(self, seq: int) -> None:
        self.idle.append(seq)

    def release(self, seq: int) -> None:
        self._release((seq,))

    def _release(self, seqs: Sequence[int] | deque[int]) -> None:
        """`seqs`' cells freed: their labels' in one pass, a shared label's piece by piece."""
        table = None
        for seq in seqs:
            pieces = self.owned.pop(seq, [])
            self.tiles.pop(seq, None)
            self.used -= self.held.pop(seq, 0)
            label = self.label.pop(seq, 0)
            if label == OVERFLOW:
                for piece in pieces:
                    self._clear(piece)
            elif label:
                table = table or bytearray(_SAME)
                table[label] = 0
                self.spare.append(label)
        kept = self.own[:self.top]
        if table is not None:
            kept = kept.translate(table)
            self.own[:self.top] = kept
        self.top = len(kept.rstrip(b"\x00"))

    def _clear(self, cells: Piece) -> None:
        """`cells` (a shared label's) marked free: a slice where they are a range, the window's
        mask cleared from its span, else each."""
        own = self.own
        if isinstance(cells, range):
            own[cells.start:cells.stop:cells.step] = bytes(len(cells))
        elif isinstance(cells, Window):
            start, end = cells.start, cells.start + len(cells.mask)
            now = int.from_bytes(own[start:end], "little")
            mask = int.from_bytes(cells.mask, "little") * 255
            own[start:end] = (now & ~mask).to_bytes(end - start, "little")
        else:
            deque(map(own.__setitem__, cells, repeat(0)), maxlen=0)

    def _label(self, seq: int) -> int:
        label = self.label.get(seq)
        if label is None:
            label = self.label[seq] = self.spare.pop() if self.spare else OVERFLOW
            self.owned.setdefault(seq, [])
            self.held.setdefault(seq, 0)
        return label

    def _keeps(self, label: int) -> bool:
        """Whether a sequence's cells are kept as pieces too."""
        return self.tiled or label == OVERFLOW

    def cells(self, seq: int) -> list[int]:
        """`seq`'s cells in the order it took them where they are kept as pieces, else in the
        cache's order."""
        label = self.label.get(seq, 0)
        if not label or self._keeps(label):
            return list(chain.from_iterable(self.owned.get(seq, [])))
        mine = bytes(label == i for i in range(256))
        return list(compress(range(self.top), self.own[:self.top].translate(mine)))

    def _own(self, seq: int, label: int, cells: Piece) -> None:
        """`seq` holds `cells` more (already labelled); kept as a piece where pieces are."""
        self.held[seq] += len(cells)
        if self.tiled or label == OVERFLOW:
            if not isinstance(cells, (range, Window)):
                cells = as_range(cells)
            self.owned[seq].append(cells)

    def _window(self, seq: int, start: int, count: int, stop: int) -> tuple[int, int]:
        """`seq` takes the first `count` free cells from `start` on (before `stop`): every free
        cell up to the last of them, so labelled in one pass (and kept as that span's mask);
        (cells taken, the cell past the last: -1 where none)."""
        own = self.own
        end, got = self._free_upto(start, count, stop)
        if not got:
            return 0, -1
        span = own[start:end]
        label = self._label(seq)
        own[start:end] = span.translate(_TAKE[label])
        self.held[seq] += got
        if self._keeps(label):
            self.owned[seq].append(Window(start, bytes(span.translate(FREE)), got))
        return got, end

    def _free_upto(self, start: int, count: int, stop: int) -> tuple[int, int]:
        """(the cell past the `count`-th free cell from `start`, or past the last before
        `stop` where there are fewer; how many that is): free cells counted a chunk at a
        time in C."""
        own, pos, need = self.own, start, count
        while pos < stop:
            end = min(stop, pos + max(64, 2 * need))
            have = own.count(0, pos, end)
            if have >= need:
                return nth_free(own, pos, end, need), count
            need, pos = need - have, end
        return own.rfind(0, start, stop) + 1 or start, count - need

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
        get = self.held.get
        rows = [(seq, get(seq, 0), n) for seq, n in parts]
        self._ubatch(parts)
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
                    tiles = self.tiles.setdefault(seq, SeqTiles())
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
            below = self.head > self.used + 2 * n and self.own.find(0, 0, self.head) >= 0
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
            m = (1 if head - self.used > 2 * n else steps) * n
            labels = [self._label(seq) for seq in seqs]
            self.own[head:head + m] = bytes(labels) * (m // n)
            for i, seq in enumerate(seqs):
                self._own(seq, labels[i], range(head + i, head + m, n))
            return self._stepped(head + m, m, n)
        own, lead = self.own, head - self.used
        end, got = self._free_upto(head, steps * n, self.size)  # past the last it may take
        steps = got // n
        # the lead after step j is head - used + the cells in use it passed: over 2n once
        # past the (2n - lead + 1)-th in use from the head, which follows f free cells
        ahead = 2 * n - lead + 1
        if ahead <= 0:
            steps = min(steps, 1)
        elif (end - head) - got >= ahead:
            f = nth_taken(own, head, end, ahead) - head - (ahead - 1)
            steps = min(steps, f // n + 1)
        if not steps:
            return 0
        if steps * n < got:
            end = nth_free(own, head, end, steps * n)
        get = self.label.get
        labels = [get(seq) or self._label(seq) for seq in seqs]
        if self.tiled or n > 255 or OVERFLOW in labels:
            return self._scattered(seqs, labels, end, steps * n)
        own[head:end] = cyclic(own[head:end], labels)
        for seq in seqs:
            self.held[seq] += steps
        return self._stepped(end, steps * n, n)

    def _scattered(self, seqs: list[int], labels: list[int], end: int, m: int) -> int:
        """The run's cells labelled (and kept as pieces) a cell at a time."""
        n, own = len(seqs), self.own
        found = list(compress(range(self.head, end), own[self.head:end].translate(FREE)))
        for i, seq in enumerate(seqs):
            mine = found[i::n]
            deque(map(own.__setitem__, mine, repeat(labels[i])), maxlen=0)
            self._own(seq, labels[i], mine)
        return self._stepped(end, m, n)

    def _stepped(self, end: int, cells: int, n: int) -> int:
        self.used += cells
        self.top = max(self.top, end)
        self.head = end % self.size
        return cells // n

    def _free(self, start: int, end: int) -> bool:
        return end <= self.size and self.own.count(0, start, end) == end - start

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
                label = self._label(seq)
                self.own[cell:cell + k] = _LABEL[label] * k
                self._own(seq, label, range(cell, cell + k))
                cell += k
            self._moved(cell)
            return
        own, top, get, held = self.own, self.top, self.label.get, self.held
        for seq, k in parts:  # the next free cells, wrapping at the end
            if k == 1:  # a decoding sequence's token: the next free cell
                past = own.find(0, cell) + 1 or own.find(0, 0, cell) + 1
                own[past - 1] = label = get(seq) or self._label(seq)
                held[seq] += 1
                if self.tiled or label == OVERFLOW:
                    self.owned[seq].append(range(past - 1, past))
                cell, top = past, max(top, past)
                continue
            got, end = self._window(seq, cell, k, self.size)
            wrapped = self._window(seq, 0, k - got, cell)[1] if got < k else -1
            for past in (end, wrapped):
                if past >= 0:
                    cell, top = past, max(top, past)
        self.top = top
        self.used += n
        self.head = cell % self.size

    def span(self) -> int:
        """Cells a ubatch's attention spans now."""
        return min(self.size, max(PAD, -(-self.top // PAD) * PAD))
