"""The child of benchmarks/malloc_trace.py: a memory job run as `gpuwise validate` runs it
(measure_cpu_process), with marker requests the tracer records: 77777 and 77779 bytes around
the build, 77781 before each backward, 77783 after it, 77785 after each optimizer step, and
77787 and 77789 around a checkpointed layer's forward run again in the backward."""

from __future__ import annotations

import ctypes
import json
import sys

LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.free.argtypes = [ctypes.c_void_p]


def mark(nbytes: int) -> None:
    LIBC.free(LIBC.malloc(nbytes))


def _marked(cls: type, name: str, before: int, after: int) -> None:
    plain = getattr(cls, name)

    def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if before:
            mark(before)
        out = plain(self, *args, **kwargs)
        mark(after)
        return out

    setattr(cls, name, call)


def _mark_recomputes() -> None:
    """A checkpointed layer's forward run again inside a backward between markers:
    transformers checkpoints with `torch.utils.checkpoint.checkpoint` as modeling_utils
    imported it, and the recomputation calls the function it was given."""
    from transformers import modeling_utils

    plain = modeling_utils.checkpoint

    def checkpoint(function, *args, **kwargs):  # type: ignore[no-untyped-def]
        def marked(*a, **k):  # type: ignore[no-untyped-def]
            if not IN_BACKWARD:
                return function(*a, **k)
            mark(77787)
            try:  # torch stops a recomputation early by raising once it has what it needs
                return function(*a, **k)
            finally:
                mark(77789)

        return plain(marked, *args, **kwargs)

    modeling_utils.checkpoint = checkpoint


IN_BACKWARD = False


def _backward_marked() -> None:
    import torch

    plain = torch.Tensor.backward

    def backward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        global IN_BACKWARD
        mark(77781)
        IN_BACKWARD = True
        try:
            return plain(self, *args, **kwargs)
        finally:
            IN_BACKWARD = False
            mark(77783)

    torch.Tensor.backward = backward  # type: ignore[method-assign]


def main() -> None:
    job = json.loads(sys.stdin.read())
    import torch
    import transformers
    from transformers.optimization import Adafactor

    from gpuwise.measure.runs import memory_run, peak_memory

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    _backward_marked()
    _mark_recomputes()
    for cls in (torch.optim.AdamW, torch.optim.SGD, Adafactor):
        _marked(cls, "step", 0, 77785)

    def prepare(job: dict):  # type: ignore[no-untyped-def]
        mark(77777)
        out = memory_run._prepare(job)
        mark(77779)
        return out

    result = peak_memory.measure_cpu_process(job, prepare)
    print(json.dumps({"model_bytes": result["model_bytes"]}))


if __name__ == "__main__":
    main()
