"""`gpuwise serve`: a model served under load (app/serve.py; docs/serve.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuwise.cli.common import (
    NEW_TOKENS,
    PROMPT_TOKENS,
    Attention,
    Html,
    Json,
    Model,
    On,
    app,
    emit,
    html_output,
    model_named,
    write_html,
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
    Threads,
    Tp,
    Weights,
)

Dist = Annotated[str | None, typer.Option(
    help="fixed, uniform (half to 1.5x the mean), normal (sd a quarter of the mean) or trace "
         "(as recorded; the default with --trace, else fixed)", show_default=False)]


@app.command()
def serve(
    model: Model, on: On = "local",
    runtime: Annotated[str, typer.Option("--runtime", help="vllm (the default: what serves "
                                         "under load), sglang, llama.cpp, transformers or "
                                         "compiled")] = "vllm",
    rate: Annotated[float | None, typer.Option(help="requests a second, arriving at random "
                                               "(Poisson)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="clients that each send a request "
                                                    "when their last is answered (with --trace: "
                                                    "its requests, in order)")] = None,
    trace: Annotated[Path | None, typer.Option(help="JSON lines of arrival_s, prompt_tokens, "
                                               "output_tokens (vLLM/Mooncake keys too)")] = None,
    prompt: Annotated[int, typer.Option("--prompt", help="prompt tokens a request (the "
                                        "mean)")] = PROMPT_TOKENS,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="tokens generated a request "
                                            "(the mean)")] = NEW_TOKENS,
    prompt_dist: Dist = None,
    output_dist: Annotated[str | None, typer.Option("--new-tokens-dist",
                           help="as --prompt-dist", show_default=False)] = None,
    requests: Annotated[int, typer.Option(help="requests to simulate")] = 1000,
    warmup: Annotated[int, typer.Option(help="requests at the start left out of the latencies "
                                        "and the targets' attainment, while the batch fills "
                                        "(advise's --json gives the runs it sized with)")] = 0,
    duration: Annotated[float | None, typer.Option(help="seconds of arrivals to simulate "
                                                   "(with --rate; instead of --requests)")] = None,
    ttft_ms: Annotated[float | None, typer.Option("--ttft-ms", "--slo-ttft-ms",
                       help="target time to first token, ms")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", "--slo-tpot-ms", "--latency-ms",
                       help="target time per output token, ms")] = None,
    gpus: Gpus = None,
    tp: Tp = 1,
    max_seqs: Annotated[int | None, typer.Option(help="sequences running at once: vLLM "
                        "max_num_seqs, llama.cpp --parallel, a static batch")] = None,
    max_batched_tokens: Annotated[int | None, typer.Option(
        help="tokens a step: vLLM max_num_batched_tokens, llama.cpp n_batch")] = None,
    shared_prefix: Annotated[int, typer.Option(help="tokens every request's prompt begins with "
                                               "(a system prompt)")] = 0,
    prefix_cache: Annotated[bool | None, typer.Option(
        "--prefix-cache/--no-prefix-cache", help="keep the shared prefix's KV cache and skip "
        "its prefill (default: the runtime's: on for vLLM and SGLang)",
        show_default=False)] = None,
    overlap_schedule: Annotated[bool | None, typer.Option(
        "--overlap-schedule/--no-overlap-schedule", help="pick the next step while the current "
        "one runs (default: the runtime's: on for SGLang from v0.4, whose "
        "--disable-overlap-schedule turns it off)", show_default=False)] = None,
    weights: Weights = None,
    kv_dtype: KvDtype = None, attention: Attention = "sdpa",
    ctx: Ctx = None, gpu_memory_utilization: GpuUtil = None,
    threads: Threads = None, quant_kernel: QuantKernel = "", gpu_layers: GpuLayers = None,
    expert_parallel: ExpertParallel = False, cpu_moe: CpuMoe = False, n_cpu_moe: NCpuMoe = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="find the highest rate that meets the "
                                        "targets, and print the latency-throughput curve")] = False,
    seed: Annotated[int, typer.Option(help="random seed of the arrivals and lengths")] = 0,
    as_json: Json = False, html: Html = None, config: ConfigFile = None,
    config_format: ConfigFormatName = None,
) -> None:
    """Serving under load: continuous batching simulated step by step with the runtime's
    scheduler and time model; latency percentiles, throughput, goodput, energy."""
    from gpuwise.app.deployment import Deployment, Workload, build_plan
    from gpuwise.app.lookup import hardware_named
    from gpuwise.app.serve import Load, ReplicaOptions, Slo
    from gpuwise.app.serve import serve as serve_model
    from gpuwise.report.estimate_views import with_config
    from gpuwise.report.progress import progress_bar
    from gpuwise.report.serve_view import serve_view
    from gpuwise.workload.requests import Lengths

    html = html_output(html)
    resolved, arch = model_named(model)
    deployment = Deployment(runtime=runtime, weights=weights, kv_dtype=kv_dtype,
                            attention=attention, ctx=ctx,
                            gpu_memory_utilization=gpu_memory_utilization, threads=threads,
                            quant_kernel=quant_kernel, gpu_layers=gpu_layers, tp=tp,
                            gpus=gpus, expert_parallel=expert_parallel, cpu_moe=cpu_moe,
                            n_cpu_moe=n_cpu_moe)
    hw = hardware_named(on)
    plan = build_plan(resolved, deployment, Workload(1, prompt, new_tokens), hw).plan
    recorded = "trace" if trace is not None else "fixed"
    lengths = Lengths(prompt, new_tokens, prompt_dist or recorded, output_dist or recorded)
    load = Load(lengths, rate, concurrency, trace, requests, duration, seed, warmup)
    slo = Slo(None if ttft_ms is None else ttft_ms / 1e3, None if tpot_ms is None else tpot_ms / 1e3)
    opts = ReplicaOptions(tp, max_seqs, max_batched_tokens, shared_prefix, prefix_cache,
                          overlap_schedule)
    with progress_bar(quiet=as_json) as progress:
        answer = serve_model(resolved, arch, hw, plan, opts, load, slo,
                             tp if gpus is None else gpus,
                             sweep, progress)
    emit(with_config(serve_view(answer), config_used()), as_json)
    write_html(html, lambda pages: pages.serve_page(answer))
