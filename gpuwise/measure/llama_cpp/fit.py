"""llama.cpp's rates on this machine from llama-bench style timings of two probe models
(docs/speed.md, "llama.cpp on this CPU"): the constants of estimate/speed/ggml_time.py's model,
solved from the models' bytes, FLOPs and layers.

Token generation takes read / bandwidth + layers x layer_s a token: two models whose bytes per
layer differ give the bandwidth and the cost per layer. Prompt processing takes matmul FLOPs /
rate + layers x (layer_s + tokens x layer_token_s): with layer_s from tg, the two give the
matmul rate and the per-token work of the layer's other nodes (norms, rope, softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.estimate.speed.ggml_time import kv_bytes, prefill_flops, weights_read
from gpuwise.workload import Architecture, from_config
from gpuwise.workload.plans import InferencePlan, StoredWeights

# The GGUF file's main type for each quantisation llama_model_quantize writes.
GGML_TYPE = {"f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k_m": "q4_k"}


@dataclass(frozen=True)
class ModelTiming:
    """One model's pp and tg at one thread count, with what the model moves and computes."""

    arch: Architecture
    plan_pp: InferencePlan
    plan_tg: InferencePlan
    pp_s: float  # the whole prompt
    tg_s: float  # one generated token


def llama_arch(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
               vocab: int) -> Architecture:  # fmt: skip
    """The Architecture of a llama GGUF of these sizes (untied head, no biases)."""
    return from_config({"model_type": "llama", "hidden_size": hidden,
                        "num_hidden_layers": layers, "num_attention_heads": heads,
                        "num_key_value_heads": kv_heads, "intermediate_size": ffn,
                        "vocab_size": vocab, "max_position_embeddings": 4096,
                        "tie_word_embeddings": False, "name": f"h{hidden}-l{layers}"})  # fmt: skip


def timing_plans(qtype: str, total: int, embedding: int, n_prompt: int, n_gen: int,
                 threads: int) -> tuple[InferencePlan, InferencePlan]:  # fmt: skip
    """llama-bench's pp (a prompt, no generation) and tg (n_gen tokens from an empty cache;
    the plan's one-token prompt stands for the empty cache) as plans over the file's bytes."""
    stored = StoredWeights(total, embedding, qtype.upper(), GGML_TYPE[qtype])
    pp = InferencePlan(prompt_tokens=n_prompt, new_tokens=0, weights="fp16", stored_weights=stored,
                       runtime="llama.cpp", threads=threads)  # fmt: skip
    tg = InferencePlan(prompt_tokens=1, new_tokens=n_gen, weights="fp16", stored_weights=stored,
                       runtime="llama.cpp", threads=threads)  # fmt: skip
    return pp, tg


def _solve(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float]:
    """x, y with a[0] x + a[1] y = a[2] and b likewise; where that gives a negative y, y = 0
    and x from the equation with the larger first coefficient."""
    det = a[0] * b[1] - a[1] * b[0]
    if det:
        x = (a[2] * b[1] - a[1] * b[2]) / det
        y = (a[0] * b[2] - a[2] * b[0]) / det
        if x > 0 and y >= 0:
            return x, y
    big = max(a, b, key=lambda e: e[0])
    return big[2] / big[0], 0.0


def fit_rates(a: ModelTiming, b: ModelTiming) -> dict[str, float]:
    """GgmlRates' fields (but `source`) from two models' timings at one type and thread count.
    The KV cache and flash attention are charged at the weights' rates: at a probe's short
    contexts they are a few percent of the time."""
    eqs = []
    for m in (a, b):
        kv = kv_bytes(m.arch, m.plan_tg, m.plan_tg.new_tokens / 2)
        eqs.append((weights_read(m.arch, m.plan_tg) + kv, float(m.arch.num_layers), m.tg_s))
    per_byte, layer_s = _solve(eqs[0], eqs[1])
    eqs = []
    for m in (a, b):
        n = m.plan_pp.prompt_tokens
        layers = m.arch.num_layers
        eqs.append((sum(prefill_flops(m.arch, m.plan_pp)), float(layers * n),
                    m.pp_s - layers * layer_s))  # fmt: skip
    per_flop, layer_token_s = _solve(eqs[0], eqs[1])
    return {"weight_bytes_per_s": 1 / per_byte, "kv_bytes_per_s": 1 / per_byte,
            "matmul_flops": 1 / per_flop, "attention_flops": 1 / per_flop, "layer_s": layer_s,
            "token_s": 0.0, "layer_token_s": layer_token_s}  # fmt: skip
