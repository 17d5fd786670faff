"""What host memory costs a training step in time (docs/speed.md, "Training"): the copies offloading makes over the host link where compute does not hide
them, an optimizer step run on the host's cores, and bitsandbytes' paged states the driver
moves in and out of the device.

- `--offload optimizer` (DeepSpeed ZeRO-Offload): gradients go to the host during the
  backward, CPUAdam steps the fp32 states there in one fused pass, and the updated weights
  come back in chunks while it runs (the step is the longer of the two).
- `--offload params` (FSDP2 CPUOffloadPolicy): each layer's weights come to the device for
  the forward and again for the backward (prefetched a layer ahead), gradients go back, and
  torch.optim steps on the host (its single-tensor loop).
- `--offload activations` (torchtune): saved activations go to the host as the forward
  makes them and come back for the backward, on a side stream.
- Paged optimizer states beyond the room the rest leaves on the device are migrated in for
  the optimizer step and out again (each byte twice) at the driver's migration rate.

Copies in one direction overlap copies in the other (the link is full duplex) and the
phase's compute; what exceeds the phase is charged. Constants: catalog/data/stacks.toml
[host_transfer].
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.stacks import stack_value
from gpuwise.estimate.memory.activations import saved_with_policy
from gpuwise.estimate.memory.stack_features import offloaded_activations
from gpuwise.estimate.memory.training import param_bytes
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.optimizer_step import optimizer_ops
from gpuwise.workload import Architecture
from gpuwise.workload.plans import TrainingPlan


@dataclass(frozen=True)
class HostBytes:
    """Per device, per step: what crosses the host link in each phase, and what the
    optimizer step on the host reads and writes (0: it runs on the device)."""

    to_device_forward: float = 0.0
    to_host_forward: float = 0.0
    to_device_backward: float = 0.0
    to_host_backward: float = 0.0
    weights_back: float = 0.0  # updated weights copied to the device during the host step
    host_step: float = 0.0
    paged_on_host: float = 0.0  # paged states the device has no room for

    @property
    def any(self) -> bool:
        return any((self.to_device_forward, self.to_host_forward, self.to_device_backward,
                    self.to_host_backward, self.weights_back, self.host_step,
                    self.paged_on_host))


@dataclass(frozen=True)
class HostTraffic:
    """Seconds of a step spent on host memory that the device's compute does not hide."""

    copies_s: float = 0.0  # offload's copies beyond the forward's and backward's compute
    host_step_s: float = 0.0  # the optimizer step on the host (with the weights' way back)
    paging_s: float = 0.0  # paged states migrated in and out
    link_known: bool = True  # False: the device's host link is not in the catalogue

    @property
    def seconds(self) -> float:
        return self.copies_s + self.host_step_s + self.paging_s


def _rate(rates: DeviceRates, key: str) -> float:
    return rates.host_link_bytes_per_s * float(stack_value("host_transfer", key))


def host_traffic(moved: HostBytes, plan: TrainingPlan, rates: DeviceRates, forward_s: float,
                 backward_s: float) -> HostTraffic:
    """The exposed seconds of `moved` on `rates`' host link and host memory, the forward
    and backward taking `forward_s` and `backward_s` on the device."""
    if not moved.any:
        return HostTraffic()
    copy = _rate(rates, "pinned_copy_efficiency")
    if not copy:
        return HostTraffic(link_known=False)
    forward = max(moved.to_device_forward, moved.to_host_forward) / copy
    backward = max(moved.to_device_backward, moved.to_host_backward) / copy
    copies = max(0.0, forward - forward_s) + max(0.0, backward - backward_s)
    step = 0.0
    if moved.host_step:
        sharing = min(plan.gpus, int(stack_value("host_transfer", "gpus_per_host")))
        host = rates.host_memory_bytes_per_s / max(1, sharing)
        step = max(moved.host_step / host if host else 0.0, moved.weights_back / copy)
    paging = 0.0
    if moved.paged_on_host:
        paging = 2 * moved.paged_on_host / _rate(rates, "managed_migration_efficiency")
    return HostTraffic(copies, step, paging)


def steps_on_host(plan: TrainingPlan) -> bool:
    return "optimizer" in plan.offload or "params" in plan.offload


def _host_step_bytes(plan: TrainingPlan, trainable: float, device_kind: str) -> float:
    return sum(op.bytes * op.count for op in optimizer_ops(plan, trainable, device_kind))


def host_bytes(arch: Architecture, plan: TrainingPlan, paged_on_host: float = 0.0) -> HostBytes:
    """What one device's step moves over the host link and steps on the host, by the
    plan's --offload (host_traffic.py says how each stack does it)."""
    if not plan.offload:  # nothing moved but the paged states (a hot path: every step time)
        return HostBytes(paged_on_host=paged_on_host)
    pb = param_bytes(arch, plan)
    sharded = plan.zero >= 1 or (plan.sharding == "fsdp2" and plan.data_parallel > 1)
    shard = pb.trainable / (plan.data_parallel if sharded else 1)
    moved: dict[str, float] = {"paged_on_host": paged_on_host}
    if "params" in plan.offload:  # FSDP2 CPUOffloadPolicy: torch.optim's loop on the host
        moved.update(to_device_forward=pb.weights, to_host_backward=pb.gradients,
                     to_device_backward=pb.weights if plan.reshard_after_forward else 0.0,
                     host_step=_host_step_bytes(plan, shard, "cpu"))
    elif "optimizer" in plan.offload:  # ZeRO-Offload: CPUAdam's one fused pass
        moved.update(to_host_backward=pb.gradients,
                     weights_back=pb.weights * shard / max(1.0, pb.trainable),
                     host_step=_host_step_bytes(plan, shard, "gpu"))
    if "activations" in plan.offload:
        mode = "mixed-bf16" if plan.mixed else ("fp32" if plan.dtype == "fp32" else "bf16")
        layers = float(saved_with_policy(arch, plan.batch, plan.seq, mode, plan.attention,
                                         plan.checkpointing, plan.checkpointing_policy,
                                         plan.tp, runtime_unit(plan.runtime).torch_compile,
                                         )["layers"])
        acts = layers - offloaded_activations(layers, arch)
        moved["to_host_forward"] = acts
        moved["to_device_backward"] = moved.get("to_device_backward", 0.0) + acts
    return HostBytes(**moved)
