"""Options shared by infer and check for checkpoints and serving runtimes."""

from __future__ import annotations

from typing import Annotated

import typer

Runtime = Annotated[
    str,
    typer.Option("--runtime", help="whose memory rules and time model: transformers (eager "
                 "generate()), compiled (torch.compile + CUDA graphs), vllm, sglang or llama.cpp"),
]
TrainRuntime = Annotated[
    str,
    typer.Option("--runtime", help="whose time model: transformers (eager) or compiled "
                 "(torch.compile)"),
]
Threads = Annotated[
    int | None,
    typer.Option("--threads", help="llama.cpp's CPU threads (default: one a core; "
                 "llama.cpp on a CPU only)"),
]
QuantKernel = Annotated[
    str,
    typer.Option("--quant-kernel", help="the weight-only kernel for int4/int8/nf4/fp8 weights: "
                 "marlin, awq-gemm, exllama, bnb-nf4, bnb-int8, torchao-int4, torchao-int8, "
                 "fp8-w8a8, ... (default: the runtime's own)", show_default=False),
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
        help="the share of device memory vLLM (gpu_memory_utilization, default 0.9) or SGLang "
        "(mem_fraction_static, default by device) takes, 0-1",
    ),
]
Weights = Annotated[
    str | None,
    typer.Option(
        help="weight precision: fp32, bf16, fp16, fp8, int8, int4, nf4, mxfp4, a GGUF type "
        "(default: as stored in a checkpoint, else the format the model ships in, else bf16)"
    ),
]
KvDtype = Annotated[
    str | None,
    typer.Option("--kv-dtype", help="KV cache dtype, e.g. fp16, fp8, int8 (default: the compute "
                 "dtype; llama.cpp: f16)", show_default=False),
]
Tp = Annotated[
    int,
    typer.Option("--tp", help="tensor-parallel devices a replica: each layer split over them "
                 "(vLLM --tensor-parallel-size)"),
]
Gpus = Annotated[
    int | None,
    typer.Option("--gpus", help="devices in all: --gpus / --tp replicas share the load "
                 "(default: --tp, one replica)", show_default=False),
]
GpuLayers = Annotated[
    int | None,
    typer.Option("--gpu-layers", help="llama.cpp's -ngl: layers on the GPU, the rest on the host "
                 "(default: all on the GPU)", show_default=False),
]
ExpertParallel = Annotated[
    bool,
    typer.Option("--expert-parallel", help="a mixture of experts' routed experts split whole over "
                 "the --tp devices, E/tp a device, tokens sent to them and back (vLLM "
                 "--enable-expert-parallel, SGLang --ep-size; default: split as other matrices)"),
]
CpuMoe = Annotated[
    bool,
    typer.Option("--cpu-moe", help="llama.cpp's --cpu-moe: every layer's routed experts in host "
                 "memory, run by the CPU; the rest on the GPU"),
]
NCpuMoe = Annotated[
    int | None,
    typer.Option("--n-cpu-moe", help="llama.cpp's --n-cpu-moe N: the routed experts of the first "
                 "N layers in host memory (default: none)", show_default=False),
]
