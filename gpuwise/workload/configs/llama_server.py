"""llama.cpp's server: a `llama-server -m model.gguf -c 8192 -ngl 99 ...` command line, its
flags as tools/server/README.md lists them (common/arg.cpp)."""

from __future__ import annotations

import re
from typing import Any

from gpuwise.workload.configs.command_line import arguments, environment, parse_flags
from gpuwise.workload.configs.reading import (
    SERVE,
    ConfigRead,
    Document,
    Reader,
    catalogue_id,
    format_id,
    take_environment,
    whole,
)

BOOLS = frozenset({
    "jinja", "no-jinja", "cont-batching", "no-cont-batching", "mlock", "no-mmap", "mmap",
    "embedding", "embeddings", "reranking", "metrics", "slots", "no-slots", "verbose",
    "log-disable", "no-webui", "kv-unified", "no-kv-unified", "cpu-moe", "swa-full",
    "no-kv-offload", "kv-offload", "offline", "no-warmup", "check-tensors", "no-mmproj",
    "no-repack", "repack", "no-host", "no-context-shift", "context-shift", "props",
    "no-prefill-assistant", "escape", "no-escape", "perf", "no-perf"})
ALIASES = {"m": "model", "c": "ctx-size", "ngl": "n-gpu-layers", "gpu-layers": "n-gpu-layers",
           "t": "threads", "tb": "threads-batch", "np": "parallel", "b": "batch-size",
           "ub": "ubatch-size", "ctk": "cache-type-k", "ctv": "cache-type-v",
           "fa": "flash-attn", "hf": "hf-repo", "hfr": "hf-repo", "hff": "hf-file",
           "md": "model-draft", "a": "alias", "n": "n-predict", "predict": "n-predict",
           "cb": "cont-batching", "nocb": "no-cont-batching", "ot": "override-tensor",
           "cmoe": "cpu-moe", "ncmoe": "n-cpu-moe", "sm": "split-mode", "ts": "tensor-split",
           "mg": "main-gpu", "kvu": "kv-unified", "ctx": "ctx-size", "v": "verbose",
           "lv": "verbosity", "nkvo": "no-kv-offload", "dev": "device", "s": "seed",
           "fit": "fit", "fitt": "fit-target", "fitc": "fit-ctx"}
NO_EFFECT = ("host", "port", "jinja", "no-jinja", "chat-template", "chat-template-file",
             "api-key", "alias", "metrics", "slots", "no-slots", "verbose", "verbosity",
             "log-disable", "log-file", "no-webui", "seed", "temp", "top-k", "top-p", "min-p",
             "timeout", "threads-http", "path", "cont-batching", "offline", "props",
             "reasoning-format", "no-warmup", "escape", "no-escape", "perf", "no-perf",
             "hf-token", "mmap")
NOT_MODELLED = {
    "ubatch-size": "the physical batch (n_ubatch): gpuwise takes llama.cpp's 512",
    "threads-batch": "other threads for prompt processing",
    "no-cont-batching": "slots run one batch at a time",
    "mlock": "the model locked in host memory",
    "no-mmap": "the model read into allocated memory instead of mapped",
    "model-draft": "speculative decoding with a draft model",
    "n-predict": "a cap on generated tokens: gpuwise takes --new-tokens",
    "override-tensor": "tensors placed by pattern",
    "split-mode": "layers or rows split over several GPUs",
    "tensor-split": "layers or rows split over several GPUs",
    "main-gpu": "which GPU of several",
    "kv-unified": "one KV buffer shared by the slots",
    "no-kv-unified": "a KV buffer a slot",
    "swa-full": "full-size caches on sliding-window layers",
    "no-kv-offload": "the KV cache in host memory",
    "embedding": "an embedding server", "embeddings": "an embedding server",
    "reranking": "a reranking server", "pooling": "an embedding server",
    "grammar-file": "grammar-constrained sampling", "device": "devices by name",
    "lora": "LoRA adapters", "cache-reuse": "KV reuse by shifting",
    "rope-scaling": "a context stretched by RoPE scaling", "rope-scale": "RoPE scaling",
    "no-context-shift": "no context shift", "context-shift": "context shift",
    "fit": "llama-server's own fitting (gpuwise fits as --fit on does)",
    "fit-target": "llama-server's own margin", "fit-ctx": "llama-server's own fitting",
}
KV_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "q8_0": "q8_0", "q4_0": "q4_0",
            "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}


def read(doc: Document) -> ConfigRead:
    positional, flags = parse_flags(arguments(doc.command), BOOLS, ALIASES)
    settings: dict[str, Any] = {**environment(doc.command),
                                **{"--" + k: v for k, v in flags.items()}}
    for word in positional:
        settings[word] = "(a word without a flag)"
    r = Reader("llama-server", SERVE, settings)
    r.apply("llama-server", "llama.cpp", runtime="llama.cpp")
    take_environment(r, doc.command)
    _model(r)
    for flag, option in (("--ctx-size", "ctx"), ("--threads", "threads"),
                         ("--parallel", "max_seqs"), ("--batch-size", "max_batched_tokens")):
        if r.has(flag):
            value = r.take(flag)
            count = whole(value)
            if count is not None and count > 0:
                r.apply(flag, value, **{option: count})
            else:  # 0 / -1: the model's context, one thread a core, llama.cpp's own
                r.apply(flag, value)
    layers = r.take("--n-gpu-layers")
    if layers is not None:
        count = whole(layers)
        if count is not None and count >= 0:
            r.apply("--n-gpu-layers", layers, gpu_layers=count)
        else:  # all, auto: every layer that fits, as gpuwise's default
            r.apply("--n-gpu-layers", layers)
    _experts(r)
    _kv(r)
    attention = r.take("--flash-attn")
    if attention is not None:
        r.not_modelled("--flash-attn", attention, "flash attention's smaller compute buffer: "
                       "gpuwise sizes llama.cpp's buffer without it")
    for key in list(r.left):
        name = key.removeprefix("--")
        if name in NO_EFFECT:
            r.no_effect(key, r.take(key))
        elif name in NOT_MODELLED:
            r.not_modelled(key, r.take(key), NOT_MODELLED[name])
    return r.finish("llama.cpp llama-server")


def _model(r: Reader) -> None:
    """-m FILE, or -hf owner/repo[:QUANT] (its Q4_K_M file by default) with -hff FILE."""
    if r.has("--model"):
        path = str(r.take("--model"))
        # a path as gpuwise reads one (a bare relative path could be read as a model's name)
        shown = path if path.startswith(("/", ".", "~")) else "./" + path
        r.apply("--model", path, model=shown)
        return
    repo = r.take("--hf-repo")
    if repo is None:
        return
    name, _, quant = str(repo).partition(":")
    file = r.take("--hf-file")
    if file is not None:
        found = re.search(r"((?:I?Q\d\w*|F16|BF16|F32))\.gguf$", str(file), re.IGNORECASE)
        quant = found.group(1) if found else ""
    quant = quant or "Q4_K_M"  # llama-server's default file of a repo
    options: dict[str, Any] = {}
    named = catalogue_id(name)
    if named is not None:
        options["model"] = named
    weights = format_id(quant)
    if weights is not None:
        options["weights"] = weights
    r.apply("--hf-repo", repo, **options)
    if file is not None:
        r.apply("--hf-file", file)
    if named is None:
        r.not_modelled("--hf-repo", repo, "a GGUF repo whose model gpuwise does not know: give "
                       "MODEL (a config.json, or the .gguf file)")
    if weights is None:
        r.not_modelled("--hf-repo", quant, "a GGUF type gpuwise does not know")


def _kv(r: Reader) -> None:
    k, v = r.take("--cache-type-k"), r.take("--cache-type-v")
    if k is None and v is None:
        return
    if k is not None and k == v and str(k).lower() in KV_TYPES:
        kind = KV_TYPES[str(k).lower()]
        if format_id(kind) is not None:
            r.apply("--cache-type-k", k, kv_dtype=format_id(kind))
            r.apply("--cache-type-v", v)
            return
    for key, value in (("--cache-type-k", k), ("--cache-type-v", v)):
        if value is not None:
            r.not_modelled(key, value, "keys and values in different or unknown types: "
                           "gpuwise takes one --kv-dtype")


def _experts(r: Reader) -> None:
    """--cpu-moe, --n-cpu-moe N and -ot with every layer's experts to the CPU (`exps=CPU`,
    `.ffn_.*_exps.=CPU`: what --cpu-moe adds): the routed experts kept in host memory."""
    if r.has("--cpu-moe"):
        r.apply("--cpu-moe", r.take("--cpu-moe"), cpu_moe=True)
    layers = r.take("--n-cpu-moe")
    if layers is not None:
        count = whole(layers)
        if count is not None and count >= 0:
            r.apply("--n-cpu-moe", layers, n_cpu_moe=count)
        else:
            r.not_modelled("--n-cpu-moe", layers, "not a count of layers")
    pattern = r.peek("--override-tensor")
    if pattern is None:
        return
    rules = [rule.rpartition("=") for rule in str(pattern).split(",")]
    if rules and all("exps" in p and "blk" not in p and buft.upper() == "CPU"
                     for p, _, buft in rules):
        r.apply("--override-tensor", r.take("--override-tensor"), cpu_moe=True)
