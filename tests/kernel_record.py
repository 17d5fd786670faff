"""A made-up probed machine the kernel-rate tests share: `_record()` is a probe record of
linear, SDPA, elementwise and optimizer timings on a machine running 1 GFLOP/s per row up to
100 GFLOP/s; `KERNELS` reads it; `CPU` is an H100's spec rates relabelled as a CPU."""

from dataclasses import replace

from gpuwise.catalog import find_hardware
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.probed_kernels import KernelRates

ROWS, WIDTHS = (1, 16, 256), (512, 2048)


def _rate(m: int) -> float:
    """A made-up machine: 1 GFLOP/s per row up to 100 GFLOP/s."""
    return min(100e9, 1e9 * m)


def _record(backward_factor: float = 2.5) -> dict:
    fwd = [[m, k, n, 2 * m * k * n / _rate(m)] for m in ROWS for k in WIDTHS for n in WIDTHS]
    bwd = [[m, k, n, backward_factor * 2 * m * k * n / _rate(m)] for m in (256,)
           for k in WIDTHS for n in WIDTHS]
    return {
        "linear": {"fp32": {"forward": fwd, "backward": bwd}},
        "sdpa": {"fp32": {"decode": [[128, 1e-5], [512, 4e-5]],
                          "prefill": [[64, 1e-5], [256, 1.6e-4]],
                          "backward": [[64, 3e-5], [256, 4.8e-4]]}},
        "elementwise": {"fp32": {"binary": 40e9, "silu": 20e9, "gelu": 10e9}},
        "optimizer": {"fp32": {"adamw": [[2**20, 1e-9], [2**24, 4e-9]]}},
    }


KERNELS = KernelRates.from_record(_record())
CPU = replace(rates_from_spec(find_hardware("h100-sxm")), kind="cpu", kernel_latency_s=0.0)
