"""One plan from the options a command takes (docs/architecture.md, "One plan"): every command
that takes a model and a deployment (check, infer, serve) builds its InferencePlan here, from
the same option group with the same names, defaults and units, so that they answer for the
same deployment. The plan checks its own values (workload/plans.py); where the weights come
from (a checkpoint's exact bytes, or a format) is decided once, by plan_weights."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.app.checkpoint_weights import plan_weights
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import plan_here
from gpuwise.estimate.runtimes import runtime_unit, runtime_units
from gpuwise.workload import from_config
from gpuwise.workload.limits import check_count
from gpuwise.workload.plans import InferencePlan, check_experts


@dataclass(frozen=True)
class Deployment:
    """How a model is run: the option group of check, infer and serve (`--runtime`,
    `--weights`, `--kv-dtype`, ...). None: the runtime's or the checkpoint's own."""

    runtime: str = "transformers"
    weights: str | None = None  # None: as stored in a checkpoint, else as shipped, else bf16
    kv_dtype: str | None = None  # None: the compute dtype (llama.cpp: f16)
    ctx: int | None = None  # context allocated up front (llama.cpp n_ctx, vLLM max_model_len)
    attention: str = "sdpa"
    gpu_memory_utilization: float | None = None
    threads: int | None = None  # llama.cpp on a CPU: None is one a core
    quant_kernel: str = ""  # "": the runtime's own
    gpu_layers: int | None = None  # llama.cpp -ngl; None: all on the GPU
    tp: int = 1  # tensor-parallel devices a replica
    expert_parallel: bool = False  # vLLM --enable-expert-parallel, SGLang --ep-size
    cpu_moe: bool = False  # llama.cpp --cpu-moe: every layer's experts in host memory
    n_cpu_moe: int | None = None  # llama.cpp --n-cpu-moe N: the first N layers' experts
    gpus: int | None = None  # devices in all: gpus / tp replicas; None: tp (one replica)
    logits: str = "last"
    allocator: str = "glibc"
    fuse_layers: bool = False
    expandable_segments: bool = False


@dataclass(frozen=True)
class Workload:
    """What one request asks: sequences in a batch, prompt and generated tokens."""

    batch: int = 1
    prompt_tokens: int = 512
    new_tokens: int = 128


@dataclass(frozen=True)
class Planned:
    plan: InferencePlan
    weights_source: str  # where the weights' bytes come from (a checkpoint's, or estimated)
    replicas: int = 1  # --gpus / --tp


def build_plan(model: ResolvedModel, deployment: Deployment, workload: Workload,
               hw: Hardware | None = None) -> Planned:
    """The plan of running `model` as `deployment` for `workload`; on `hw`, as it runs there
    (estimate/capability.py: weights not asked for in a dtype it runs, the kernel its runtime
    runs there), or an error saying why it cannot and what runs in its place."""
    d = deployment
    chosen = plan_weights(model, d.runtime, d.weights)
    plan = InferencePlan(batch=workload.batch, prompt_tokens=workload.prompt_tokens,
                         new_tokens=workload.new_tokens, weights=chosen["weights"],
                         stored_weights=chosen["stored_weights"], kv_dtype=d.kv_dtype,
                         attention=d.attention, logits=d.logits, runtime=d.runtime,
                         context_alloc=d.ctx, gpu_memory_utilization=d.gpu_memory_utilization,
                         threads=d.threads, quant_kernel=d.quant_kernel, gpu_layers=d.gpu_layers, tp=d.tp,
                         allocator=d.allocator, fuse_layers=d.fuse_layers,
                         expandable_segments=d.expandable_segments,
                         expert_parallel=d.expert_parallel)  # checks --tp first
    plan = _with_experts(model, d, plan)
    source = chosen["source"]
    if hw is not None:
        try:
            plan = plan_here(plan, hw, weights_asked=d.weights is not None)
        except GpuwiseError as exc:
            if not chosen.get("shipped"):
                raise
            # the format it ships in has no kernel here: its weights dequantised, as
            # transformers does where MXFP4's kernels do not run (a bf16 copy for vLLM)
            plan = plan_here(replace(plan, weights="bf16"), hw, weights_asked=False)
            source = (f"estimated ({plan.weights}): the {chosen['weights']} it ships in does "
                      f"not run here ({exc.message.removeprefix('the ')})")
    gpus = d.tp if d.gpus is None else d.gpus
    check_count(gpus, "--gpus", 1 << 16)
    if gpus % d.tp:
        raise GpuwiseError(f"--gpus {gpus} is not a multiple of --tp {d.tp}",
                           "each replica runs on --tp devices")
    return Planned(plan, source, gpus // d.tp)


def _with_experts(model: ResolvedModel, d: Deployment, plan: InferencePlan) -> InferencePlan:
    """The expert options on the plan: --cpu-moe as every layer's experts, --n-cpu-moe N as
    the first N layers'; each refused in one line under a runtime that has no such option,
    on a dense model, or past the model's layers."""
    if not (d.expert_parallel or d.cpu_moe or d.n_cpu_moe is not None):
        return plan
    if d.cpu_moe and d.n_cpu_moe is not None:
        raise GpuwiseError("--cpu-moe and --n-cpu-moe both say which experts stay on the host",
                           "give one: --cpu-moe (every layer) or --n-cpu-moe N (the first N)")
    unit = runtime_unit(plan.runtime)
    for field, flag, given in (("expert_parallel", "--expert-parallel", d.expert_parallel),
                               ("cpu_moe_layers", "--cpu-moe" if d.cpu_moe else "--n-cpu-moe",
                                d.cpu_moe or d.n_cpu_moe is not None)):
        if given and field not in unit.reads:
            readers = sorted(u.id for u in runtime_units().values() if field in u.reads)
            raise GpuwiseError(f"{flag} applies to {' and '.join(readers)}, not {unit.id}",
                               f"run it with --runtime {' or '.join(readers)}, or drop {flag}")
    arch = from_config(model.config, model.name)
    layers = arch.num_layers if d.cpu_moe else d.n_cpu_moe
    plan = replace(plan, cpu_moe_layers=layers)
    check_experts(arch, plan)
    return plan
