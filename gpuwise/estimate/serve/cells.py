"""llama.cpp's unified KV cache as cells (docs/serve.md, "A step's time"): where a step's
tokens land, how far a ubatch's attention spans, and which idle slot gives its cells up.

- `find_slot` (src/llama-kv-cache.cpp): a ubatch's tokens take free cells one by one from the
  cache's head, wrapping at the end; it starts from the first cell instead when the head is
  more than twice the ubatch past the number of cells in use. The head moves past the last
  cell taken (`apply_ubatch`).
- `get_n_kv`: a ubatch's attention spans the cells up to the highest in use, padded to 256,
  every sequence's and the free ones between, all but its own masked out.
- tools/server/server-context.cpp `get_available_slot`: a new request takes a slot never used
  first, else the idle one used longest ago, whose cells it clears (`prompt_clear`); until then
  an idle slot keeps its last request's cells for the prompt cache."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

PAD = 256  # get_n_kv: n_kv padded to max(n_pad, 256)
UBATCH = 512  # llama-server's n_ubatch (common/common.h)


@dataclass
class SharedCells:
    size: int
    slots: int
    head: int = 0
    used: int = 0
    top: int = 0  # one past the highest cell in use
    taken: bytearray = field(init=False)
    owned: dict[int, list[int]] = field(default_factory=dict)
    idle: deque[int] = field(default_factory=deque)  # finished requests, longest idle first
    fresh: int = field(init=False)  # slots not used yet

    def __post_init__(self) -> None:
        self.taken = bytearray(self.size)
        self.fresh = self.slots

    def start(self, seq: int) -> None:
        """A new request takes a slot: an unused one, else the longest idle one's cells go."""
        if seq in self.owned:
            return
        self.owned[seq] = []
        if self.fresh:
            self.fresh -= 1
        elif self.idle:
            self.release(self.idle.popleft())

    def finish(self, seq: int) -> None:
        self.idle.append(seq)

    def release(self, seq: int) -> None:
        cells = self.owned.pop(seq, [])
        for cell in cells:
            self.taken[cell] = 0
        self.used -= len(cells)
        self.top = self.taken.rfind(1, 0, self.top) + 1

    def take(self, work: list[tuple[int, int]]) -> None:
        """Cells for a batch of (sequence, tokens), in ubatches of UBATCH tokens."""
        ubatch: list[tuple[int, int]] = []
        room = UBATCH
        for seq, n in work:
            while n:
                part = min(n, room)
                ubatch.append((seq, part))
                n, room = n - part, room - part
                if not room:
                    self._ubatch(ubatch)
                    ubatch, room = [], UBATCH
        if ubatch:
            self._ubatch(ubatch)

    def take_run(self, seqs: list[int], steps: int) -> None:
        """Cells for `steps` decode steps of one token of each of `seqs`: as many ubatches.
        A step takes the next free cells from the head unless it starts from the first cell
        with free ones below the head; within a run of free cells that holds for every step
        (the head's lead over the cells in use stays the same), so whole steps are placed a
        run at a time, and a step at a run's end or starting from the first cell by the rules."""
        n, one = len(seqs), [(seq, 1) for seq in seqs]
        while steps > 0 and n:
            below = self.head > self.used + 2 * n and self.taken.find(0, 0, self.head) >= 0
            start = -1 if below else self.taken.find(0, self.head)
            end = self.taken.find(1, start) if start >= 0 else -1
            fit = min(steps, ((self.size if end < 0 else end) - start) // n) if start >= 0 else 0
            if fit == 0:
                self._ubatch(one)
                steps -= 1
                continue
            stop = start + fit * n
            self.taken[start:stop] = b"\x01" * (stop - start)
            for i, seq in enumerate(seqs):
                self.owned.setdefault(seq, []).extend(range(start + i, stop, n))
            self.head = start
            self._moved(stop)
            steps -= fit

    def _free(self, start: int, end: int) -> bool:
        return end <= self.size and self.taken.find(1, start, end) < 0

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
            self.taken[cell : cell + n] = b"\x01" * n
            for seq, k in parts:
                self.owned.setdefault(seq, []).extend(range(cell, cell + k))
                cell += k
            self._moved(cell)
            return
        for seq, k in parts:
            mine = self.owned.setdefault(seq, [])
            while k:  # the next free cells, a run of them at a time, wrapping at the end
                start = self.taken.find(0, cell)
                start = self.taken.find(0) if start < 0 else start
                end = self.taken.find(1, start)
                stop = start + min(k, (self.size if end < 0 else end) - start)
                self.taken[start:stop] = b"\x01" * (stop - start)
                mine.extend(range(start, stop))
                self.top, k, cell = max(self.top, stop), k - (stop - start), stop
        self.used += n
        self.head = cell % self.size

    def span(self) -> int:
        """Cells a ubatch's attention spans now."""
        return min(self.size, max(PAD, -(-self.top // PAD) * PAD))
