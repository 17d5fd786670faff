"""Expert parallelism (vLLM's --enable-expert-parallel, SGLang's --ep-size equal to --tp): each of
the tp devices holds E/tp whole routed experts; attention, the router and shared experts stay
tensor-parallel (docs/speed.md, "Mixture of experts"). A step's routed work on a device is
that of the experts it holds which the step's tokens reach; the step waits for the busiest."""

from __future__ import annotations

import math
from dataclasses import replace

from gpuwise.workload.arch import MoE
from gpuwise.workload.ops import Op, experts_touched, tensor_parallel_share


def experts_a_device(moe: MoE, devices: int) -> int:
    """Routed experts the fullest of `devices` holds (vLLM gives the first E mod n one more)."""
    return math.ceil(moe.num_experts / max(1, devices))


def busiest_device_experts(moe: MoE, rows: float, devices: int) -> float:
    """Expected routed experts touched on the device that touches the most, when `rows` tokens
    route uniformly and each of `devices` holds `experts_a_device` whole experts: each expert
    is touched with p = touched / E (`experts_touched`), a device's count Binomial(m, p), and
    the expected largest of n such counts is sum over x < m of 1 - F(x)^n (one device: all
    touched). One token of Mixtral (k 2 of 8) over 2 devices: 1.46, against 1 expert a device
    under tensor parallelism; a large batch: every expert a device holds."""
    touched = experts_touched(moe, rows)
    if devices <= 1:
        return touched
    m = experts_a_device(moe, devices)
    p = min(1.0, touched / moe.num_experts)
    if p >= 1.0:
        return float(m)
    below = 0.0  # F(x): P(count <= x)
    expected = 0.0
    for x in range(m):
        below += math.comb(m, x) * p**x * (1.0 - p) ** (m - x)
        expected += 1.0 - min(1.0, below) ** devices
    return expected


def expert_parallel_share(op: Op, tp: int, moe: MoE | None, rows: float) -> Op:
    """One device's share of `op` under expert parallelism over `tp` devices: a routed
    expert's matmul reads the weights of the busiest device's touched experts, whole, and
    does 1/tp of the routed FLOPs; every other op is split as tensor parallelism splits it."""
    if tp == 1 or moe is None or not op.experts:
        return tensor_parallel_share(op, tp)
    held = busiest_device_experts(moe, rows, tp)
    scale = held / op.experts
    acts = (op.bytes - op.weight_bytes) / tp
    weights = op.weight_bytes * scale
    wide = op.name == "mlp_in"  # its n spans the experts; mlp_out's k does
    return replace(op, flops=op.flops / tp, bytes=weights + acts, weight_bytes=weights,
                   n=max(1, round(op.n * scale)) if wide else op.n,
                   k=op.k if wide else max(1, round(op.k * scale)), experts=held)
