"""The optimizer step's time: its passes over parameters and states by kernel
(catalog/data/optimizers.toml), or the probe's timing of it on this machine."""

from __future__ import annotations

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.optimizers import optimizer_spec
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.roofline import OpTime, PhaseTime, phase_time
from gpuwise.workload.ops import Op
from gpuwise.workload.plans import TrainingPlan


def optimizer_state_dtype(plan: TrainingPlan) -> str:
    """fp32 master weights and states under mixed precision or adapters, else the compute's."""
    return "fp32" if plan.mixed or plan.finetune != "full" else plan.compute_dtype


def optimizer_ops(plan: TrainingPlan, trainable: float, device_kind: str = "gpu") -> list[Op]:
    """The optimizer's passes over its parameters and states (fp32 under mixed), by kernel
    (catalog/data/optimizers.toml): on an accelerator torch.optim runs fused or foreach
    kernels, on a CPU the single-tensor loop."""
    dtype = optimizer_state_dtype(plan)
    state = weight_format(dtype).bytes_per_element
    passes = optimizer_spec(plan.optimizer).passes(device_kind)
    return [Op("optimizer" if kernel == "binary" else f"optimizer_{kernel}", "elementwise",
               trainable * n / 2, trainable * n * state, kernel=kernel, dtype=dtype,
               streamed=True)
            for kernel, n in passes.items()]


def optimizer_phase(plan: TrainingPlan, trainable: float,
                    tensors: tuple[tuple[int, int], ...] | None, rates: DeviceRates,
                    overhead_s: float = 0.0) -> PhaseTime:
    """The optimizer step: probed on this machine where it was (this optimizer and state
    dtype, over `tensors`, the parameter tensors as (elements, how many); the probed step
    includes its loop's dispatch), else its passes over the states on the roofline plus
    `overhead_s` of dispatch."""
    ops = optimizer_ops(plan, trainable, rates.kind)
    dtype = optimizer_state_dtype(plan)
    probed = None
    if rates.kernels is not None and tensors:
        probed = rates.kernels.optimizer_s(plan.optimizer, tensors, dtype)
    if probed is None:
        return phase_time("optimizer", ops, rates, dtype, overhead_s)
    op = Op("optimizer", "elementwise", sum(o.flops for o in ops), sum(o.bytes for o in ops))
    return PhaseTime("optimizer", probed, probed, 0.0, 0.0, op.flops, op.bytes,
                     (OpTime(op, 0.0, probed, measured=True),))
