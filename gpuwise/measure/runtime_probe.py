"""Measure the eager runtime's own cost on this machine: what Hugging Face transformers and
PyTorch spend per dispatched operation (Python modules, hooks, dispatcher) and per generated
token (generate()'s loop: logits processing, stopping criteria, cache bookkeeping).

A tiny Llama (hidden 64: the arithmetic is negligible) runs with 1 and with 5 layers; the
difference per layer, divided by the ops a Llama layer dispatches (measured op counts), is
the cost per op; what remains at zero layers is the fixed cost per step. The time model
uses these in place of the bare tiny-op time for `--on local` once `gpuwise probe` ran.
"""

from __future__ import annotations

from typing import Any

from gpuwise.helpers import median_call_s

LAYERS = (1, 5)


def _tiny_llama(layers: int) -> Any:
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=layers,
                                   vocab_size=256, max_position_embeddings=512)  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def _per_phase(layers: int, repeats: int) -> dict[str, float]:
    import torch

    model = _tiny_llama(layers).eval()
    ids = torch.randint(0, 256, (1, 8))
    mask = torch.ones_like(ids)

    def generate(n: int) -> Any:
        return lambda: model.generate(ids, attention_mask=mask, max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, pad_token_id=0)  # fmt: skip

    one = median_call_s(generate(1), repeats)
    many = median_call_s(generate(17), repeats)
    model.train()
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"prefill": one, "decode": (many - one) / 16, "training": median_call_s(step, repeats)}


def measure_runtime_overhead(repeats: int = 15) -> dict[str, float]:
    """Seconds per dispatched op and fixed seconds per step, by phase ('inference' =
    prefill, 'decode', 'training'). Raises ImportError without torch/transformers."""
    import torch

    from gpuwise.catalog.runtimes import op_counts

    torch.manual_seed(0)
    small, big = (_per_phase(n, repeats) for n in LAYERS)
    out: dict[str, float] = {}
    for phase, key in (("prefill", "inference"), ("decode", "decode"), ("training", "training")):
        counts = op_counts("llama", "fp32", "sdpa")[key]
        per_layer = max(0.0, (big[phase] - small[phase]) / (LAYERS[1] - LAYERS[0]))
        ops = counts["kernels_per_layer"] + counts["views_per_layer"] / 3
        out[f"{key}_op_s"] = per_layer / ops
        fixed = small[phase] - per_layer * LAYERS[0]
        model_ops = counts["kernels_model"] + counts["views_model"] / 3
        out[f"{key}_step_s"] = max(0.0, fixed - model_ops * out[f"{key}_op_s"])
    return out


GEMV_SHAPES = ((576, 1536), (1536, 576), (2048, 8192), (4096, 4096))  # (in, out)
GEMV_SET_BYTES = 384 * 2**20  # cycle through more weights than any cache holds


def measure_gemv(dtypes: tuple[str, ...] = ("fp32", "bf16")) -> dict[str, list[list[float]]]:
    """Bytes/s of a one-row matmul (a decode step's GEMV) against weights that are not in the
    cache, by weight-matrix size: [[matrix_bytes, bytes_per_s], ...] per dtype. A decode step
    touches each weight once, so the repeated-weight benchmark of a GEMV flatters it."""
    import torch

    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out: dict[str, list[list[float]]] = {}
    for dtype in dtypes:
        points = []
        for k, n in GEMV_SHAPES:
            item = torch.empty((), dtype=torch_dtypes[dtype]).element_size()
            count = max(2, int(GEMV_SET_BYTES // (k * n * item)))
            weights = [torch.randn(n, k, dtype=torch_dtypes[dtype]) for _ in range(count)]
            x = torch.randn(1, k, dtype=torch_dtypes[dtype])

            def sweep(ws: list = weights, x: Any = x) -> None:
                for w in ws:
                    torch.nn.functional.linear(x, w)

            seconds = median_call_s(sweep, 3)
            points.append([float(k * n * item), count * k * n * item / seconds])
            del weights
        out[dtype] = sorted(points)
    return out
