"""Options shared by infer and check for checkpoints and serving runtimes, and the weights a
checkpoint gives a plan (exact stored bytes, or an estimate where the runtime converts them)."""

from __future__ import annotations

from typing import Annotated

import typer

Runtime = Annotated[
    str,
    typer.Option("--runtime", help="whose memory rules: transformers (default), llama.cpp or vllm"),
]
Ctx = Annotated[
    int | None,
    typer.Option(
        "--ctx", help="llama.cpp n_ctx / vLLM max_model_len (default: the model's context)"
    ),
]
GpuUtil = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization", help="vLLM's pre-allocated share of the device (default 0.9)"
    ),
]
Weights = Annotated[
    str | None,
    typer.Option(
        help="fp32, bf16, fp16, fp8, int8, int4, nf4 (default: as stored in a checkpoint, else bf16)"
    ),
]
# fmt: skip
