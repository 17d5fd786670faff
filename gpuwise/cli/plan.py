"""`gpuwise plan`: the cheapest deployment that meets the targets at a load, and the command
that runs it (docs/plan.md). Its workload and assumption flags are advise's."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from gpuwise.cli.common import NEW_TOKENS, PROMPT_TOKENS, app, emit, html_output, write_html
from gpuwise.cli.cost import AS_JSON, ASSUMPTIONS, HTML, MODEL, CostCommand, option

WORKLOAD = [
    option("request_rate", float | None, None, "requests a second while the service runs",
         "--rate"),
    option("requests_per_day", float | None, None, "requests a day, instead of --rate"),
    option("concurrency", int | None, None, "clients that each send a request when their last "
         "is answered, instead of --rate (needs --tpot-ms)"),
    option("trace", Path | None, None, "JSON lines of arrival_s, prompt_tokens, output_tokens "
         "(vLLM/Mooncake keys too), instead of --rate: its rate and mean lengths"),
    option("prompt", int, PROMPT_TOKENS, "prompt tokens per request"),
    option("output", int, NEW_TOKENS, "tokens generated per request", "--new-tokens"),
    option("latency_ms", float | None, None, "target p90 time per output token, ms",
         "--tpot-ms", "--latency-ms"),
    option("ttft_ms", float | None, None, "target p90 time to first token, ms"),
    option("utilisation", str, "60%", "the share of its highest rate within the targets each "
         "replica is sized for, 0.6 or 60%", "--target-utilization"),
]
SPACE = [
    option("on", str | None, None, "devices to search, a comma list of catalogue ids (default: "
         "every priced device)"),
    option("runtime", str | None, None, "runtimes to search, a comma list: vllm, sglang, "
         "llama.cpp (default: each that runs on the device)"),
    option("weights", str | None, None, "weight formats to search, a comma list (default: as "
         "shipped or bf16, fp8, int4; llama.cpp: q4_k_m, q8_0)"),
    option("tp", str | None, None, "tensor-parallel widths to search, a comma list (default: "
         "1,2,4,8 on linked devices)"),
    option("pp", str | None, None, "pipeline stages to search, a comma list (default: 1,2,4,8 "
         "under vLLM and SGLang; tp x pp at most 8)"),
    option("prefill_decode", str, "both", "aggregated (each replica does both), disaggregated "
         "(a prefill pool and a decode pool) or both"),
    option("ctx", int | None, None, "context allocated up front (vLLM max_model_len; default: "
         "the runtime's)"),
    option("budget", float | None, None, "most it may cost, USD a month"),
    option("gpus_max", int | None, None, "most devices in all"),
]


def plan(**kw: Any) -> None:
    """The cheapest deployment that meets the targets at a load, searched over devices,
    runtimes, parallelism, precisions and scheduler limits, and the command that runs it."""
    from gpuwise.app.plan import plan as run_plan
    from gpuwise.report.plan_view import plan_view
    from gpuwise.report.progress import progress_bar

    html = html_output(kw.pop("html"))
    with progress_bar(quiet=kw["as_json"]) as progress:
        answer = run_plan(kw, progress)
    emit(plan_view(answer), kw["as_json"])
    write_html(html, lambda pages: pages.plan_page(answer))


plan.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [MODEL, *WORKLOAD, *SPACE, *ASSUMPTIONS, AS_JSON, HTML])
app.command(cls=CostCommand)(plan)
