"""SGLang's server arguments: a `python -m sglang.launch_server --model-path MODEL ...` command
line or the YAML its `--config` reads, as python/sglang/srt/server_args.py names them
(docs/advanced_features/server_arguments.md)."""

from __future__ import annotations

from gpuwise.workload.configs.reading import (
    SERVE,
    ConfigRead,
    Document,
    Reader,
    count,
    share,
    take_environment,
    truthy,
    whole,
)
from gpuwise.workload.configs.vllm_args import (
    Named,
    model_option,
    parallel,
    server_settings,
    weights_and_kv,
)

BOOLS = frozenset({
    "disable-radix-cache", "disable-overlap-schedule", "disable-cuda-graph",
    "enable-torch-compile", "trust-remote-code", "enable-metrics", "log-requests",
    "enable-p2p-check", "skip-tokenizer-init", "enable-dp-attention", "enable-mixed-chunk",
    "skip-server-warmup", "enable-deterministic-inference", "enable-fp32-lm-head",
    "disable-hybrid-swa-memory", "is-embedding", "enable-multimodal", "enable-ep-moe"})
ALIASES = {"tp": "tp-size", "tensor-parallel-size": "tp-size", "dp": "dp-size",
           "data-parallel-size": "dp-size", "pp": "pp-size", "pipeline-parallel-size": "pp-size",
           "model": "model-path", "ep": "ep-size", "expert-parallel-size": "ep-size"}
NO_EFFECT = ("host", "port", "api-key", "served-model-name", "tokenizer-path", "tokenizer-mode",
             "trust-remote-code", "enable-metrics", "log-requests", "log-level", "random-seed",
             "chat-template", "revision", "enable-p2p-check", "skip-server-warmup",
             "dist-init-addr", "node-rank", "nccl-port", "skip-tokenizer-init", "load-format",
             "config", "enable-deterministic-inference", "hf-chat-template-name",
             "tool-call-parser", "reasoning-parser", "download-dir", "is-embedding",
             "enable-multimodal")
NOT_MODELLED = {
    "disable-cuda-graph": "CUDA graphs off: gpuwise's SGLang step runs with them",
    "enable-torch-compile": "torch.compile of the model",
    "max-total-tokens": "a pool of a set size instead of --mem-fraction-static's share",
    "page-size": "gpuwise's pool is counted in tokens",
    "schedule-policy": "a scheduling order other than first come",
    "schedule-conservativeness": "how far ahead the scheduler reserves the pool",
    "cuda-graph-max-bs": "its own CUDA graph batch sizes",
    "nnodes": "several nodes: gpuwise's --tp is within a node",
    "enable-dp-attention": "data-parallel attention",
    "speculative-algorithm": "speculative decoding",
    "max-prefill-tokens": "a prefill batch's token limit",
    "enable-mixed-chunk": "prefill chunks mixed into decode steps",
    "max-queued-requests": "a cap on waiting requests",
    "enable-fp32-lm-head": "fp32 logits",
    "disable-hybrid-swa-memory": "full-size caches on sliding-window layers",
}


def read(doc: Document) -> ConfigRead:
    settings, canon = server_settings(doc, BOOLS, ALIASES, ("model-path",))
    r = Reader("sglang", SERVE, settings)
    n = Named(r, canon)
    r.apply("sglang.launch_server" if doc.command else "(SGLang server arguments)", "SGLang",
            runtime="sglang")
    take_environment(r, doc.command)
    model_option(n)
    parallel(n, "tp-size", "dp-size", "pp-size")
    count(n, "context-length", "ctx", "not a count of tokens")
    share(n, "mem-fraction-static", "gpu_memory_utilization")
    count(n, "max-running-requests", "max_seqs", "not a count")
    count(n, "chunked-prefill-size", "max_batched_tokens", "whole prompts a step (-1: "
            "chunking off)")
    weights_and_kv(n, {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bfloat16": "bf16", "bf16": "bf16",
                       "fp4_e2m1": None})
    _expert_parallel(n)
    for name, option in (("disable-radix-cache", "prefix_cache"),
                         ("disable-overlap-schedule", "overlap_schedule")):
        if n.has(name):
            value = n.take(name)
            n.apply(name, value, **{option: not truthy(value)})
    n.rest(NO_EFFECT, NOT_MODELLED)
    return r.finish("SGLang (sglang.launch_server)")


def _expert_parallel(n: Named) -> None:
    """--ep-size equal to --tp-size (or the older --enable-ep-moe, which sets it so): the
    experts split whole over the tensor-parallel devices, gpuwise's --expert-parallel."""
    tp = n.r.options.get("tp", 1)  # parallel() has read --tp-size
    if n.has("enable-ep-moe"):
        value = n.take("enable-ep-moe")
        n.apply("enable-ep-moe", value, expert_parallel=truthy(value))
    ep = n.peek("ep-size")
    if ep is None:
        return
    size = whole(ep)
    if size == tp:
        n.apply("ep-size", n.take("ep-size"), expert_parallel=tp > 1)
    elif size == 1:
        n.apply("ep-size", n.take("ep-size"))
    else:
        n.not_modelled("ep-size", n.take("ep-size"), "expert parallelism over another "
                       "count of devices than --tp-size")
