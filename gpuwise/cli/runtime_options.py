"""Options shared by infer and check for checkpoints and serving runtimes."""

from __future__ import annotations

from typing import Annotated

import typer

Runtime = Annotated[
    str,
    typer.Option("--runtime", help="whose memory rules: transformers, llama.cpp or vllm"),
]
Ctx = Annotated[
    int | None,
    typer.Option(
        "--ctx",
        help="tokens of context allocated up front: llama.cpp's n_ctx, vLLM's max_model_len "
        "(default: the model's context; ignored under transformers)",
    ),
]
GpuUtil = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization",
        help="vLLM's gpu_memory_utilization: the share of device memory it takes, 0-1 "
        "(default 0.9; vllm only)",
    ),
]
Weights = Annotated[
    str | None,
    typer.Option(
        help="weight precision: fp32, bf16, fp16, fp8, int8, int4, nf4 (default: as stored in "
        "a checkpoint, else bf16)"
    ),
]
