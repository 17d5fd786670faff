"""What a runtime changes in the roofline time model (catalog/data/runtime_speed.toml): the
weight-only kernel it runs for a quantised format, and how much of the device's rates its
kernels reach (docs/speed.md, "Runtimes")."""

from __future__ import annotations

from dataclasses import replace

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import RuntimeSpeed, WeightKernel, weight_kernel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.device_rates import DeviceRates


def kernel_for(rt: RuntimeSpeed, weights: str, kind: str, asked: str = "") -> WeightKernel | None:
    """The weight-only kernel `rt` runs for `weights` on a `kind` of device: the one asked for,
    else the runtime's own; None for unquantised weights or off a GPU (the catalogue's kernels
    are CUDA kernels; elsewhere the matmul runs in the compute dtype)."""
    fmt = weight_format(weights)
    if asked:
        kernel = weight_kernel(asked)
        if not fmt.quantised:
            raise GpuwiseError(f"--quant-kernel {asked} runs quantised weights, not {fmt.id}",
                               "give --weights int4, int8, nf4 or fp8 with it")
        return kernel
    if not fmt.quantised or kind != "gpu":
        return None
    name = rt.kernels.get(fmt.id)
    if name is None:
        has = ", ".join(rt.kernels) or "none"
        hint = ("GGUF types run under --runtime llama.cpp" if fmt.other_bits else
                "pick --weights among them, or another --runtime")
        raise GpuwiseError(f"{rt.id} has no kernel for {fmt.id} weights (it runs: {has})", hint)
    return weight_kernel(name)


def runtime_rates(rates: DeviceRates, rt: RuntimeSpeed, kernel: WeightKernel | None) -> DeviceRates:
    """The device's rates as the runtime's kernels reach them."""
    matmul = rt.prefill_matmul * (kernel.prefill_matmul if kernel else 1.0)
    stream = kernel.decode_memory if kernel else 1.0
    dtype = kernel.peak if kernel and kernel.peak != "compute" else ""
    if (matmul, stream, rt.attention_memory, dtype) == (1.0, 1.0, 1.0, ""):
        return rates
    return replace(rates, matmul_share=matmul, weight_stream_share=stream,
                   attention_memory_share=rt.attention_memory, weight_dtype=dtype)
