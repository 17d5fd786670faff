"""The host memory a training plan may keep its offloaded parts in, per device: a home
machine's, or a GPU server's shared by its GPUs (catalog/data/stacks.toml [host_transfer]);
and what the answer says of the parts that live there."""

from __future__ import annotations

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.stacks import stack_value
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.units import GIB
from gpuwise.workload.plans import TrainingPlan


def host_capacity(hw: Hardware, gpus: int) -> int:
    """Bytes of host memory each of `gpus` devices of `hw` can use (0 for a CPU)."""
    if hw.kind == "cpu":
        return 0
    if hw.site == "home":
        return int(float(stack_value("host_transfer", "host_memory_gib_home")) * GIB)
    per_gpu = float(stack_value("host_transfer", "host_memory_gib_datacentre_per_gpu"))
    return int(per_gpu * GIB)


def paged_note(est: MemoryEstimate) -> str:
    """Where bitsandbytes' paged states live: the device's room beside the rest, then host
    memory, whose share the driver moves in and out every optimizer step."""
    on_host = est.paged_on_host_bytes
    text = (f"paged 8-bit states (bitsandbytes): {est.paged_bytes / GIB:,.2f} GiB in unified "
            f"memory outside PyTorch's pool, {est.paged_on_device_bytes / GIB:,.2f} GiB of it "
            "on the device beside the rest")
    if on_host:
        text += (f" and {on_host / GIB:,.2f} GiB in host memory, moved in and out by the "
                 "driver every optimizer step (its time is in the step)")
    return text


def host_note(est: MemoryEstimate, plan: TrainingPlan) -> str:
    """What the plan keeps in host memory, against what the host has."""
    what = ", ".join(plan.offload) if plan.offload else "paged states"
    verdict = "fits" if est.host_fits else "does NOT fit"
    return (f"host memory: {est.host_needed_bytes / GIB:,.2f} GiB ({what}) per device, which "
            f"{verdict} in the {est.host_capacity_bytes / GIB:,.0f} GiB a host gives each GPU "
            "(assumed: catalog/data/stacks.toml [host_transfer])")
