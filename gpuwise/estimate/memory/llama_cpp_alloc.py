"""A port of ggml-alloc's graph allocator (ggml/src/ggml-alloc.c), and the pages a run writes.

What it keeps from ggml-alloc.c: leafs (the graph inputs) allocated first in leaf order; then
each node in order, in place over a parent when the op may run in place
(`ggml_op_can_inplace`), the parent has this node as its only consumer and no views, and the
layouts match (`ggml_gallocr_allocate_node`); parents freed when their last consumer (or view)
is done; graph outputs never freed; the dynamic allocator's best fit among the free blocks but
the last, then the last block, sizes rounded to the buffer's alignment (`ggml_dyn_tallocr`).

A CPU buffer is one posix_memalign'd block whose pages become resident only when written. A
later graph with the same number of nodes and leafs, each no larger than in the reserved graph,
keeps the reserved offsets (`ggml_gallocr_needs_realloc` is false), so the pages it writes are
the union of [reserved offset, reserved offset + its own size] over the tensors it computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGE = 4096  # bytes of a page of the resident set
# ggml_op_can_inplace (ggml-alloc.c) for the ops these graphs use.
INPLACE_OPS = frozenset({"scale", "add", "mul", "rope", "rms_norm", "soft_max", "unary"})


@dataclass(eq=False)
class Tensor:
    name: str
    op: str  # "none" for a leaf
    nbytes: int
    ne: tuple[int, ...]
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None
    view_offs: int = 0
    contiguous: bool = True
    input: bool = False
    output: bool = False
    external: bool = False  # weights and the KV cache: allocated outside the compute buffer


@dataclass
class Graph:
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def expand(self, t: Tensor) -> None:
        """ggml_build_forward_expand: parents left to right, then the tensor itself."""
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        while stack:
            cur, i = stack.pop()
            if i == 0:
                if id(cur) in self._seen:
                    continue
                self._seen.add(id(cur))
            if i < len(cur.src):
                stack.append((cur, i + 1))
                if id(cur.src[i]) not in self._seen:
                    stack.append((cur.src[i], 0))
                continue
            (self.leafs if cur.op == "none" else self.nodes).append(cur)


@dataclass
class _Node:
    n_children: int = 0
    n_views: int = 0
    allocated: bool = False
    offset: int = -1


class _DynAlloc:
    """ggml_dyn_tallocr with one chunk: free blocks sorted by offset, best fit among all
    but the last block, else the last block (which grows the buffer)."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.free: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def _align(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._align(size)
        best, best_size = -1, 1 << 63
        for i, (_, bsize) in enumerate(self.free[:-1]):
            if bsize >= size and bsize <= best_size:
                best, best_size = i, bsize
        if best < 0:
            best = len(self.free) - 1
        block = self.free[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.free[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        size = self._align(size)
        for i, block in enumerate(self.free):
            if block[0] + block[1] == offset:
                block[1] += size
                if i + 1 < len(self.free) and block[0] + block[1] == self.free[i + 1][0]:
                    block[1] += self.free[i + 1][1]
                    del self.free[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == block[0]:
                    self.free[i - 1][1] += block[1]
                    del self.free[i]
                return
        pos = 0
        while pos < len(self.free) and self.free[pos][0] < offset:
            pos += 1
        self.free.insert(pos, [offset, size])


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne and a.nbytes == b.nbytes and a.contiguous and b.contiguous


def allocate(graph: Graph, alignment: int = 32) -> tuple[int, dict[int, int]]:
    """ggml_gallocr_alloc_graph_impl over `graph`: (the buffer size, each allocated
    tensor's offset by its index in leafs + nodes)."""
    alloc = _DynAlloc(alignment)
    info: dict[int, _Node] = {}

    def node(t: Tensor) -> _Node:
        return info.setdefault(id(t), _Node())

    def own(t: Tensor) -> bool:
        return node(t).allocated

    def allocate_tensor(t: Tensor) -> None:
        hn = node(t)
        if t.external or hn.allocated or hn.offset >= 0 or t.view_src is not None:
            return
        hn.allocated = True
        if t.op in INPLACE_OPS:
            for parent in t.src:
                if not own(parent) or parent.output or (
                        parent.view_src is not None and parent.view_src.output):
                    continue
                if not _same_layout(t, parent):
                    continue
                ph = node(parent)
                if ph.n_children != 1 or ph.n_views != 0:
                    continue
                if parent.view_src is not None:
                    base = node(parent.view_src)
                    if base.n_views == 1 and base.n_children == 0 and parent.view_offs == 0:
                        hn.offset = ph.offset
                        ph.allocated = base.allocated = False
                        _free_extra(alloc, base.offset, parent.view_src.nbytes, t.nbytes)
                        return
                else:
                    hn.offset = ph.offset
                    ph.allocated = False
                    _free_extra(alloc, ph.offset, parent.nbytes, t.nbytes)
                    return
        hn.offset = alloc.alloc(t.nbytes)

    def release(t: Tensor) -> None:
        if t.output:
            return
        hn = node(t)
        alloc.release(hn.offset, t.nbytes)
        hn.allocated = False

    for leaf in graph.leafs:
        allocate_tensor(leaf)
    for t in graph.nodes:
        if t.view_src is not None:
            node(t.view_src).n_views += 1
        for s in t.src:
            node(s).n_children += 1
            if s.input:
                allocate_tensor(s)
    for t in graph.nodes:
        for s in t.src:
            allocate_tensor(s)
        allocate_tensor(t)
        for s in t.src:
            ph = node(s)
            ph.n_children -= 1
            if ph.n_children == 0 and ph.n_views == 0:
                if s.view_src is not None:
                    base = node(s.view_src)
                    base.n_views -= 1
                    if base.n_views == 0 and base.n_children == 0 and base.allocated:
                        release(s.view_src)
                elif ph.allocated:
                    release(s)
    offsets = {i: info[id(t)].offset for i, t in enumerate(graph.leafs + graph.nodes)
               if id(t) in info and info[id(t)].offset >= 0}
    return alloc.max_size, offsets


def _free_extra(alloc: _DynAlloc, offset: int, parent_size: int, size: int) -> None:
    """ggml_gallocr_free_extra_space: an in-place node smaller than its parent frees the rest."""
    parent_size, size = alloc._align(parent_size), alloc._align(size)
    if parent_size > size:
        alloc.release(offset + size, parent_size - size)


def touched_pages(reserved: Graph, offsets: dict[int, int],
                  run: Graph) -> list[tuple[int, int]]:
    """The pages (first, last) each tensor of a run of `run` writes in a buffer laid out
    for `reserved`."""
    tensors = run.leafs + run.nodes
    if len(run.leafs) != len(reserved.leafs) or len(run.nodes) != len(reserved.nodes):
        _, offsets = allocate(run)  # a graph of another shape is laid out anew
    spans = []
    for i, t in enumerate(tensors):
        if i not in offsets or t.nbytes == 0 or (t.input and t.name == "inp_embd"):
            continue
        spans.append((offsets[i] // PAGE, (offsets[i] + t.nbytes - 1) // PAGE))
    return spans


def pages(spans: list[tuple[int, int]]) -> int:
    """How many distinct pages the spans cover."""
    total, end = 0, -1
    for first, last in sorted(spans):
        if last > end:
            total += last - max(first, end + 1) + 1
            end = last
    return total
