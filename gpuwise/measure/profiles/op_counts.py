"""Count the operations a runtime dispatches per layer, per family: the fixed per-operation
cost (dispatch on a CPU, kernel launch on a GPU) of an eager runtime is paid once per op.

Builds the same tiny models as the activation profiler, runs a no-grad forward (inference)
and a training forward + backward under a TorchDispatchMode that counts every aten call,
with one and with two layers to separate what each layer costs from what the model costs
once. Writes catalog/data/op_counts.json, read by the pure time model.

Run: python -m gpuwise.measure.profiles.op_counts  (needs torch and transformers)
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from gpuwise.measure.profiles.activations import ATTENTIONS, FAMILIES, B, S, V, tiny_model

# Metadata-only ops cost a dispatch but launch no kernel; they are counted apart.
VIEW_OPS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice",
            "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "split",
            "unbind", "chunk", "_reshape_alias", "contiguous", "lift_fresh"}  # fmt: skip


def _counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = 0
            self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name in VIEW_OPS:
                self.views += 1
            else:
                self.kernels += 1
            return func(*args, **(kwargs or {}))

    return Counter()


def count_one(family: str, mode: str, attention: str) -> dict[str, dict[str, int]]:
    import torch

    out: dict[str, list[tuple[int, int]]] = {"inference": [], "decode": [], "training": []}
    for layers in (1, 2):
        _, model = tiny_model(family, mode, attention, layers)
        ids = torch.randint(0, V, (B, S))
        model.eval()
        with torch.no_grad():
            counter = _counter()
            with counter:
                res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            out["inference"].append((counter.kernels, counter.views))
            counter = _counter()
            with counter:
                model(input_ids=ids[:, :1], past_key_values=res.past_key_values, use_cache=True,
                      logits_to_keep=1)  # fmt: skip
            out["decode"].append((counter.kernels, counter.views))
        model.train()
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "mixed-bf16"
                    else contextlib.nullcontext())  # fmt: skip
        counter = _counter()
        with counter:
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        out["training"].append((counter.kernels, counter.views))
    result = {}
    for phase, ((k1, v1), (k2, v2)) in out.items():
        result[phase] = {"kernels_per_layer": k2 - k1, "views_per_layer": v2 - v1,
                         "kernels_model": 2 * k1 - k2, "views_model": 2 * v1 - v2}  # fmt: skip
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


def main() -> None:
    out = Path(__file__).parents[1] / "catalog" / "data" / "op_counts.json"
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else out
    data = count_all()
    target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(data['counts'])} op counts to {target}")


if __name__ == "__main__":
    main()
