"""Count the aten operations torch dispatches, kernels and views apart: the fixed cost of an
eager runtime (dispatch on a CPU, a kernel launch on a GPU) is paid once per operation."""

from __future__ import annotations

from typing import Any

# Metadata-only ops cost a dispatch but launch no kernel; they are counted apart.
VIEW_OPS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice",
            "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "split",
            "unbind", "chunk", "_reshape_alias", "contiguous", "lift_fresh"}


def op_counter() -> Any:
    """A TorchDispatchMode that counts, while entered, the `kernels` and the `views` dispatched
    (torch is imported here)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = 0
            self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name in VIEW_OPS:
                self.views += 1
            else:
                self.kernels += 1
            return func(*args, **(kwargs or {}))

    return Counter()
