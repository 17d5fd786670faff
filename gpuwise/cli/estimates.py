"""The estimate commands: check, infer, train, probe, the catalogues and validate."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import Annotated, Any

import typer

from gpuwise.cli.common import (
    NEW_TOKENS,
    PROMPT_TOKENS,
    App,
    Attention,
    Batch,
    Checkpointing,
    Dtype,
    Group,
    Html,
    Json,
    Model,
    NewTokens,
    On,
    Ops,
    Optimizer,
    Prompt,
    Seq,
    app,
    emit,
    hardware_named,
    html_output,
    model_named,
    roofs,
    write_html,
    wrote,
)
from gpuwise.cli.config_option import ConfigFile, ConfigFormatName, config_used
from gpuwise.cli.runtime_options import (
    CpuMoe,
    Ctx,
    ExpertParallel,
    GpuLayers,
    Gpus,
    GpuUtil,
    KvDtype,
    NCpuMoe,
    QuantKernel,
    Runtime,
    Threads,
    Tp,
    TrainRuntime,
    Weights,
)
from gpuwise.cli.stack_options import (
    AdapterDtype,
    CheckpointingPolicy,
    DoubleQuant,
    ExpandableSegments,
    KbitPrepare,
    Loss,
    LossChunks,
    Offload,
    OptimizerInBackward,
    QuantComputeDtype,
    Reshard,
    Sharding,
    stack_fields,
)
from gpuwise.errors import GpuwiseError


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        sys.stdout.write(f"gpuwise {version('gpuwise')}\n")
        raise typer.Exit()


Version = Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                       help="print gpuwise's version and exit")]
Wide = Annotated[bool, typer.Option("--wide", help="every column (default: the columns that "
                                    "fit 80 characters)")]
Allocator = Annotated[str, typer.Option(
    "--allocator", help="a CPU process's host allocator: glibc (as a process starts, default), "
    "glibc-mmap64k (MALLOC_MMAP_THRESHOLD_=65536: live tensors only), jemalloc or tcmalloc "
    "(LD_PRELOAD)")]


@app.callback()
def main_job(ctx: typer.Context, as_json: Json = False, version: Version = False) -> None:
    """With no command: what of the model catalogue runs on this machine."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwise.app.local import this_machine
    from gpuwise.report.estimate_views import local_view

    emit(local_view(this_machine()), as_json)


@app.command()
def check(model: Model, on: On = "local", prompt: Prompt = PROMPT_TOKENS,
          new_tokens: NewTokens = NEW_TOKENS, batch: Batch = 1, runtime: Runtime = "transformers",
          kv_dtype: KvDtype = None, attention: Attention = "sdpa", ctx: Ctx = None,
          gpu_memory_utilization: GpuUtil = None, threads: Threads = None,
          quant_kernel: QuantKernel = "", gpu_layers: GpuLayers = None, tp: Tp = 1, gpus: Gpus = None,
          expert_parallel: ExpertParallel = False, cpu_moe: CpuMoe = False,
          n_cpu_moe: NCpuMoe = None, as_json: Json = False, html: Html = None, config: ConfigFile = None,
          config_format: ConfigFormatName = None) -> None:
    """Can I run it? Memory across weight precisions, and the largest context that fits."""
    from gpuwise.app.check import check as check_model
    from gpuwise.app.deployment import Deployment, Workload, build_plan
    from gpuwise.report.estimate_views import check_view, with_config

    html = html_output(html)
    resolved, arch = model_named(model)
    deployment = Deployment(runtime=runtime, kv_dtype=kv_dtype, attention=attention, ctx=ctx,
                            gpu_memory_utilization=gpu_memory_utilization, threads=threads,
                            quant_kernel=quant_kernel, gpu_layers=gpu_layers, tp=tp,
                            gpus=gpus, expert_parallel=expert_parallel, cpu_moe=cpu_moe,
                            n_cpu_moe=n_cpu_moe)
    hw = hardware_named(on)
    plan = build_plan(resolved, deployment, Workload(batch, prompt, new_tokens), hw).plan
    answer = check_model(resolved, arch, hw, plan)
    emit(with_config(check_view(answer), config_used()), as_json)
    write_html(html, lambda pages: pages.check_page(answer))


@app.command()
def infer(
    model: Model, on: On = "local", batch: Batch = 1, prompt: Prompt = PROMPT_TOKENS,
    new_tokens: NewTokens = NEW_TOKENS, weights: Weights = None, kv_dtype: KvDtype = None,
    attention: Attention = "sdpa",
    logits: Annotated[str, typer.Option(help="logits kept: last (generate's default) or "
                                        "all")] = "last",
    runtime: Runtime = "transformers", ctx: Ctx = None, gpu_memory_utilization: GpuUtil = None,
    threads: Threads = None, quant_kernel: QuantKernel = "", gpu_layers: GpuLayers = None,
    tp: Tp = 1, gpus: Gpus = None, expert_parallel: ExpertParallel = False,
    cpu_moe: CpuMoe = False, n_cpu_moe: NCpuMoe = None,
    fuse_layers: Annotated[bool, typer.Option(
        "--fuse-layers", help="AutoAWQ's from_quantized(fuse_layers=True): q, k and v fused at "
        "load, the KV cache allocated whole for --ctx positions (default: the model's)")] = False,
    ops: Ops = False, allocator: Allocator = "glibc",
    expandable_segments: ExpandableSegments = False, as_json: Json = False, html: Html = None,
    config: ConfigFile = None, config_format: ConfigFormatName = None,
) -> None:
    """Memory and time of generating text with a model, a .gguf or a .safetensors checkpoint,
    under transformers (default), torch.compile, vLLM, SGLang or llama.cpp."""
    from gpuwise.app.deployment import Deployment, Workload, build_plan
    from gpuwise.app.infer import infer as infer_model
    from gpuwise.report.estimate_views import infer_view, with_config

    html = html_output(html)
    resolved, arch = model_named(model)
    deployment = Deployment(runtime=runtime, weights=weights, kv_dtype=kv_dtype, ctx=ctx,
                            attention=attention, gpu_memory_utilization=gpu_memory_utilization,
                            threads=threads, quant_kernel=quant_kernel, gpu_layers=gpu_layers,
                            logits=logits, allocator=allocator, fuse_layers=fuse_layers,
                            expandable_segments=expandable_segments, tp=tp, gpus=gpus,
                            expert_parallel=expert_parallel, cpu_moe=cpu_moe,
                            n_cpu_moe=n_cpu_moe)
    hw = hardware_named(on)
    planned = build_plan(resolved, deployment, Workload(batch, prompt, new_tokens), hw)
    answer = infer_model(resolved, arch, hw, planned.plan, planned.weights_source,
                         planned.replicas)
    emit(with_config(infer_view(answer, ops), config_used()), as_json)
    write_html(html, lambda pages: pages.infer_page(answer, roofs(answer.hardware)))


@app.command()
def train(
    model: Model, on: On = "local", batch: Batch = 1, seq: Seq = 2048,
    dtype: Dtype = None, optimizer: Optimizer = "adamw",
    finetune: Annotated[str, typer.Option(help="full, lora or qlora (LoRA on a 4-bit base)")] = "full",
    lora_rank: Annotated[int, typer.Option(help="LoRA rank r (with --finetune lora or "
                                           "qlora)")] = 16,
    lora_targets: Annotated[str, typer.Option(
        help="comma list of the modules LoRA adapts, e.g. q_proj,v_proj (default: the "
             "attention and MLP projections)", show_default=False)] = "",
    checkpointing: Checkpointing = False,
    gpus: Gpus = None,
    zero: Annotated[int, typer.Option(help="ZeRO stage over --gpus: 0 none, 1 optimizer "
                                      "states, 2 + gradients, 3 + weights")] = 0,
    tp: Tp = 1,
    attention: Attention = "sdpa", ops: Ops = False,
    train_tokens: Annotated[float | None, typer.Option(
        help="tokens to train on, e.g. 2e9: adds the time to train them (default: none)")] = None,
    runtime: TrainRuntime = "transformers", allocator: Allocator = "glibc",
    loss: Loss = "full", loss_chunks: LossChunks = 8,
    optimizer_in_backward: OptimizerInBackward = False, offload: Offload = "",
    sharding: Sharding = "zero", reshard_after_forward: Reshard = True,
    checkpointing_policy: CheckpointingPolicy = "full", double_quant: DoubleQuant = True,
    quant_compute_dtype: QuantComputeDtype = None, kbit_prepare: KbitPrepare = True,
    adapter_dtype: AdapterDtype = "fp32", expandable_segments: ExpandableSegments = False,
    as_json: Json = False, html: Html = None, config: ConfigFile = None,
    config_format: ConfigFormatName = None,
) -> None:
    """Memory of one training step: weights, gradients, optimizer, activations, under the
    memory features of the stack named (torchtune, Liger, DeepSpeed, FSDP2, torchtitan) or
    the one a --config file runs."""
    from gpuwise.app.train import default_dtype
    from gpuwise.app.train import train as train_model
    from gpuwise.report.estimate_views import train_view, with_config

    html = html_output(html)
    hw = hardware_named(on)
    plan = _training_plan(batch, seq, dtype or default_dtype(hw), optimizer, finetune, lora_rank,
                          lora_targets,
                          checkpointing, tp if gpus is None else gpus, zero, tp, attention,
                          runtime, allocator)
    plan = replace(plan, **stack_fields(
        expandable_segments, loss, loss_chunks, optimizer_in_backward, offload, sharding,
        reshard_after_forward, checkpointing_policy, double_quant, quant_compute_dtype,
        kbit_prepare, adapter_dtype))
    if train_tokens is not None and not (0 <= train_tokens < math.inf):
        raise GpuwiseError(f"--train-tokens must be positive, got {train_tokens:g}",
                           "give the number of tokens to train on, e.g. 2e9")
    answer = train_model(*model_named(model), hw, plan, train_tokens or 0.0)
    used = config_used()
    if used is not None:  # the answer names the stack the file runs
        answer = replace(answer, stack=used.read.stack)
    emit(with_config(train_view(answer, ops), used), as_json)
    if html is not None:
        from gpuwise.app.train import batch_sweep

        sweep = batch_sweep(answer)
        write_html(html, lambda pages: pages.train_page(answer, roofs(answer.hardware), sweep))


def _training_plan(batch: int, seq: int, dtype: str, optimizer: str, finetune: str,
                   lora_rank: int, lora_targets: str, checkpointing: bool, gpus: int, zero: int,
                   tp: int, attention: str, runtime: str = "transformers",
                   allocator: str = "glibc") -> Any:
    from gpuwise.workload.plans import LORA_TARGETS, TrainingPlan

    targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip()) or LORA_TARGETS
    return TrainingPlan(batch=batch, seq=seq, dtype=dtype, optimizer=optimizer,
                        finetune=finetune, lora_rank=lora_rank, lora_targets=targets,
                        checkpointing=checkpointing, attention=attention, gpus=gpus, zero=zero,
                        tp=tp, runtime=runtime, allocator=allocator)


@app.command()
def probe(
    quick: Annotated[bool, typer.Option("--quick", help="fewer sizes: under 15 s on a 2-core "
                                        "CPU (with --runtime llama.cpp about 3 minutes)")] = False,
    repeat: Annotated[int, typer.Option(help="probes to take, 1 to 10; each reading is their "
                                        "median (a machine whose speed moves: 3)")] = 1,
    runtime: Annotated[str, typer.Option(
        "--runtime", help="transformers (its per-op costs, where installed) or llama.cpp "
        "(also times llama.cpp here through llama-cpp-python: 9-20 minutes on a 2-core CPU, "
        "longer while other processes disturb its timings; about 3 with --quick)")] = "transformers",
    as_json: Json = False, html: Html = None,
) -> None:
    """Measure this machine (bandwidth, matmul by size and dtype, per-op overhead, and a
    runtime's own speed) and save it."""
    from gpuwise.app.probe import probe as probe_machine
    from gpuwise.report.probe_view import probe_view
    from gpuwise.report.progress import progress_bar

    html = html_output(html)
    if not 1 <= repeat <= 10:
        raise GpuwiseError(f"--repeat {repeat}: takes 1 to 10 probes", "3 is enough for a "
                           "machine whose speed moves; 1 (the default) for a steady one")
    with progress_bar(quiet=as_json) as progress:
        answer = probe_machine(quick, repeat, progress, runtime)
    emit(probe_view(answer), as_json)
    if as_json:  # the terminal view names it in its last line
        wrote(answer.saved_to, "the probe profile" + ("" if answer.profile.trusted else
                                                      ", not trusted: set aside"))
    if html is not None:
        from gpuwise.app.roofs import catalogue_roof

        spec = catalogue_roof(answer.profile.spec_id)
        write_html(html, lambda pages: pages.probe_page(answer, spec))


Vendor = Annotated[str | None, typer.Option(
    "--vendor", help="only this vendor's devices: nvidia, amd, apple, intel or google "
    "(default: every vendor)")]
HardwareKind = Annotated[str | None, typer.Option(
    "--kind", help="only devices of this kind: gpu, apple, tpu or cpu (default: every kind)")]
MinMemory = Annotated[float | None, typer.Option(
    "--min-memory", help="only devices with at least this much memory, GiB (default: any)")]
MaxPrice = Annotated[float | None, typer.Option(
    "--max-price", help="only devices sold at a list price of at most this, USD; devices "
                        "only rented are left out (default: any price)")]


@app.command()
def hardware(vendor: Vendor = None, kind: HardwareKind = None, min_memory: MinMemory = None,
             max_price: MaxPrice = None, wide: Wide = False, as_json: Json = False) -> None:
    """List the hardware catalogue: the ids and aliases `--on` takes, spec values with their
    sources; filters combine (`--vendor amd --min-memory 192`)."""
    from gpuwise.app import catalogue
    from gpuwise.report.estimate_views import hardware_view

    devices = catalogue.hardware(vendor, kind, min_memory, max_price)
    emit(hardware_view(devices, wide), as_json)


@app.command()
def models(wide: Wide = False, as_json: Json = False) -> None:
    """List the model catalogue: the ids and aliases MODEL takes, with their sizes."""
    from gpuwise.app import catalogue
    from gpuwise.report.estimate_views import models_view

    emit(models_view(catalogue.models(), wide), as_json)


validate_app = App(cls=Group, help="Run a plan for real here (needs torch) and compare with "
                   "the estimate. Smaller defaults than infer/train: it really runs, on this "
                   "machine's CPU or GPU.")
app.add_typer(validate_app, name="validate")

Memory = Annotated[bool, typer.Option(help="compare peak memory")]
Time = Annotated[bool, typer.Option(help="compare times (medians after a warm-up)")]


@validate_app.command("infer")
def validate_infer(
    model: Model, batch: Batch = 1, prompt: Prompt = PROMPT_TOKENS,
    new_tokens: Annotated[int, typer.Option(
        help="tokens generated per request (infer's default is 128; fewer here: each one "
             "really runs)")] = 32,
    weights: Annotated[str, typer.Option(help="weight precision of the random weights: fp32, "
                                         "bf16 or fp16")] = "bf16",
    attention: Attention = "sdpa", memory: Memory = True, time: Time = True,
    allocator: Allocator = "glibc", as_json: Json = False,
) -> None:
    """Generate with random weights here; compare peak memory and times with the estimates."""
    from gpuwise.app.deployment import Deployment, Workload, build_plan

    deployment = Deployment(weights=weights, attention=attention, allocator=allocator)
    _validate(model, lambda resolved: build_plan(resolved, deployment,
                                                 Workload(batch, prompt, new_tokens)).plan,
              as_json, memory, time)


@validate_app.command("train")
def validate_train(
    model: Model, batch: Batch = 1,
    seq: Annotated[int, typer.Option(help="tokens per training sequence (train's default is "
                                     "2048; shorter here: the steps really run)")] = 256,
    dtype: Annotated[str, typer.Option(help="training precision: fp32, bf16, fp16, mixed-bf16 "
                                       "or mixed-fp16 (train's default is mixed-bf16; fp32 "
                                       "here: what a CPU runs fast)")] = "fp32",
    optimizer: Optimizer = "adamw", checkpointing: Checkpointing = False,
    attention: Attention = "sdpa", memory: Memory = True, time: Time = True,
    allocator: Allocator = "glibc", as_json: Json = False,
) -> None:
    """Run training steps with random weights here; compare memory and step time."""
    plan = _training_plan(batch, seq, dtype, optimizer, "full", 16, "", checkpointing, 1, 0, 1,
                          attention, allocator=allocator)
    _validate(model, lambda _: plan, as_json, memory, time)


def _validate(model: str, plan_of: Any, as_json: bool, memory: bool, timing: bool) -> None:
    """Run the plan `plan_of(resolved model)` for real here and compare."""
    from gpuwise.app.validate import validate
    from gpuwise.report.validate_view import validate_view

    resolved, arch = model_named(model)
    plan = plan_of(resolved)
    result = validate(resolved.config, arch, plan, quiet=as_json, memory=memory, timing=timing)
    emit(validate_view(resolved, arch, plan, result, memory, timing), as_json)
