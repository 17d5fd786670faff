"""`gpuwise advise` (compare every option) and `gpuwise cost` (one named option).

Both take the same workload and assumption flags; the flags are declared once, as data, and
given to both commands as their signature.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from gpuwise.cli.common import app, emit

_KW = inspect.Parameter.KEYWORD_ONLY


def _opt(name: str, kind: Any, default: Any, help_text: str, *flags: str) -> inspect.Parameter:
    names = flags or ("--" + name.replace("_", "-"),)
    return inspect.Parameter(name, _KW, default=default,
                             annotation=Annotated[kind, typer.Option(*names, help=help_text)])  # fmt: skip


WORKLOAD = [
    _opt("requests_per_day", float | None, None, "inference: requests a day"),
    _opt("tokens_per_day", float | None, None, "inference: prompt + generated tokens a day"),
    _opt("prompt", int, 512, "inference: prompt tokens per request"),
    _opt("output", int, 256, "inference: generated tokens per request"),
    _opt("latency_ms", float | None, None, "inference: target time per output token, ms"),
    _opt("ttft_ms", float | None, None, "inference: target time to first token, ms"),
    _opt(
        "utilisation",
        str,
        "60%",
        "inference: busy share each replica is sized for (0.6 or 60%; headroom for peaks)",
    ),
    _opt("hours_per_day", float, 24.0, "inference: hours a day the service runs"),
    _opt("weights", str, "bf16", "inference: accelerator weight format (CPUs try fp32/int8/int4)"),
    _opt("runtime", str, "transformers", "inference: transformers or compiled"),
    _opt("train_tokens", float | None, None, "training: tokens to train on per month"),
    _opt("hours_per_month", float | None, None, "training: hours a month the hardware trains"),
    _opt("deadline_hours", float | None, None, "training: the month's tokens must train within"),
    _opt("batch", int, 1, "training: sequences per batch per device"),
    _opt("seq", int, 2048, "training: tokens per sequence"),
    _opt("dtype", str, "mixed-bf16", "training: fp32, bf16, fp16, mixed-bf16, mixed-fp16"),
    _opt("optimizer", str, "adamw", "training: adamw, sgd, adafactor, adamw8bit"),
    _opt("finetune", str, "full", "training: full, lora or qlora"),
    _opt("lora_rank", int, 16, "training: LoRA rank"),
    _opt("checkpointing", bool, False, "training: activation checkpointing", "--checkpointing"),
    _opt("measured_util", str | None, None, "busy share measured by `gpuwise watch` (0.3 or 30%)"),
    _opt(
        "api_price_per_mtok",
        str | None,
        None,
        "hosted API price per million tokens, 'INPUT,OUTPUT' or one price for both (USD)",
    ),
]
ASSUMPTIONS = [
    _opt("electricity", float | None, None, "USD per kWh"),
    _opt("pue", float | None, None, "power usage effectiveness (wall / IT power)"),
    _opt("depreciation_years", float | None, None, "years an owned device is paid off over"),
    _opt("hosting_per_kw_month", float | None, None, "colocation USD per kW of IT power a month"),
    _opt("ops_per_year", float | None, None, "staff and support USD per device a year"),
    _opt("idle_power", float | None, None, "idle power as a fraction of TDP"),
    _opt("busy_power", float | None, None, "busy power as a fraction of TDP"),
    _opt("grid_co2", float | None, None, "grid intensity, g CO2 per kWh"),
    _opt("reserved_discount", float | None, None, "reserved price discount vs on demand, 0-1"),
    _opt("host_power_fraction", float | None, None, "server power on top of the device's TDP"),
    _opt("host_price_fraction", float | None, None, "server price on top of the device's"),
    _opt("max_kw", float | None, None, "power your site can deliver at the wall, kW (owned)"),
    _opt("local_price", float | None, None, "this machine's purchase price, USD (default 0)"),
    _opt(
        "local_power_w",
        float | None,
        None,
        "this machine's device power (TDP) when busy, W; the host fraction is added",
    ),
]
MODEL = inspect.Parameter("model", _KW, annotation=Annotated[str, typer.Argument()])
AS_JSON = _opt("as_json", bool, False, "print one JSON object", "--json")


def advise(**kw: Any) -> None:
    """Should I use a GPU at all, and rent or buy? Every option for a workload, priced."""
    from gpuwise.app.cost import advise_options
    from gpuwise.report.cost_view import advice_view

    emit(advice_view(advise_options(kw), kw["show_all"]), kw["as_json"])


def cost(**kw: Any) -> None:
    """The cost of one option: a named device, owned (default when it has a price) or rented."""
    from gpuwise.app.cost import cost_option
    from gpuwise.report.cost_view import cost_view

    emit(cost_view(cost_option(kw)), kw["as_json"])


advise.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [MODEL, *WORKLOAD, *ASSUMPTIONS,
     _opt("show_all", bool, False, "show every option, not the first 15", "--all"),
     _opt("local", bool, True, "include this machine", "--local/--no-local"), AS_JSON])  # fmt: skip
cost.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [MODEL, _opt("on", str, "local", "catalogue hardware name, or 'local'"),
     _opt("owned", bool, False, "buy it", "--owned"),
     _opt("rent", bool, False, "rent it on demand", "--rent"),
     _opt("reserved", bool, False, "rent it reserved", "--reserved"),
     _opt("price", float | None, None, "purchase price per device, USD"),
     _opt("rate", float | None, None, "on-demand rental per device, USD/h"),
     *WORKLOAD, *ASSUMPTIONS, AS_JSON])  # fmt: skip
app.command()(advise)
app.command()(cost)
