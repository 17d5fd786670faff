"""The `gpuwise` command: parse arguments, call one layer, render. Nothing else."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

try:  # recent typer vendors its own click; its exceptions are the ones raised
    from typer._click import exceptions as click_errors  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - typer releases that use click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from gpuwise.helpers import GpuwiseError

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False, invoke_without_command=True,
                  help="The truth about GPUs for machine learning: will it run, how fast.")  # fmt: skip

On = Annotated[str, typer.Option("--on", help="catalogue hardware name, or 'local'")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object")]
Batch = Annotated[int, typer.Option("--batch", help="sequences per batch")]
Attention = Annotated[str, typer.Option("--attention", help="eager, sdpa or flash")]


def _emit(view: tuple[Any, Any], as_json: bool) -> None:
    """Print a view's JSON record or its terminal rendering."""
    obj, renderable = view
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
        return
    from rich.console import Console

    Console().print(renderable)


def _hardware(name: str) -> Any:
    if name.strip().lower() in ("local", "here", "this"):
        from gpuwise.measure.device import detect_local

        return detect_local().best_device()
    from gpuwise.catalog.hardware import find_hardware

    return find_hardware(name)


def _model(name: str) -> tuple[Any, Any]:
    from gpuwise.catalog.models import resolve_model
    from gpuwise.workload import from_config

    model = resolve_model(name)
    return model, from_config(model.config, model.name)


@app.callback()
def main_job(ctx: typer.Context, as_json: Json = False) -> None:
    """With no command: what of the model catalogue runs on this machine."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuwise.report.views import local_view

    _emit(local_view(), as_json)


@app.command()
def check(model: str, on: On = "local", prompt: int = 2048, new_tokens: int = 256,
          batch: Batch = 1, as_json: Json = False) -> None:  # fmt: skip
    """Can I run it? Memory across weight precisions, and the largest context that fits."""
    from gpuwise.report.views import check_view

    _emit(check_view(*_model(model), _hardware(on), batch, prompt, new_tokens), as_json)


@app.command()
def infer(
    model: str, on: On = "local", batch: Batch = 1,
    prompt: Annotated[int, typer.Option(help="prompt tokens")] = 512,
    new_tokens: Annotated[int, typer.Option(help="tokens to generate")] = 128,
    weights: Annotated[str, typer.Option(help="fp32, bf16, fp16, fp8, int8, int4, nf4")] = "bf16",
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype (default: compute)")] = None,
    attention: Attention = "sdpa",
    logits: Annotated[str, typer.Option(help="last (generate's default) or all")] = "last",
    ops: Annotated[bool, typer.Option("--ops", help="print the per-operation table")] = False,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Memory of generating text with a model (Hugging Face transformers runtime)."""
    from gpuwise.estimate.plans import InferencePlan
    from gpuwise.report.views import infer_view

    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens,
                         weights=weights, kv_dtype=kv_dtype, attention=attention, logits=logits)  # fmt: skip
    _emit(infer_view(*_model(model), _hardware(on), plan, ops), as_json)


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
    as_json: Json = False,
) -> None:  # fmt: skip
    """Memory of one training step: weights, gradients, optimizer, activations."""
    from gpuwise.report.views import train_view

    plan = _training_plan(batch, seq, dtype, optimizer, finetune, lora_rank, lora_targets,
                          checkpointing, gpus, zero, tp, attention)  # fmt: skip
    _emit(train_view(*_model(model), _hardware(on), plan, ops), as_json)


def _training_plan(batch: int, seq: int, dtype: str, optimizer: str, finetune: str,
                   lora_rank: int, lora_targets: str, checkpointing: bool, gpus: int, zero: int,
                   tp: int, attention: str) -> Any:  # fmt: skip
    from gpuwise.estimate.plans import LORA_TARGETS, TrainingPlan

    targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip()) or LORA_TARGETS
    return TrainingPlan(batch=batch, seq=seq, dtype=dtype, optimizer=optimizer,
                        finetune=finetune, lora_rank=lora_rank, lora_targets=targets,
                        checkpointing=checkpointing, attention=attention, gpus=gpus, zero=zero,
                        tp=tp)  # fmt: skip


@app.command()
def probe(
    quick: Annotated[bool, typer.Option("--quick", help="fewer sizes: under 15 s")] = False,
    as_json: Json = False,
) -> None:
    """Measure this machine (bandwidth, matmul by size and dtype, per-op overhead) and save it."""
    from gpuwise.report.probe_view import probe_view

    _emit(probe_view(quick, quiet=as_json), as_json)


@app.command()
def hardware(as_json: Json = False) -> None:
    """List the hardware catalogue (spec values with their sources)."""
    from gpuwise.catalog.hardware import load_hardware
    from gpuwise.report.records import hardware_record
    from gpuwise.report.terminal import format_hardware_table

    devices = load_hardware()
    _emit(([hardware_record(h) for h in devices], format_hardware_table(devices)), as_json)


@app.command()
def models(as_json: Json = False) -> None:
    """List the model catalogue."""
    from gpuwise.report.views import models_view

    _emit(models_view(), as_json)


validate_app = typer.Typer(help="Run a plan for real (needs torch) and compare with the estimate.")
app.add_typer(validate_app, name="validate")


@validate_app.command("infer")
def validate_infer(
    model: str, batch: Batch = 1, prompt: int = 512, new_tokens: int = 32,
    weights: str = "bf16", attention: Attention = "sdpa", memory: bool = True, time: bool = True,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Generate with random weights here; compare peak memory and times with the estimates."""
    from gpuwise.estimate.plans import InferencePlan
    from gpuwise.report.views import validate_view

    plan = InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens,
                         weights=weights, attention=attention)  # fmt: skip
    _emit(validate_view(*_model(model), plan, as_json, memory, time), as_json)


@validate_app.command("train")
def validate_train(
    model: str, batch: Batch = 1, seq: int = 256, dtype: str = "fp32", optimizer: str = "adamw",
    checkpointing: Annotated[bool, typer.Option("--checkpointing")] = False,
    attention: Attention = "sdpa", memory: bool = True, time: bool = True,
    as_json: Json = False,
) -> None:  # fmt: skip
    """Run training steps with random weights here; compare memory and step time."""
    from gpuwise.report.views import validate_view

    plan = _training_plan(batch, seq, dtype, optimizer, "full", 16, "", checkpointing, 1, 0, 1,
                          attention)  # fmt: skip
    _emit(validate_view(*_model(model), plan, as_json, memory, time), as_json)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line on stderr and exit code 2, never a traceback."""
    try:
        app(args=argv, standalone_mode=False)
    except GpuwiseError as exc:
        _fail(exc.message, exc.hint)
    except click_errors.NoSuchOption as exc:
        hint = f"did you mean {' or '.join(exc.possibilities)}?" if exc.possibilities else ""
        _fail(exc.format_message(), hint or "see `gpuwise --help`")
    except click_errors.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "gpuwise"
        _fail(exc.format_message(), f"see `{cmd} --help`")
    except click_errors.Abort:
        _fail("aborted", "")
    except RuntimeError as exc:  # a real run that could not run (no torch, child failed)
        _fail(str(exc).splitlines()[0] if str(exc) else "run failed", "see the message above")


def _fail(message: str, hint: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    raise SystemExit(2)


if __name__ == "__main__":
    main()
