"""`--config FILE` and `--config-format NAME`, declared once for the commands that read a
stack's own config file (train, serve, infer, check, advise; docs/configs.md).

Both are eager: once the file is read, its settings become the defaults of the command's
other options (click's `default_map`), so an option typed on the command line wins over the
file's, as vLLM's and SGLang's own `--config` do; `config_used()` then says which did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

_ARGS = "gpuwise.config.args"
_READ = "gpuwise.config.read"
# What each command estimates, so what configs it takes: "train" (training runs), "serve".
KINDS = {"train": ("train",), "serve": ("serve",), "infer": ("serve",), "check": ("serve",),
         "advise": ("train", "serve")}


def _given(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """Both options' callback: the second to run (they are eager: before any other option)
    reads the file and makes its settings the other options' defaults."""
    found = ctx.meta.setdefault(_ARGS, {})
    found[param.name] = value
    if len(found) == 2:
        _load(ctx, found.get("config"), found.get("config_format"))
    return value


def _load(ctx: typer.Context, path: Path | None, fmt: str | None) -> None:
    from gpuwise.errors import GpuwiseError

    if path is None:
        if fmt is not None:
            raise GpuwiseError("--config-format says how to read --config FILE, and no "
                               "--config was given", "give --config FILE too")
        return
    from gpuwise.app.config_files import read_config

    command = ctx.info_name or ""
    read = read_config(path, fmt, command, KINDS.get(command, ("train", "serve")))
    names = {p.name for p in ctx.command.params}
    defaults = {k: v for k, v in read.options.items() if k in names}
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[_READ] = (str(path), read)


ConfigFile = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE", is_eager=True, callback=_given, show_default=False,
    help="the stack's own config file: a torchtune, axolotl or LitGPT config, Hugging Face "
         "TrainingArguments, an accelerate or DeepSpeed config, or a vLLM, SGLang or "
         "llama-server command line or YAML; its settings become this command's options "
         "(those typed here win) and the answer lists the ones gpuwise does not model "
         "(docs/configs.md)")]
ConfigFormatName = Annotated[str | None, typer.Option(
    "--config-format", is_eager=True, callback=_given, show_default=False,
    help="how to read --config FILE: torchtune, axolotl, hf-trainer, accelerate, deepspeed, "
         "litgpt, vllm, sglang or llama-server (default: told from the file)")]


def config_used() -> Any:
    """What the running command took of its --config file (app.config_files.ConfigUse), or
    None without one: the options it applied, those typed over it, those it does not have."""
    try:  # recent typer vendors its own click (cli/__init__.py)
        from typer._click import get_current_context  # type: ignore[import-not-found]
        from typer._click.core import ParameterSource  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - typer releases that use click itself
        from click import get_current_context  # type: ignore[no-redef]
        from click.core import ParameterSource  # type: ignore[no-redef]

    ctx = get_current_context()
    loaded = ctx.meta.get(_READ)
    if loaded is None:
        return None
    from gpuwise.app.config_files import config_use

    path, read = loaded
    typed = {ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT}
    given = {name for name in ctx.params if ctx.get_parameter_source(name) in typed}
    return config_use(read, path, ctx.info_name or "", ctx.params, given)
