"""Time a PyTorch training loop from inside, with no change to its code.

Patches, each a thin wrapper that calls the original and returns its result untouched:
DataLoader iterators' ``__next__`` (waiting for data), ``Tensor.to`` / ``Tensor.cuda`` when
they copy host memory to a device, ``torch.autograd.backward``, and optimizer steps (through
torch's global optimizer hooks). Any error inside a wrapper switches the hooks off and the
program goes on; under torch.compile tracing the wrappers step aside.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

perf_counter = time.perf_counter


def install(torch: Any, rec: Any) -> Callable[[], None]:
    """Wrap the loop's entry points so that `rec` (a StepRecorder) sees every phase.
    Returns `uninstall`, which puts the originals back."""
    guard = _Guard(rec, torch)
    undo = [_patch(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__",
                   lambda original: _loader_wrapper(original, rec, guard)),
            _patch(torch.Tensor, "to", lambda original: _copy_wrapper(original, rec, guard)),
            _patch(torch.Tensor, "cuda", lambda original: _copy_wrapper(original, rec, guard)),
            _patch(torch.autograd, "backward",
                   lambda original: _backward_wrapper(original, rec, guard)),
            _hook_optimizers(rec, guard)]

    def uninstall() -> None:
        for restore in undo:
            restore()

    return uninstall


def _patch(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Callable[[], None]:
    original, own = getattr(owner, name), name in vars(owner)  # Tensor.to is inherited
    wrapper = wrap(original)
    setattr(owner, name, wrapper)

    def restore() -> None:
        if getattr(owner, name) is not wrapper:
            return  # someone wrapped it again since: leave theirs
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    return restore


class _Guard:
    """Whether a wrapper should record now; turns every hook off after an internal error."""

    def __init__(self, rec: Any, torch: Any) -> None:
        self.rec = rec
        compiler = getattr(torch, "compiler", None)
        self.is_compiling: Callable[[], bool] = getattr(compiler, "is_compiling", lambda: False)

    def on(self) -> bool:
        return self.rec.hooks_enabled and not self.is_compiling()

    def failed(self, where: str, exc: BaseException) -> None:
        self.rec.hooks_enabled = False
        with contextlib.suppress(Exception):
            self.rec.log.write({"kind": "note", "pid": os.getpid(),
                                "text": f"watch hooks off after an error in {where}: {exc!r}"})


def _loader_wrapper(original: Any, rec: Any, guard: _Guard) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if not guard.on():
            return original(self)
        t0, ops = perf_counter(), rec.ops_so_far()
        try:
            batch = original(self)
        except StopIteration:
            _safely(guard, "DataLoader", rec.on_loader_exhausted)
            raise
        _safely(
            guard, "DataLoader", rec.on_data, t0, perf_counter() - t0, batch, rec.ops_so_far() - ops
        )
        return batch

    return __next__


def _copy_wrapper(original: Any, rec: Any, guard: _Guard) -> Any:
    @functools.wraps(original)
    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not guard.on():
            return original(self, *args, **kwargs)
        t0 = perf_counter()
        out = original(self, *args, **kwargs)
        # Only host-to-device copies: `out is self` when nothing moved, and casts stay put.
        if out is not self and out.device.type != "cpu" and self.device.type == "cpu":
            _safely(guard, "Tensor.to", rec.on_phase, "h2d", t0, perf_counter() - t0)
        return out

    return copy


def _backward_wrapper(original: Any, rec: Any, guard: _Guard) -> Any:
    depth = [0]  # checkpointed regions call backward inside backward: time the outer one

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if depth[0] or not guard.on():
            return original(*args, **kwargs)
        t0 = perf_counter()
        depth[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            _safely(guard, "backward", _timed_end, rec, "backward", t0)

    return backward


def _hook_optimizers(rec: Any, guard: _Guard) -> Callable[[], None]:
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    started: list[tuple[int, float]] = []  # a wrapper optimizer (accelerate's) steps another

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if any(key == id(optimizer) for key, _ in started):
            started.clear()  # left over from a step that raised
        started.append((id(optimizer), perf_counter()))

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        t0 = started.pop()[1] if started else None
        if t0 is not None and not started and guard.on():  # the outermost step
            _safely(guard, "optimizer", _timed_end, rec, "optimizer", t0)
            _safely(guard, "optimizer", rec.on_optimizer_done)

    handles = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _timed_end(rec: Any, phase: str, t0: float) -> None:
    rec.sync()
    rec.on_phase(phase, t0, perf_counter() - t0)


def _safely(guard: _Guard, where: str, fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:
        guard.failed(where, exc)
