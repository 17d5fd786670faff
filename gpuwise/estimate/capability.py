"""What a device can run (docs/architecture.md, "What hardware can run"): a plan's compute
dtype, its weight kernel and its attention checked against the device, in one place, from the
catalogue (hardware.toml: vendor, arch, compute capability, the dtypes its matrix units run;
capabilities.toml: what each kernel, attention and dtype needs, with sources). An infeasible
plan gets one line and what runs in its place; the commands refuse it, and advise, check and
the precision search never offer it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.capabilities import Needs, needs
from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.errors import GpuwiseError
from gpuwise.workload.plans import InferencePlan, TrainingPlan


@dataclass(frozen=True)
class Device:
    """What the checks read of a device (a Hardware, or a device's rates)."""

    name: str
    kind: str
    vendor: str
    compute_capability: float  # 0: not NVIDIA, or not known
    matmul_dtypes: frozenset[str]  # empty: not known (nothing refused on that ground)

    @staticmethod
    def of(hw: Hardware) -> Device:
        return Device(hw.name, hw.kind, hw.vendor, hw.compute_capability,
                      frozenset(hw.peak_tflops))


@dataclass(frozen=True)
class Refusal:
    """Why `what` does not run on a device, and what does in its place ("" where nothing)."""

    what: str
    device: str
    why: str
    instead: str = ""

    def line(self) -> str:
        return f"{self.what} does not run on the {self.device}: {self.why}"


KIND_NAMES = {"cpu": "CPU", "gpu": "GPU", "apple": "Mac", "tpu": "TPU", "hpu": "Gaudi"}


def lacks(n: Needs, d: Device) -> str:
    """Why `d` cannot run what `n` describes ("" where it can)."""
    if n.kinds and d.kind not in n.kinds:
        return f"it runs on a {' or '.join(KIND_NAMES.get(k, k) for k in n.kinds)} only"
    if n.vendors and d.vendor not in n.vendors:
        names = " or ".join(v.upper() if v == "amd" else v.title() for v in n.vendors)
        return f"it runs on {names} GPUs only"
    if n.min_cc and d.vendor == "nvidia" and 0 < d.compute_capability < n.min_cc:
        return (f"it needs compute capability {n.min_cc:.1f} or later, this one has "
                f"{d.compute_capability:.1f}")
    if n.max_cc and d.vendor == "nvidia" and d.compute_capability > n.max_cc:
        return (f"it runs up to compute capability {n.max_cc:.1f}, this one has "
                f"{d.compute_capability:.1f}")
    if n.matmul and d.matmul_dtypes and n.matmul not in d.matmul_dtypes:
        return f"it computes in {n.matmul}, and this device has no {n.matmul} matrix units"
    return ""


def dtype_refusal(dtype: str, d: Device) -> Refusal | None:
    """A compute dtype the device's matrix units do not run (bf16 on a T4 or a V100)."""
    n = needs("dtype", dtype)
    if n is None or d.kind == "cpu" or not d.matmul_dtypes or dtype in d.matmul_dtypes:
        return None  # a CPU runs any dtype (its libraries convert where it has no units for it)
    instead = n.instead if n.instead in d.matmul_dtypes else ""
    return Refusal(dtype, d.name, f"its matrix units have no {dtype}", instead)


def weights_here(weights: str, d: Device) -> str:
    """The weights an expert runs on `d` for `weights`: the same, or where its compute dtype
    does not run there, the format computing in the dtype that does (bf16 -> fp16 on a T4)."""
    refused = dtype_refusal(weight_format(weights).compute_dtype, d)
    if refused is None or not refused.instead or weight_format(weights).quantised:
        return weights
    return refused.instead


def check_attention(plan: InferencePlan, hw: Hardware) -> None:
    """Refuse an attention `hw` cannot run, whatever the weights (check's rows share it)."""
    refused = attention_refusal(plan.attention, Device.of(hw))
    if refused is not None:
        raise GpuwiseError(refused.line(), _hint(refused))


def attention_refusal(attention: str, d: Device) -> Refusal | None:
    n = needs("attention", attention)
    why = lacks(n, d) if n is not None else ""
    if not why:
        return None
    return Refusal(f"--attention {attention}", d.name, why,
                   f"--attention {n.instead}" if n and n.instead else "")


def kernel_refusal(kernel: str, d: Device) -> Refusal | None:
    """A weight kernel `d` cannot run, with the kernel its runtime runs in its place where
    that one runs (fp8 W8A8 -> FP8 Marlin W8A16 on an A100)."""
    n = needs("kernel", kernel)
    why = lacks(n, d) if n is not None else ""
    if n is None or not why:
        return None
    fallback = needs("kernel", n.instead) if n.instead else None
    if fallback is None:
        return Refusal(f"the {kernel} kernel", d.name, why, n.instead)
    if also := lacks(fallback, d):  # nor what runs in its place elsewhere
        return Refusal(f"the {kernel} kernel", d.name, f"{why}; nor its {n.instead} ({also})")
    return Refusal(f"the {kernel} kernel", d.name, why, n.instead)


def plan_refusal(plan: InferencePlan, hw: Hardware) -> Refusal | None:
    """Why `plan` cannot run on `hw` as it stands (None: it can): its compute dtype (an
    unquantised format's: a quantised one's activations are its kernel's), its runtime's weight
    kernel for its format (one the runtime swaps for another is `kernel_here`'s), its
    attention. The runtime's own device kinds are checked by its time model."""
    d = Device.of(hw)
    fmt = plan.weight_format
    if not fmt.quantised and (refused := dtype_refusal(fmt.compute_dtype, d)):
        return refused
    if (refused := ggml_refusal(plan, d)) is not None:
        return refused
    if (own := _runtime_kernel(plan, hw)) is not None:
        kernel = plan.quant_kernel or own
        refused = kernel_refusal(kernel, d) if kernel else None
        if refused is not None and not (refused.instead and not plan.quant_kernel):
            return refused
    return attention_refusal(plan.attention, d)


def ggml_refusal(plan: InferencePlan, d: Device) -> Refusal | None:
    """A GGUF block type (a GGUF file's own, or the plan's GGUF format's) that no llama.cpp
    backend for `d` multiplies (TQ1_0 and TQ2_0 have no CUDA matmul)."""
    stored = plan.stored_weights.ggml_type if plan.stored_weights else ""
    gtype = (stored or (plan.weight_format.ggml_type if plan.weight_format.gguf else "")).lower()
    n = needs("ggml", gtype) if gtype else None
    why = lacks(n, d) if n is not None else ""
    return Refusal(f"the {gtype.upper()} kernel", d.name, why) if why else None


def _runtime_kernel(plan: InferencePlan, hw: Hardware) -> str | None:
    """The weight kernel the plan's runtime runs for its format ("" where it has none); None
    where no weight kernel runs (off a GPU, unquantised or GGUF weights)."""
    fmt = plan.weight_format
    if hw.kind != "gpu" or not fmt.quantised or fmt.other_bits:
        return None
    return runtime_speed(plan.runtime).kernels.get(fmt.id, "")


def kernel_here(plan: InferencePlan, hw: Hardware) -> InferencePlan:
    """`plan` with the weight kernel its runtime runs on `hw`: the runtime's own, or where that
    one cannot run there, the one it runs in its place (vLLM's fp8 on an A100: FP8 Marlin)."""
    kernel = None if plan.quant_kernel else _runtime_kernel(plan, hw)
    refused = kernel_refusal(kernel, Device.of(hw)) if kernel else None
    if refused is None or not refused.instead:
        return plan
    return replace(plan, quant_kernel=refused.instead)


def plan_here(plan: InferencePlan, hw: Hardware, weights_asked: bool = True) -> InferencePlan:
    """The plan as it runs on `hw`, or a GpuwiseError saying why it cannot and what runs in its
    place. Weights not asked for compute in a dtype the device runs (bf16 -> fp16 on a T4)."""
    if not weights_asked:
        plan = replace(plan, weights=weights_here(plan.weights, Device.of(hw)))
    refused = plan_refusal(plan, hw)
    if refused is not None:
        raise GpuwiseError(refused.line(), _hint(refused))
    return kernel_here(plan, hw)


def _hint(refused: Refusal) -> str:
    if refused.instead.startswith("--"):
        return f"{refused.instead} runs there"
    if refused.what.startswith("the "):
        return "another --weights or --runtime: `gpuwise check MODEL --on DEVICE` lists what runs there"
    return f"--weights {refused.instead} runs there" if refused.instead else "another device"


def precisions_here(plan: InferencePlan, hw: Hardware,
                    precisions: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of `precisions`, those `plan` runs at on `hw` (one the device cannot compute in gives
    its place to the one it can: bf16 -> fp16 on a T4), and a line for each left out."""
    kept: list[str] = []
    refused: list[str] = []
    for p in precisions:
        here = weights_here(p, Device.of(hw))
        why = plan_refusal(replace(plan, weights=here), hw)
        if why is not None:
            refused.append(f"{p}: not offered, {why.line()}")
        elif here not in kept:
            kept.append(here)
    return tuple(kept), tuple(refused)


# bitsandbytes' optimizers run where its kernels do (catalog/data/capabilities.toml bnb-nf4)
BITSANDBYTES_OPTIMIZERS = ("adamw8bit", "paged_adamw8bit")


def training_refusal(plan: TrainingPlan, hw: Hardware) -> Refusal | None:
    """Why a training plan cannot run on `hw` (None: it can): its compute dtype (bf16 on a T4:
    `--dtype mixed-fp16` runs there), QLoRA's bitsandbytes 4-bit base and its 8-bit
    optimizers (NVIDIA GPUs only), its attention."""
    d = Device.of(hw)
    if refused := dtype_refusal(plan.compute_dtype, d):
        instead = training_dtype_here(plan.dtype, hw)
        return replace(refused, what=f"--dtype {plan.dtype}",
                       instead=f"--dtype {instead}" if instead != plan.dtype else "")
    if plan.finetune == "qlora" and (refused := kernel_refusal("bnb-nf4", d)):
        return replace(refused, what="QLoRA (a bitsandbytes 4-bit base)")
    if plan.optimizer in BITSANDBYTES_OPTIMIZERS and (refused := kernel_refusal("bnb-nf4", d)):
        return replace(refused, what=f"--optimizer {plan.optimizer} (bitsandbytes)",
                       instead="--optimizer adamw")
    return attention_refusal(plan.attention, d)


def training_dtype_here(dtype: str, hw: Hardware) -> str:
    """A training dtype `hw` computes in: `dtype`, or its stand-in (mixed-fp16 on a T4)."""
    compute = dtype.removeprefix("mixed-")
    refused = dtype_refusal(compute, Device.of(hw))
    return dtype.replace(compute, refused.instead) if refused and refused.instead else dtype


def check_training(plan: TrainingPlan, hw: Hardware) -> None:
    refused = training_refusal(plan, hw)
    if refused is not None:
        hint = f"{refused.instead} runs there" if refused.instead else "another device"
        raise GpuwiseError(refused.line(), hint)
