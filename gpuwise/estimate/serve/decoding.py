"""The running sequences past their prompts, advanced together (docs/serve.md, "How fast it
simulates"). In a step where every one of them decodes, each takes one token; so the group
keeps a clock of such steps, and each member the clock when it joined. A member's positions,
tokens, blocks and last token's time follow from the clock (`_leave` writes them back), and
the sums a step's time and the schedulers read (positions in the cache, outputs still to
come, blocks the next steps take, the first member to finish) are kept as members join and
leave: a decode step costs the same for 1,000 sequences as for 10.

Only the paged schedulers (`LAZY`) keep a group; a step that treats its decoding sequences
one by one (a preemption, a budget too small for all) first writes every member back (`sync`).
"""

from __future__ import annotations

import heapq
import math

from gpuwise.estimate.serve.engine import Histogram, Seq

LAZY = frozenset({"mixed", "prefill_first"})
GROUPED = True  # False: every sequence stepped one by one (the tests' reference)


class Decoding:
    """The group, and the running sequences outside it (`others`, in running order)."""

    def __init__(self, block_tokens: int, enabled: bool) -> None:
        self.bt = block_tokens
        self.enabled = enabled
        self.clock = 0
        self.members: dict[int, Seq] = {}
        self.others: list[Seq] = []
        self._positions = 0  # sum of (computed - tick0): positions held are this + n x clock
        self._left = 0  # sum of (output - generated + tick0): outputs to come, this - n x clock
        self._ends: list[tuple[int, int]] = []  # (clock at which a member is done, id): a heap
        self._fresh: list[Seq] = []  # joined since the last step: their last token is their own
        self._last_s = -1.0  # the end of the group's last step
        self._phases = [0] * block_tokens if block_tokens > 1 else []  # members by block phase

    def __len__(self) -> int:
        return len(self.members)

    def positions(self) -> int:
        """Positions the members hold in the cache."""
        return self._positions + len(self.members) * self.clock

    def left(self) -> int:
        """Output tokens the members have still to produce."""
        return self._left - len(self.members) * self.clock

    def computed(self, seq: Seq) -> int:
        return seq.computed + self.clock - seq.tick0 if seq.tick0 >= 0 else seq.computed

    def steps_to_first_end(self) -> float:
        """Group steps until the first member is done (inf: no members)."""
        ends, members = self._ends, self.members
        while ends:
            end, sid = ends[0]
            seq = members.get(sid)
            if seq is not None and seq.tick0 + seq.req.output - seq.generated == end:
                return end - self.clock
            heapq.heappop(ends)  # a member that left
        return math.inf

    def blocks(self, steps: int) -> int:
        """Blocks the members take in the next `steps` group steps: one each time a member's
        next position starts a block. A member's phase is its positions past its prefix at
        clock 0, mod a block: at clock j it takes one where (phase + j) % block is 0."""
        if self.bt == 1:
            return len(self.members) * steps
        rounds, rest = divmod(steps, self.bt)  # each whole round of a block: one a member
        c, bt, phases = self.clock + rounds * self.bt, self.bt, self._phases
        whole = rounds * len(self.members)
        if rest == 1:  # a single step: the common case
            return whole + phases[-c % bt]
        return whole + sum(phases[-j % bt] for j in range(c, c + rest))

    def join_decoders(self) -> None:
        """Running sequences outside the group that are past their prompts join it."""
        if not self.enabled or not self.others:
            return
        stay = []
        for seq in self.others:
            if seq.done_s >= 0:
                continue  # done: out of the running too
            if seq.computed >= seq.target:
                self._join(seq)
            else:
                stay.append(seq)
        self.others = stay

    def _join(self, seq: Seq) -> None:
        c = self.clock
        seq.tick0 = c
        self.members[seq.id] = seq
        self._positions += seq.computed - c
        self._left += seq.req.output - seq.generated + c
        heapq.heappush(self._ends, (c + seq.req.output - seq.generated, seq.id))
        self._fresh.append(seq)
        if self._phases:
            self._phases[(seq.computed - c - seq.base) % self.bt] += 1

    def _leave(self, seq: Seq) -> None:
        """`seq` out of the group, its fields as if it had been stepped one by one (it holds
        the blocks of its positions: its scheduler gave it each as it needed it)."""
        c0 = seq.tick0
        del self.members[seq.id]
        self._positions -= seq.computed - c0
        self._left -= seq.req.output - seq.generated + c0
        if self._phases:
            self._phases[(seq.computed - c0 - seq.base) % self.bt] -= 1
        steps = self.clock - c0
        if steps:
            seq.computed += steps
            seq.generated += steps
            seq.last_token_s = self._last_s
            seq.blocks = -(-(seq.computed - seq.base) // self.bt)
        seq.tick0 = -1

    def sync(self, running: list[Seq]) -> None:
        """Every member written back and out of the group: the step treats them one by one."""
        if not self.enabled:
            return
        for seq in list(self.members.values()):
            self._leave(seq)
        self._ends.clear()
        self._fresh.clear()
        self.others = list(running)

    def step(self, k: int, start: float, end: float, itl: Histogram, run: bool) -> list[Seq]:
        """`k` steps of one token a member, from `start` to `end` (their blocks already taken),
        each token's gap since the member's last one counted (`run`: as steady.apply_run
        spaces a run's steps, else as simulate._apply times one step); the members done."""
        n = len(self.members)
        if not n:
            return []
        since: dict[float, int] = {}
        if n > len(self._fresh):
            since[self._last_s] = n - len(self._fresh)
        for seq in self._fresh:
            since[seq.last_token_s] = since.get(seq.last_token_s, 0) + 1
        gap = (end - start) / k
        for last, count in since.items():
            if run:
                itl.add(start + gap - last, count)
                if k > 1:
                    itl.add(gap, count * (k - 1))
            else:
                itl.add(end - last, count)
        self.clock += k
        self._last_s = end
        self._fresh.clear()
        return self._done(end)

    def _done(self, end: float) -> list[Seq]:
        done, ends = [], self._ends
        while ends and ends[0][0] <= self.clock:
            at, sid = heapq.heappop(ends)
            seq = self.members.get(sid)
            if seq is None or seq.tick0 + seq.req.output - seq.generated != at:
                continue  # a member that left
            self._leave(seq)
            seq.done_s = end
            done.append(seq)
        return done
