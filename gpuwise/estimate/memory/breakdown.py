"""Result records of the estimators. Sizes in bytes; breakdown parts add up to the total."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwise.catalog.allocators import host_tight_fraction
from gpuwise.catalog.cuda_allocator import cuda_allocator

# Rows of device memory outside the framework's pool (the CUDA context, NCCL's buffers):
# `model_bytes` leaves them out, as torch.cuda.memory_reserved does.
OUTSIDE_POOL = ("overhead", "nccl_buffers")


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory on one device, split by component at the moment of the peak."""

    total_bytes: int
    breakdown: dict[str, int]
    capacity_bytes: int
    runtime: str
    peak_phase: str
    phases: dict[str, int] = field(default_factory=dict)  # total at each phase's peak
    notes: tuple[str, ...] = ()
    source: str = "estimated"
    margin_bytes: int = 0  # "tight" below this much headroom (memory.md: does it fit)
    # where the runtime takes its whole budget up front (vLLM's KV pool), the headroom is
    # inside it: the pool beyond what the plan needs (None: the capacity less the total)
    spare_bytes: int | None = None
    # bitsandbytes' paged optimizer states: unified memory outside the framework's pool, on
    # the device in the room the rest leaves and in host memory beyond it (not in the total)
    paged_bytes: int = 0
    # what the plan keeps in host memory (offloaded states, parameters, activations; paged
    # states beyond the device: paged_on_host_bytes) and what the host has for this device
    # (0: not checked, as on a CPU, where the device is the host)
    host_bytes: int = 0
    host_capacity_bytes: int = 0

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes and self.host_fits

    @property
    def host_needed_bytes(self) -> int:
        return self.host_bytes + self.paged_on_host_bytes

    @property
    def host_fits(self) -> bool:
        return not self.host_capacity_bytes or self.host_needed_bytes <= self.host_capacity_bytes

    @property
    def verdict(self) -> str:
        """"yes", "tight" (fits by less than the margin) or "no"."""
        if not self.fits:
            return "no"
        return "tight" if self.headroom_bytes < self.margin_bytes else "yes"

    @property
    def headroom_bytes(self) -> int:
        if self.spare_bytes is not None:
            return self.spare_bytes
        return self.capacity_bytes - self.total_bytes

    @property
    def paged_on_device_bytes(self) -> int:
        """The paged states the device holds: as many as fit beside the rest."""
        return min(self.paged_bytes, max(0, self.capacity_bytes - self.total_bytes))

    @property
    def paged_on_host_bytes(self) -> int:
        """The paged states the driver keeps in host memory, moved in and out each step."""
        return self.paged_bytes - self.paged_on_device_bytes

    @property
    def model_bytes(self) -> int:
        """Everything but the runtime's fixed overhead and what lives outside the pool:
        what validation compares (on a GPU, torch.cuda.max_memory_reserved)."""
        return self.total_bytes - sum(self.breakdown.get(k, 0) for k in OUTSIDE_POOL)

    @property
    def allocated_bytes(self) -> int:
        """The live tensors without the allocator's slack (torch.cuda.max_memory_allocated)."""
        return self.model_bytes - self.breakdown.get("allocator_slack", 0)


def make_estimate(parts: dict[str, float], capacity: int, runtime: str, phase: str,
                  phases: dict[str, float] | None = None,
                  notes: tuple[str, ...] = (), host: bool = False) -> MemoryEstimate:
    """Round the parts to whole bytes and total them, so the parts always add up. `host`: a
    process on a CPU, less repeatable than a GPU's pool, keeps a wider margin."""
    breakdown = {k: int(round(v)) for k, v in parts.items()}
    pool = sum(v for k, v in breakdown.items() if k not in OUTSIDE_POOL)
    fraction = host_tight_fraction() if host else cuda_allocator().tight_fraction
    margin = max(breakdown.get("allocator_slack", 0), fraction * pool)
    return MemoryEstimate(
        total_bytes=sum(breakdown.values()), breakdown=breakdown, capacity_bytes=capacity,
        runtime=runtime, peak_phase=phase,
        phases={k: int(round(v)) for k, v in (phases or {}).items()}, notes=notes,
        margin_bytes=int(margin),
    )
