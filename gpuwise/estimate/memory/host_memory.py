"""The host memory a training plan may keep its offloaded parts in, per device: a home
machine's, or a GPU server's shared by its GPUs (catalog/data/stacks.toml [host_transfer])."""

from __future__ import annotations

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.stacks import stack_value
from gpuwise.units import GIB


def host_capacity(hw: Hardware, gpus: int) -> int:
    """Bytes of host memory each of `gpus` devices of `hw` can use (0 for a CPU)."""
    if hw.kind == "cpu":
        return 0
    if hw.site == "home":
        return int(float(stack_value("host_transfer", "host_memory_gib_home")) * GIB)
    per_gpu = float(stack_value("host_transfer", "host_memory_gib_datacentre_per_gpu"))
    return int(per_gpu * GIB)
