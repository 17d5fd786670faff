"""The estimate commands: check, infer, train, probe, the catalogues and validate."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpuwise.cli.common import (
    Attention,
    Batch,
    Json,
    On,
    app,
    emit,
    hardware_named,
    model_named,
)
from gpuwise.cli.runtime_options import Ctx, GpuUtil, Runtime, Weights
from gpuwise.errors import GpuwiseError


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        sys.stdout.write(f"gpuwise {version('gpuwise')}\n")
        raise typer.Exit()


Version = Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                       help="print gpuwise's version and exit")]  # fmt: skip


@app.callback()
def main_job(ctx: typer.Context, as_json: Json = False, version: Version = False) -> None:
    """With no command: what of the model catalogue runs on this machine."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwise.app.local import this_machine
    from gpuwise.report.estimate_views import local_view

    emit(local_view(this_machine()), as_json)


@app.command()
def check(model: str, on: On = "local", prompt: int = 2048, new_tokens: int = 256,
          batch: Batch = 1, runtime: Runtime = "transformers", ctx: Ctx = None,
          gpu_memory_utilization: GpuUtil = None, as_json: Json = False) -> None:  # fmt: skip
    """Can I run it? Memory across weight precisions, and the largest context that fits."""
    from gpuwise.app.check import check as check_model
    from gpuwise.app.checkpoint_weights import plan_weights
    from gpuwise.report.estimate_views import check_view
    from gpuwise.workload.plans import InferencePlan

    resolved, arch = model_named(model)
    chosen = plan_weights(resolved, runtime, None)
    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens,
                         weights=chosen["weights"], stored_weights=chosen["stored_weights"],
                         runtime=runtime, context_alloc=ctx,
                         gpu_memory_utilization=gpu_memory_utilization)  # fmt: skip
    emit(check_view(check_model(resolved, arch, hardware_named(on), plan)), as_json)


@app.command()
def infer(
    model: str, on: On = "local", batch: Batch = 1,
    prompt: Annotated[int, typer.Option(help="prompt tokens")] = 512,
    new_tokens: Annotated[int, typer.Option(help="tokens to generate")] = 128,
    weights: Weights = None,
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype (default: compute)")] = None,
    attention: Attention = "sdpa",
    logits: Annotated[str, typer.Option(help="last (generate's default) or all")] = "last",
    runtime: Runtime = "transformers", ctx: Ctx = None, gpu_memory_utilization: GpuUtil = None,
    ops: Annotated[bool, typer.Option("--ops", help="print the per-operation table")] = False,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Memory of generating text with a model, a .gguf or a .safetensors checkpoint, under
    transformers (default), llama.cpp or vLLM."""
    from gpuwise.app.checkpoint_weights import plan_weights
    from gpuwise.app.infer import infer as infer_model
    from gpuwise.report.estimate_views import infer_view
    from gpuwise.workload.plans import InferencePlan

    resolved, arch = model_named(model)
    chosen = plan_weights(resolved, runtime, weights)
    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens,
                         weights=chosen["weights"], stored_weights=chosen["stored_weights"],
                         kv_dtype=kv_dtype, attention=attention, logits=logits, runtime=runtime,
                         context_alloc=ctx, gpu_memory_utilization=gpu_memory_utilization)  # fmt: skip
    answer = infer_model(resolved, arch, hardware_named(on), plan, chosen["source"])
    emit(infer_view(answer, ops), as_json)


@app.command()
def train(
    model: str, on: On = "local", batch: Batch = 1,
    seq: Annotated[int, typer.Option(help="tokens per sequence")] = 2048,
    dtype: Annotated[str, typer.Option(help="fp32, bf16, fp16, mixed-bf16, mixed-fp16")] = "mixed-bf16",
    optimizer: Annotated[str, typer.Option(help="adamw, sgd, adafactor, adamw8bit")] = "adamw",
    finetune: Annotated[str, typer.Option(help="full, lora or qlora")] = "full",
    lora_rank: int = 16,
    lora_targets: Annotated[str, typer.Option(help="comma list of q_proj,k_proj,...")] = "",
    checkpointing: Annotated[bool, typer.Option("--checkpointing")] = False,
    gpus: int = 1, zero: int = 0, tp: int = 1, attention: Attention = "sdpa",
    ops: Annotated[bool, typer.Option("--ops", help="print the per-operation table")] = False,
    train_tokens: Annotated[float, typer.Option(help="tokens to train on: time to train")] = 0,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Memory of one training step: weights, gradients, optimizer, activations."""
    from gpuwise.app.train import train as train_model
    from gpuwise.report.estimate_views import train_view

    plan = _training_plan(batch, seq, dtype, optimizer, finetune, lora_rank, lora_targets,
                          checkpointing, gpus, zero, tp, attention)  # fmt: skip
    if train_tokens < 0:
        raise GpuwiseError(f"--train-tokens must be positive, got {train_tokens:g}",
                           "give the number of tokens to train on, e.g. 2e9")  # fmt: skip
    answer = train_model(*model_named(model), hardware_named(on), plan, train_tokens)
    emit(train_view(answer, ops), as_json)


def _training_plan(batch: int, seq: int, dtype: str, optimizer: str, finetune: str,
                   lora_rank: int, lora_targets: str, checkpointing: bool, gpus: int, zero: int,
                   tp: int, attention: str) -> Any:  # fmt: skip
    from gpuwise.workload.plans import LORA_TARGETS, TrainingPlan

    targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip()) or LORA_TARGETS
    return TrainingPlan(batch=batch, seq=seq, dtype=dtype, optimizer=optimizer,
                        finetune=finetune, lora_rank=lora_rank, lora_targets=targets,
                        checkpointing=checkpointing, attention=attention, gpus=gpus, zero=zero,
                        tp=tp)  # fmt: skip


@app.command()
def probe(
    quick: Annotated[bool, typer.Option("--quick", help="fewer sizes: under 15 s")] = False,
    repeat: Annotated[int, typer.Option(help="probes to take; each reading is their median "
                                        "(a machine whose speed moves: 3)")] = 1,  # fmt: skip
    as_json: Json = False,
) -> None:
    """Measure this machine (bandwidth, matmul by size and dtype, per-op overhead) and save it."""
    from gpuwise.app.probe import probe as probe_machine
    from gpuwise.report.probe_view import probe_view
    from gpuwise.report.progress import progress_bar

    if not 1 <= repeat <= 10:
        raise GpuwiseError(f"--repeat {repeat}: takes 1 to 10 probes", "3 is enough for a "
                           "machine whose speed moves; 1 (the default) for a steady one")  # fmt: skip
    with progress_bar(quiet=as_json) as progress:
        answer = probe_machine(quick, repeat, progress)
    emit(probe_view(answer), as_json)


@app.command()
def hardware(as_json: Json = False) -> None:
    """List the hardware catalogue (spec values with their sources)."""
    from gpuwise.app import catalogue
    from gpuwise.report.estimate_views import hardware_view

    emit(hardware_view(catalogue.hardware()), as_json)


@app.command()
def models(as_json: Json = False) -> None:
    """List the model catalogue."""
    from gpuwise.app import catalogue
    from gpuwise.report.estimate_views import models_view

    emit(models_view(catalogue.models()), as_json)


validate_app = typer.Typer(help="Run a plan for real (needs torch) and compare with the estimate.")
app.add_typer(validate_app, name="validate")


@validate_app.command("infer")
def validate_infer(
    model: str, batch: Batch = 1, prompt: int = 512, new_tokens: int = 32,
    weights: str = "bf16", attention: Attention = "sdpa", memory: bool = True, time: bool = True,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Generate with random weights here; compare peak memory and times with the estimates."""
    from gpuwise.workload.plans import InferencePlan

    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens,
                         weights=weights, attention=attention)  # fmt: skip
    _validate(model, plan, as_json, memory, time)


@validate_app.command("train")
def validate_train(
    model: str, batch: Batch = 1, seq: int = 256, dtype: str = "fp32", optimizer: str = "adamw",
    checkpointing: Annotated[bool, typer.Option("--checkpointing")] = False,
    attention: Attention = "sdpa", memory: bool = True, time: bool = True,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Run training steps with random weights here; compare memory and step time."""
    plan = _training_plan(batch, seq, dtype, optimizer, "full", 16, "", checkpointing, 1, 0, 1,
                          attention)  # fmt: skip
    _validate(model, plan, as_json, memory, time)


def _validate(model: str, plan: Any, as_json: bool, memory: bool, timing: bool) -> None:
    from gpuwise.app.validate import validate
    from gpuwise.report.validate_view import validate_view

    resolved, arch = model_named(model)
    result = validate(resolved.config, arch, plan, quiet=as_json, memory=memory, timing=timing)
    emit(validate_view(resolved, arch, plan, result, memory, timing), as_json)
