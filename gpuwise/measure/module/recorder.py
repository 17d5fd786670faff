"""The trace's recorder: a TorchDispatchMode that sees every aten op, records it (FLOPs and
bytes), and tracks the live bytes of each storage an op creates until it dies, so that the
live bytes at every op boundary, and their peak, are those of the eager run."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from gpuwise.measure.module.meta import require_torch
from gpuwise.measure.module.ops import op_record, tensor_bytes
from gpuwise.workload.traced import HeapEvent, TracedOp

# Queries about a tensor, not work: no kernel, not counted.
_QUERIES = {"is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense", "size",
            "sym_size", "stride", "sym_stride", "sym_numel", "sym_storage_offset", "dim",
            "sym_is_contiguous", "prim_layout", "prim_device"}


class Recorder:
    """A TorchDispatchMode that records ops and the live bytes of the storages they create."""

    def __init__(self, at_rest: set[int], params: set[int], cpu_scratch: bool = False) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        self.cpu_scratch = cpu_scratch
        self.at_rest = at_rest
        self.params = params
        self.ops: list[TracedOp] = []
        self.phase = "forward"
        self.alive: dict[int, tuple[int, int]] = {}  # storage key -> (serial, bytes)
        self.live = 0
        self.peak = 0
        self.peak_serials: set[int] = set()
        self.heap: list[HeapEvent] = []  # what the pass takes and gives back, in order
        self._serial = 0
        recorder = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                recorder.record(func, args, kwargs or {}, out)
                return out

        self.mode = Mode()

    def serial_of(self, t: Any) -> int | None:
        entry = self.alive.get(t.untyped_storage()._cdata)
        return entry[0] if entry else None

    def _free(self, key: int, serial: int, nbytes: int) -> None:
        entry = self.alive.get(key)
        if entry and entry[0] == serial:
            del self.alive[key]
            self.live -= nbytes
            self.heap.append(HeapEvent(serial, 0, self.phase))

    def _track(self, t: Any) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.alive or key in self.at_rest:
            return
        self._serial += 1
        nbytes = int(storage.nbytes())
        self.alive[key] = (self._serial, nbytes)
        self.live += nbytes
        self.heap.append(HeapEvent(self._serial, nbytes, self.phase))
        weakref.finalize(storage, self._free, key, self._serial, nbytes)

    def record(self, func: Any, args: Any, kwargs: dict, out: Any) -> None:
        torch = require_torch()
        name = func.overloadpacket.__name__
        if name in _QUERIES:
            return
        for t in tensors_in(out):
            if t.device.type == "meta":
                self._track(t)
        scratch = cpu_conv_scratch(name, args, out) if self.cpu_scratch else 0
        moment = self.live + scratch
        if scratch:  # oneDNN's reorder buffers, taken and given back within the call
            self._serial += 1
            self.heap += [HeapEvent(self._serial, scratch, self.phase),
                          HeapEvent(self._serial, 0, self.phase)]
        if moment > self.peak:
            self.peak = moment
            self.peak_serials = {s for s, _ in self.alive.values()}
        self.ops.append(op_record(torch, func, name, args, kwargs, out, self.phase, self.params))


def cpu_conv_scratch(name: str, args: Any, out: Any) -> int:
    """Bytes oneDNN holds inside a CPU convolution beyond its outputs: it reorders plain
    (NCHW) tensors into its blocked layout and back. Measured with VmHWM on this CPU (fp32):
    a forward holds a second copy of its output, a backward copies the output gradient and
    the input."""
    if name == "convolution":
        return tensor_bytes(out)
    if name == "convolution_backward":
        return tensor_bytes(args[0]) + tensor_bytes(args[1])
    return 0


def tensors_in(obj: Any) -> Iterator[Any]:
    """Every tensor in `obj`: nested tuples, lists, dicts and transformers' ModelOutputs."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_in(x)
    elif hasattr(obj, "to_tuple"):  # transformers ModelOutput
        yield from tensors_in(obj.to_tuple())
