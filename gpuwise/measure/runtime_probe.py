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


VOCABS = (256, 65536)  # the logits step's cost per vocabulary entry: between these


def _tiny_llama(layers: int, vocab: int = VOCABS[0]) -> Any:
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=layers,
                                   vocab_size=vocab, max_position_embeddings=512)  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def _generate_steps(model: Any, ids: Any, repeats: int) -> tuple[float, float]:
    """(seconds of generate() with one new token, seconds per further token): greedy, with
    min_new_tokens, as `gpuwise validate` runs it."""
    import torch

    mask = torch.ones_like(ids)

    def generate(n: int) -> Any:
        return lambda: model.generate(ids, attention_mask=mask, max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, pad_token_id=0)  # fmt: skip

    one = median_call_s(generate(1), repeats)
    return one, (median_call_s(generate(17), repeats) - one) / 16


def _forward_step_s(model: Any, ids: Any, repeats: int) -> float:
    """Seconds of the model's own decode forward (one token, the cache growing), without
    generate()'s loop around it."""
    import torch

    with torch.no_grad():
        out = model(ids, use_cache=True)
        # transformers 5 names the cache `cache` (`past_key_values` before).
        name = "cache" if "cache" in out else "past_key_values"
        step = {name: out[name], "use_cache": True}
        token = ids[:, -1:]
        return median_call_s(lambda: model(token, **step), repeats)


def measure_logits_step(repeats: int = 25) -> float:
    """Seconds per vocabulary entry (per sequence) of generate()'s own work on each step's
    logits: the fp32 copy, the logits processors, the argmax. It is what generate() adds to
    the model's forward, grown with the vocabulary (lm_head's own work is in both)."""
    import torch

    torch.manual_seed(0)
    extra = []
    for vocab in VOCABS:
        model = _tiny_llama(1, vocab).eval()
        ids = torch.randint(0, vocab, (1, 8))
        step = _generate_steps(model, ids, repeats)[1]
        extra.append(step - _forward_step_s(model, ids, repeats * 4))
    return max(0.0, (extra[1] - extra[0]) / (VOCABS[1] - VOCABS[0]))


def _per_phase(layers: int, repeats: int) -> dict[str, float]:
    import torch

    model = _tiny_llama(layers).eval()
    ids = torch.randint(0, VOCABS[0], (1, 8))
    one, decode = _generate_steps(model, ids, repeats)
    model.train()
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"prefill": one, "decode": decode, "training": median_call_s(step, repeats)}


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
