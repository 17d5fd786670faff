"""Count the operations a runtime dispatches per layer, per family: the fixed per-operation
cost (dispatch on a CPU, kernel launch on a GPU) of an eager runtime is paid once per op.

Builds the same tiny models as the activation profiler, runs a no-grad forward (inference)
and a training forward + backward under a TorchDispatchMode that counts every aten call,
with one and with two layers to separate what each layer costs from what the model costs
once. The counts are catalog/data/op_counts.json, read by the pure time model, written by
`tools/write_op_counts.py` (needs torch and transformers).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuwise.measure.module.op_counter import op_counter
from gpuwise.measure.profiles.activations import ATTENTIONS, FAMILIES, B, S, V, tiny_model


def count_one(family: str, mode: str, attention: str) -> dict[str, dict[str, int]]:
    import torch

    out: dict[str, list[tuple[int, int]]] = {"inference": [], "decode": [], "training": []}
    for layers in (1, 2):
        _, model = tiny_model(family, mode, attention, layers)
        ids = torch.randint(0, V, (B, S))
        model.eval()
        with torch.no_grad():
            counter = op_counter()
            with counter:
                res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            out["inference"].append((counter.kernels, counter.views))
            counter = op_counter()
            with counter:
                model(input_ids=ids[:, :1], past_key_values=res.past_key_values, use_cache=True,
                      logits_to_keep=1)
            out["decode"].append((counter.kernels, counter.views))
        model.train()
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "mixed-bf16"
                    else contextlib.nullcontext())
        counter = op_counter()
        with counter:
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        out["training"].append((counter.kernels, counter.views))
    result = {}
    for phase, ((k1, v1), (k2, v2)) in out.items():
        result[phase] = {"kernels_per_layer": k2 - k1, "views_per_layer": v2 - v1,
                         "kernels_model": 2 * k1 - k2, "views_model": 2 * v1 - v2}
    return result


def count_all() -> dict[str, Any]:
    import torch
    import transformers

    counts: dict[str, Any] = {}
    for family in FAMILIES:
        for mode in ("fp32", "bf16", "mixed-bf16"):
            for attention in ATTENTIONS:
                key = f"{family}/{mode}/{attention}"
                try:
                    counts[key] = count_one(family, mode, attention)
                except ValueError as exc:
                    counts[key] = {"unsupported": str(exc).split(".")[0]}
    return {
        "about": "aten ops dispatched per decoder layer and per model (no-grad prefill, one "
        "decode step, training forward+backward); views launch no kernel",
        "runtime": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "counts": counts,
    }
