"""`gpuwise advise` (compare every option) and `gpuwise cost` (one named option).

Both take the same workload and assumption flags; the flags are declared once, as data, and
given to both commands as their signature. The Python names (`output`, `utilisation`,
`measured_util`) are the keys app/cost.py reads; the options' names are the shared vocabulary.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from gpuwise.cli.common import (
    NEW_TOKENS,
    PROMPT_TOKENS,
    Command,
    Html,
    Model,
    app,
    emit,
    html_output,
    write_html,
)
from gpuwise.cli.config_option import ConfigFile, ConfigFormatName, config_used

_KW = inspect.Parameter.KEYWORD_ONLY


def option(name: str, kind: Any, default: Any, help_text: str, *flags: str) -> inspect.Parameter:
    names = flags or ("--" + name.replace("_", "-"),)
    return inspect.Parameter(name, _KW, default=default,
                             annotation=Annotated[kind, typer.Option(*names, help=help_text)])


WORKLOAD = [
    option("requests_per_day", float | None, None, "inference: requests a day (the workload is "
         "one of this, --tokens-per-day, --train-tokens, --hours-per-month)"),
    option("tokens_per_day", float | None, None, "inference: prompt + generated tokens a day"),
    option("prompt", int, PROMPT_TOKENS, "inference: prompt tokens per request"),
    option("output", int, NEW_TOKENS, "inference: tokens generated per request", "--new-tokens"),
    option("latency_ms", float | None, None, "inference: target time per output token, ms "
         "(default: no target)", "--tpot-ms", "--latency-ms"),
    option("ttft_ms", float | None, None, "inference: target time to first token, ms (default: "
         "no target)"),
    option("utilisation", str, "60%", "inference: the share of its highest rate within the "
         "targets each replica is sized for, 0.6 or 60% (the rest is headroom for peaks)",
         "--target-utilization"),
    option("hours_per_day", float, 24.0, "inference: hours a day the service runs"),
    option("weights", str | None, None, "inference: weight precision (default: the format the "
         "model ships in, else bf16; CPUs try int8 and int4, or the GGUF type given, e.g. "
         "q4_k_m)"),
    option("runtime", str, "auto", "inference: the serving runtime: auto (vllm on GPUs and Gaudi, "
         "llama.cpp on CPUs and Macs), vllm, sglang, llama.cpp, transformers or compiled; "
         "advise compares several side by side: vllm,sglang,llama.cpp"),
    option("train_tokens", float | None, None, "training: tokens to train on per month"),
    option("hours_per_month", float | None, None, "training: hours a month the hardware trains, "
         "instead of --train-tokens"),
    option("deadline_hours", float | None, None, "training: hours within which the month's "
         "tokens must be trained (default: no deadline)"),
    option("batch", int, 1, "training: sequences per batch per device"),
    option("seq", int, 2048, "training: tokens per training sequence"),
    option("dtype", str | None, None, "training: precision: fp32, bf16, fp16, mixed-bf16 or "
         "mixed-fp16 (default: mixed-bf16, or mixed-fp16 on a device without bf16 matrix units: "
         "a T4, a V100)"),
    option("optimizer", str, "adamw", "training: adamw, sgd, adafactor or adamw8bit"),
    option("finetune", str, "full", "training: full, lora or qlora (LoRA on a 4-bit base)"),
    option("lora_rank", int, 16, "training: LoRA rank r (with --finetune lora or qlora)"),
    option("checkpointing", bool, False, "training: activation checkpointing: keep layer inputs "
         "only, recompute the rest in backward", "--checkpointing"),
    option("measured_util", str | None, None, "the busy share `gpuwise watch` measured on the "
         "real job, 0.3 or 30%, or its log file (default: none)", "--measured-utilization"),
    option(
        "api_price_per_mtok",
        str | None,
        None,
        "hosted API price, USD per million tokens: 'INPUT,OUTPUT' or one price for both "
        "(default: none, no API option)",
    ),
]
# The deployment options of check, infer and serve (docs/architecture.md, "One plan"): each
# option of advise and cost is run with them; the runtime's and the weights' are in WORKLOAD.
DEPLOYMENT = [
    option("kv_dtype", str | None, None, "inference: KV cache dtype, e.g. fp16, fp8 (default: the "
         "compute dtype; llama.cpp: f16)", "--kv-dtype"),
    option("ctx", int | None, None, "inference: context allocated up front (llama.cpp n_ctx, "
         "vLLM max_model_len; default: the runtime's)"),
    option("attention", str, "sdpa", "inference: attention implementation: sdpa, flash or eager"),
    option("gpu_memory_utilization", float | None, None, "inference: vLLM's pre-allocated share "
         "of each device (default 0.9)"),
    option("threads", int | None, None, "inference: llama.cpp's CPU threads (default: one a core)"),
    option("quant_kernel", str, "", "inference: the weight-only kernel (default: the runtime's "
         "own)"),
    option("gpu_layers", int | None, None, "inference: llama.cpp's -ngl (default: all on the GPU)"),
    option("expert_parallel", bool, False, "inference: a mixture of experts' routed experts split "
         "whole over each replica's devices (vLLM --enable-expert-parallel, SGLang --ep-size; "
         "default: split as other matrices)", "--expert-parallel"),
    option("cpu_moe", bool, False, "inference: llama.cpp's --cpu-moe: every layer's routed "
         "experts in host memory, run by the CPU", "--cpu-moe"),
    option("n_cpu_moe", int | None, None, "inference: llama.cpp's --n-cpu-moe N: the routed "
         "experts of the first N layers in host memory (default: none)"),
]
ASSUMPTIONS = [
    option("electricity", float | None, None, "electricity price, USD per kWh"),
    option("site", str | None, None, "where owned devices run: home (PUE 1.0, no colocation, "
         "residential electricity) or datacentre (default: GeForce cards and Macs at home, the "
         "rest in a data centre)"),
    option("pue", float | None, None, "power usage effectiveness: wall power / IT power"),
    option("depreciation_years", float | None, None, "years an owned device is paid off over"),
    option("hosting_per_kw_month", float | None, None, "colocation, USD per kW of IT power a month"),
    option("ops_per_year", float | None, None, "staff and support, USD per device a year"),
    option("idle_power", float | None, None, "idle power, as a fraction of TDP"),
    option("busy_power", float | None, None, "busy power, as a fraction of TDP"),
    option("memory_power", float | None, None, "power of memory-bound work (decode), as a "
         "fraction of TDP"),
    option("grid_co2", float | None, None, "grid intensity, g CO2 per kWh"),
    option("reserved_discount", float | None, None, "reserved price discount vs on demand, 0-1"),
    option("host_power_fraction", float | None, None, "server power on top of the device's TDP, "
         "as a fraction of it"),
    option("host_price_fraction", float | None, None, "server price on top of the device's, as a "
         "fraction of it"),
    option("max_kw", float | None, None, "power your site can deliver at the wall, kW, for owned "
         "hardware (default: no limit)"),
    option("local_price", float | None, None, "this machine's purchase price, USD (default: 0, "
         "already paid)"),
    option(
        "local_power_w",
        float | None,
        None,
        "this machine's device power (TDP) when busy, W; the host fraction is added "
        "(default: the detected device's)",
    ),
]
MODEL = inspect.Parameter("model", _KW, annotation=Model)
AS_JSON = option("as_json", bool, False, "print one JSON object", "--json")
HTML = inspect.Parameter("html", _KW, default=None, annotation=Html)
CONFIG = [inspect.Parameter("config", _KW, default=None, annotation=ConfigFile),
          inspect.Parameter("config_format", _KW, default=None, annotation=ConfigFormatName)]
SHOW_ASSUMPTIONS = option("show_assumptions", bool, False, "list the cost assumptions with their "
                        "values and sources (always in --json)", "--assumptions")


class CostCommand(Command):
    """advise and cost: `--help` gives each assumption flag the catalogue's default."""

    def get_help(self, ctx: Any) -> str:
        from gpuwise.catalog.costs import load_costs

        defaults: dict[str, list[str]] = {}
        for a in load_costs().listed():
            kind = a.name.partition("[")[2].rstrip("]")
            defaults.setdefault(a.flag, []).append(f"{kind} {a.value:g}" if kind else f"{a.value:g}")
        for param in self.params:
            flag = next(iter(getattr(param, "opts", ())), "")
            if flag in defaults and "(default" not in (param.help or ""):
                param.help = f"{param.help} (default: {', '.join(defaults[flag])})"
        return super().get_help(ctx)


def advise(**kw: Any) -> None:
    """Should I use a GPU at all, and rent or buy? Every option for a workload, priced."""
    from gpuwise.app.cost import advise_options
    from gpuwise.report.cost_view import advice_view
    from gpuwise.report.estimate_views import with_config
    from gpuwise.report.progress import progress_bar

    html = html_output(kw.pop("html"))
    kw.pop("config"), kw.pop("config_format")  # read already: their settings are in kw
    with progress_bar(quiet=kw["as_json"]) as progress:
        answer = advise_options(kw, progress)
    emit(with_config(advice_view(answer, kw["show_all"], kw["show_assumptions"]), config_used()),
         kw["as_json"])
    write_html(html, lambda pages: pages.advise_page(answer, kw["show_all"]))


def cost(**kw: Any) -> None:
    """The cost of one option: a named device, owned (default when it has a price) or rented."""
    from gpuwise.app.cost import cost_option
    from gpuwise.report.cost_view import cost_view

    html = html_output(kw.pop("html"))
    answer = cost_option(kw)
    emit(cost_view(answer, kw["show_assumptions"]), kw["as_json"])
    write_html(html, lambda pages: pages.cost_page(answer))


advise.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [MODEL, option("on", str | None, None, "devices to consider, a comma list of catalogue ids "
                 "or aliases and 'local' (default: every priced device and this machine)"),
     option("request_rate", float | None, None, "inference: requests a second while the service "
          "runs, instead of --requests-per-day (as serve's --rate)", "--rate"),
     *WORKLOAD, *DEPLOYMENT, *ASSUMPTIONS,
     option("show_all", bool, False, "show every option, not the first 15", "--all"),
     option("local", bool, True, "include this machine", "--local/--no-local"), SHOW_ASSUMPTIONS,
     AS_JSON, HTML, *CONFIG])
cost.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [MODEL, option("on", str, "local", "catalogue device id or alias (`gpuwise hardware`), "
                 "'local': this machine, or 'api': a hosted API"),
     option("owned", bool, False, "buy it (the default where the device has a list price)",
          "--owned"),
     option("rent", bool, False, "rent it on demand", "--rent"),
     option("reserved", bool, False, "rent it reserved", "--reserved"),
     option("price", float | None, None, "purchase price per device, USD (default: the "
          "catalogue's list price)"),
     option("rate", float | None, None, "on-demand rental per device, USD/h (default: the "
          "catalogue's cloud price)"),
     *WORKLOAD, *DEPLOYMENT, *ASSUMPTIONS, SHOW_ASSUMPTIONS, AS_JSON, HTML])
app.command(cls=CostCommand)(advise)
app.command(cls=CostCommand)(cost)
