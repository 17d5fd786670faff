"""peft's LoRA branch as operations: what a LoRA (or QLoRA) step runs beside the frozen
matmuls.

For each targeted matrix (in k, out n) over m rows, peft runs
``lora_B(lora_A(dropout(x))) * scaling`` and adds it to the frozen layer's output
(``LoraConfig``'s default dropout is 0: an identity). On a 16-bit base its adapters are
fp32 (``get_peft_model(autocast_adapter_dtype=True)``, the default), so the input is cast
up, the branch and the sum run in fp32 and the sum is cast back. On an H200 an 8B model's
step (batch 4 x 1024 tokens, rank 16 on all seven matrices) spent about 60 ms of its 456
in the fp32 adapter GEMMs and 140 ms in those casts, scalings and sums (torch.profiler,
2026-12-04: benchmarks/results/gpu_h200/profile_two_steps.txt; docs/speed.md, "Training"):
without them the estimate was 50% low.
"""

from __future__ import annotations

from gpuwise.workload.ops import Op

COPY = "binary"  # the probed kernel a cast, a scaling or a sum runs at (bytes/s)


def lora_ops(dims: dict[str, tuple[int, int]], rank: int, rows: int, layers: int,
             compute_bytes: float, adapter_bytes: float) -> tuple[list[Op], list[Op]]:
    """(forward ops, backward ops) of the LoRA branches on the targeted matrices `dims`
    ({name: (in, out)}) of every layer, `rows` tokens each; `adapter_bytes` 4 where the
    adapters are fp32 on a 16-bit base (`compute_bytes` 2), then the casts run too."""
    forward: list[Op] = []
    backward: list[Op] = []
    for name, (k, n) in dims.items():
        f, b = _branch(name, k, n, rank, rows, layers, compute_bytes, adapter_bytes)
        forward += f
        backward += b
    return forward, backward


def _branch(name: str, k: int, n: int, r: int, m: int, layers: int, c: float,
            a: float) -> tuple[list[Op], list[Op]]:
    dtype = "fp32" if a == 4 else ""
    cast = a != c

    def gemm(what: str, rows: int, inner: int, out: int, weight: float) -> Op:
        moved = (rows * inner + inner * out + rows * out) * a
        return Op(f"{name}.{what}", "matmul", 2.0 * rows * inner * out, moved, layers,
                  m=rows, n=out, k=inner, weight_bytes=weight, dtype=dtype)

    def stream(what: str, elements: float, bytes_each: float, flops: float = 0.0) -> Op:
        return Op(f"{name}.{what}", "elementwise", flops, elements * bytes_each, layers,
                  kernel=COPY, streamed=True)

    x, y = float(m * k), float(m * n)
    forward = [
        *([stream("lora_cast_in", x, c + a)] if cast else []),
        gemm("lora_a", m, k, r, k * r * a),
        gemm("lora_b", m, r, n, r * n * a),
        stream("lora_scale", y, 2 * a, y),
        stream("lora_add", y, c + 2 * a, y),  # the frozen output (16-bit) + the branch
        *([stream("lora_cast_out", y, a + c)] if cast else []),
    ]
    backward = [
        # the cast back's gradient up to fp32, and the sum's gradient down to the base's dtype
        *([stream("lora_cast_out_grad", y, c + a), stream("lora_base_grad_cast", y, a + c)]
          if cast else []),
        stream("lora_scale_grad", y, 2 * a, y),
        gemm("lora_b_input_grad", m, n, r, r * n * a),
        gemm("lora_b_weight_grad", n, m, r, 0.0),
        gemm("lora_a_input_grad", m, r, k, k * r * a),
        gemm("lora_a_weight_grad", r, m, k, 0.0),
        *([stream("lora_cast_in_grad", x, a + c)] if cast else []),
        stream("lora_input_grad_add", x, 3 * c, x),  # into the frozen matmul's input grad
    ]
    return forward, backward
