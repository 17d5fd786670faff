"""vLLM's engine arguments: a `vllm serve MODEL --flag value ...` command line (or `python -m
vllm.entrypoints.openai.api_server --model MODEL ...`) or the YAML `vllm serve --config` reads
(long names, docs/configuration/serve_args.md), as vllm/engine/arg_utils.py names them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwise.workload.configs.command_line import arguments, environment, parse_flags
from gpuwise.workload.configs.reading import (
    DTYPES,
    SERVE,
    ConfigRead,
    Document,
    Reader,
    count,
    format_id,
    model_named,
    share,
    take_environment,
    truthy,
    whole,
)

# --quantization METHOD (vLLM's and SGLang's names) -> gpuwise's --weights and --quant-kernel
# ("": the runtime's own kernel for the format)
QUANTIZATION = {"fp8": ("fp8", ""), "awq": ("int4", "awq-gemm"), "awq_marlin": ("int4", "marlin"),
                "gptq": ("int4", "exllama"), "gptq_marlin": ("int4", "marlin"),
                "marlin": ("int4", "marlin"), "bitsandbytes": ("nf4", "bnb-nf4"),
                "mxfp4": ("mxfp4", ""), "w8a8_int8": ("int8", "int8-w8a8"),
                "w8a8_fp8": ("fp8", "fp8-w8a8")}
BOOLS = frozenset({
    "enable-prefix-caching", "no-enable-prefix-caching", "enforce-eager", "trust-remote-code",
    "enable-chunked-prefill", "no-enable-chunked-prefill", "disable-log-requests",
    "disable-log-stats", "enable-log-requests", "enable-lora", "enable-auto-tool-choice",
    "enable-expert-parallel", "async-scheduling", "disable-fastapi-docs",
    "disable-custom-all-reduce", "disable-sliding-window", "calculate-kv-scales",
    "headless", "skip-tokenizer-init"})
ALIASES = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size",
           "dp": "data-parallel-size", "q": "quantization", "ep": "enable-expert-parallel"}
NO_EFFECT = ("host", "port", "api-key", "served-model-name", "uvicorn-log-level",
             "disable-log-requests", "disable-log-stats", "enable-log-requests",
             "trust-remote-code", "seed", "tokenizer", "tokenizer-mode", "chat-template",
             "revision", "code-revision", "tokenizer-revision", "download-dir",
             "generation-config", "enable-auto-tool-choice", "tool-call-parser",
             "reasoning-parser", "distributed-executor-backend", "allowed-origins",
             "allowed-methods", "allowed-headers", "ssl-keyfile", "ssl-certfile", "root-path",
             "response-role", "max-log-len", "disable-fastapi-docs", "hf-token", "load-format",
             "config", "headless", "skip-tokenizer-init", "disable-custom-all-reduce")
NOT_MODELLED = {
    "enforce-eager": "CUDA graphs off: gpuwise's vLLM step runs with them",
    "block-size": "gpuwise's pool is counted in tokens",
    "swap-space": "host memory for preempted sequences",
    "cpu-offload-gb": "weights offloaded to host memory",
    "kv-cache-memory": "a KV cache of a set size instead of --gpu-memory-utilization's share",
    "speculative-config": "speculative decoding",
    "enable-lora": "LoRA adapters served beside the model",
    "max-lora-rank": "LoRA adapters served beside the model",
    "max-loras": "LoRA adapters served beside the model",
    "lora-modules": "LoRA adapters served beside the model",
    "compilation-config": "its own CUDA graph sizes",
    "cuda-graph-sizes": "its own CUDA graph sizes",
    "no-enable-chunked-prefill": "whole prompts a step: gpuwise's vLLM chunks them",
    "max-num-partial-prefills": "several partial prefills a step",
    "long-prefill-token-threshold": "several partial prefills a step",
    "scheduling-policy": "a priority scheduler",
    "async-scheduling": "the host's scheduling overlapped with the step",
    "disable-sliding-window": "full attention on sliding-window layers",
    "calculate-kv-scales": "fp8 KV scales calibrated at start",
}


def server_settings(doc: Document, bools: frozenset[str], aliases: Mapping[str, str],
                    model_flags: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings of a command line or a YAML file: {key as written: value} and {canonical
    name (kebab-case, no dashes in front): key as written}. A command line's first positional
    word is its model (`vllm serve MODEL`)."""
    settings: dict[str, Any] = {}
    canon: dict[str, str] = {}
    if doc.command:
        settings.update(environment(doc.command))  # listed as not modelled, with their values
        positional, flags = parse_flags(arguments(doc.command), bools, aliases)
        if positional:
            settings["MODEL"] = positional[0]
            canon["model"] = "MODEL"
            for extra in positional[1:]:
                settings[extra] = "(a word without a flag)"
        for name, value in flags.items():
            settings["--" + name] = value
            canon[name] = "--" + name
    else:
        assert doc.data is not None
        for key, value in doc.data.items():
            name = str(key).lstrip("-").replace("_", "-")
            settings[str(key)] = value
            canon[aliases.get(name, name)] = str(key)
    for name in model_flags:  # --model, --model-path: the model
        if name in canon and "model" not in canon:
            canon["model"] = canon.pop(name)
    return settings, canon


class Named:
    """`Reader` over canonical names: take("max-model-len") finds "--max-model-len" or
    "max_model_len" as the file wrote it."""

    def __init__(self, reader: Reader, canon: dict[str, str]) -> None:
        self.r, self.canon = reader, canon

    def has(self, name: str) -> bool:
        return name in self.canon and self.r.has(self.canon[name])

    def key(self, name: str) -> str:
        return self.canon[name]

    def peek(self, name: str) -> Any:
        return self.r.peek(self.canon[name]) if self.has(name) else None

    def take(self, key: str) -> Any:
        return self.r.take(self.canon[key]) if self.has(key) else None

    def apply(self, key: str, value: Any, **options: Any) -> None:
        self.r.apply(self.canon[key], value, **options)

    def not_modelled(self, key: str, value: Any, why: str) -> None:
        self.r.not_modelled(self.canon[key], value, why)

    def rest(self, no_effect: tuple[str, ...], not_modelled: Mapping[str, str]) -> None:
        for name in list(self.canon):
            if not self.has(name):
                continue
            if name in no_effect:
                self.r.no_effect(self.canon[name], self.take(name))
            elif name in not_modelled:
                self.not_modelled(name, self.take(name), not_modelled[name])


def weights_and_kv(n: Named, kv_names: Mapping[str, str | None]) -> None:
    """--quantization, --dtype and --kv-cache-dtype: vLLM's and SGLang's, spelled alike."""
    method = n.take("quantization")
    if method is not None and str(method) in QUANTIZATION:
        weights, kernel = QUANTIZATION[str(method)]
        n.apply("quantization", method, weights=weights,
                **({"quant_kernel": kernel} if kernel else {}))
    elif method is not None:
        n.not_modelled("quantization", method, "a quantization gpuwise does not model: the "
                       "checkpoint's own format assumed")
    dtype = n.take("dtype")
    if dtype is not None and str(dtype) == "auto":
        n.apply("dtype", dtype)
    elif dtype is not None and str(dtype) in DTYPES and method is None:
        n.apply("dtype", dtype, weights=DTYPES[str(dtype)])
    elif dtype is not None:
        n.not_modelled("dtype", dtype, "an activation dtype beside quantized weights: gpuwise "
                       "takes the format's")
    kv = n.take("kv-cache-dtype")
    if kv is not None:
        named = kv_names.get(str(kv), format_id(str(kv)))
        if str(kv) == "auto":
            n.apply("kv-cache-dtype", kv)
        elif named is not None:
            n.apply("kv-cache-dtype", kv, kv_dtype=named)
        else:
            n.not_modelled("kv-cache-dtype", kv, "a KV cache dtype gpuwise does not know")


def model_option(n: Named) -> None:
    """The model a server's arguments name, as gpuwise names it."""
    if n.has("model"):
        name = str(n.peek("model"))
        n.apply("model", n.take("model"), model=model_named(name))


def parallel(n: Named, tp_name: str, dp_name: str, pp_name: str) -> None:
    """Tensor, data and pipeline parallel sizes: --tp, --gpus (tp x dp), pipeline not modelled."""
    tp = whole(n.peek(tp_name))
    if tp is not None:
        n.apply(tp_name, n.take(tp_name), tp=tp)
    dp = whole(n.peek(dp_name))
    if dp is not None:
        n.apply(dp_name, n.take(dp_name), gpus=(tp or 1) * dp)
    pp = n.take(pp_name)
    if pp is not None and whole(pp) == 1:
        n.apply(pp_name, pp)
    elif pp is not None:
        n.not_modelled(pp_name, pp, "pipeline stages: gpuwise splits a replica's layers "
                       "with --tp only")


def read(doc: Document) -> ConfigRead:
    settings, canon = server_settings(doc, BOOLS, ALIASES, ("model",))
    r = Reader("vllm", SERVE, settings)
    n = Named(r, canon)
    r.apply("vllm serve" if doc.command else "(vLLM engine arguments)", "vLLM", runtime="vllm")
    take_environment(r, doc.command)
    model_option(n)
    parallel(n, "tensor-parallel-size", "data-parallel-size", "pipeline-parallel-size")
    count(n, "max-model-len", "ctx", "the longest context that fits: give --ctx")
    share(n, "gpu-memory-utilization", "gpu_memory_utilization")
    count(n, "max-num-seqs", "max_seqs", "not a count")
    count(n, "max-num-batched-tokens", "max_batched_tokens", "not a count")
    weights_and_kv(n, {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8"})
    for name, on in (("enable-prefix-caching", True), ("no-enable-prefix-caching", False)):
        if n.has(name):
            value = n.take(name)
            n.apply(name, value, prefix_cache=truthy(value) if on else not truthy(value))
    if n.has("enable-expert-parallel"):
        value = n.take("enable-expert-parallel")
        n.apply("enable-expert-parallel", value, expert_parallel=truthy(value))
    if n.has("enable-chunked-prefill"):
        n.apply("enable-chunked-prefill", n.take("enable-chunked-prefill"))
    n.rest(NO_EFFECT, NOT_MODELLED)
    return r.finish("vLLM (vllm serve)")
