"""Measure the eager runtime's own cost on this machine: what Hugging Face transformers and
PyTorch spend per dispatched operation (Python modules, hooks, dispatcher) and per generated
token (generate()'s loop: logits processing, stopping criteria, cache bookkeeping).

A tiny Llama (hidden 64: the arithmetic is negligible) runs with 1 and with 5 layers, the
two taking turns call by call; the difference per layer, divided by the ops a Llama layer
dispatches (measured op counts), is the cost per op; what remains at zero layers is the
fixed cost per step. The time model
uses these in place of the bare tiny-op time for `--on local` once `gpuwise probe` ran.

`device` "cuda" runs the same on GPU 0, each call synchronised at its end: the tiny model's
kernels take microseconds, so what is timed is the host's dispatch, which is what an eager
decode on a GPU waits for. The cold-cache factor is a CPU's (weights streamed through the
caches the dispatcher also uses); a GPU streams them through its own memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gpuwise.catalog.runtimes import op_counts
from gpuwise.measure.call_timing import median_call_s

LAYERS = (1, 5)


VOCABS = (256, 65536)  # the logits step's cost per vocabulary entry: between these


def _tiny_llama(layers: int, vocab: int = VOCABS[0], device: str = "cpu") -> Any:
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=layers,
                                   vocab_size=vocab, max_position_embeddings=512)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(device)


def _synced(fn: Callable[[], object], device: str) -> Callable[[], object]:
    """`fn`, waiting at its end for the device's queued work (a CPU has none)."""
    if not device.startswith("cuda"):
        return fn
    import torch

    def run() -> object:
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def _rounds(calls: dict[str, Callable[[], object]], repeats: int) -> list[dict[str, float]]:
    """Seconds of each call, round by round: the calls take turns (one each per round, after
    a warm-up round), so a machine that changes speed moves them together and the
    differences between them, which are what is measured, keep."""
    for fn in calls.values():
        fn()
    rounds = []
    for _ in range(repeats):
        times = {}
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - start
        rounds.append(times)
    return rounds


def _over_rounds(rounds: list[dict[str, float]], value: Callable[[dict[str, float]], float]) -> float:
    return statistics.median(value(r) for r in rounds)


def _generate(model: Any, ids: Any, n: int, device: str = "cpu") -> Callable[[], object]:
    """generate() greedy with `n` new tokens and min_new_tokens, as `gpuwise validate` runs it."""
    import torch

    mask = torch.ones_like(ids)

    def run() -> object:
        model.eval()
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)

    return _synced(run, device)


def _decode_s(r: dict[str, float], tag: object) -> float:
    """A round's seconds per generated token after the first: (17 tokens - 1) / 16."""
    return (r[f"generate17 {tag}"] - r[f"generate1 {tag}"]) / 16


FORWARD_STEPS = 4  # decode forwards per timed call of `_forward_steps`


def _forward_steps(model: Any, ids: Any, steps: int = FORWARD_STEPS,
                   device: str = "cpu") -> Callable[[], object]:
    """The model's own decode forward (one token, the cache growing), `steps` at a time,
    without generate()'s loop around it."""
    import torch

    with torch.no_grad():
        out = model(ids, use_cache=True)
    # transformers 5 names the cache `cache` (`past_key_values` before).
    name = "cache" if "cache" in out else "past_key_values"
    kwargs, token = {name: out[name], "use_cache": True}, ids[:, -1:]

    def run() -> None:
        with torch.no_grad():
            for _ in range(steps):
                model(token, **kwargs)

    return _synced(run, device)


def measure_logits_step(repeats: int = 25, device: str = "cpu") -> float:
    """Seconds per vocabulary entry (per sequence) of generate()'s own work on each step's
    logits: the fp32 copy, the logits processors, the argmax. It is what generate() adds to
    the model's forward, grown with the vocabulary (lm_head's own work is in both)."""
    import torch

    torch.manual_seed(0)
    calls: dict[str, Callable[[], object]] = {}
    for vocab in VOCABS:
        model = _tiny_llama(1, vocab, device).eval()
        ids = torch.randint(0, vocab, (1, 8), device=device)
        calls |= {f"generate1 {vocab}": _generate(model, ids, 1, device),
                  f"generate17 {vocab}": _generate(model, ids, 17, device),
                  f"forward {vocab}": _forward_steps(model, ids, device=device)}

    def extra(r: dict[str, float], vocab: int) -> float:
        return _decode_s(r, vocab) - r[f"forward {vocab}"] / FORWARD_STEPS

    rounds = _rounds(calls, repeats)
    small, big = VOCABS
    per_entry = _over_rounds(rounds, lambda r: (extra(r, big) - extra(r, small)) / (big - small))
    return max(0.0, per_entry)


def _training_step(model: Any, ids: Any, device: str = "cpu") -> Callable[[], object]:
    import torch

    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _synced(step, device)


def _per_layer_and_fixed(rounds: list[dict[str, float]],
                         seconds: Callable[[dict[str, float], int], float]) -> tuple[float, float]:
    """(seconds per layer, seconds at zero layers) of a phase, from each round's 1- and
    5-layer times (the median of the rounds' differences)."""
    few, many = LAYERS
    per_layer = max(0.0, _over_rounds(rounds, lambda r: (seconds(r, many) - seconds(r, few))
                                      / (many - few)))
    return per_layer, _over_rounds(rounds, lambda r: seconds(r, few)) - per_layer * few


def measure_runtime_overhead(repeats: int = 15, device: str = "cpu") -> dict[str, float]:
    """Seconds per dispatched op and fixed seconds per step, by phase ('inference' =
    prefill, 'decode', 'training'). Raises ImportError without torch/transformers."""
    import torch

    torch.manual_seed(0)
    ids = torch.randint(0, VOCABS[0], (1, 8), device=device)
    calls: dict[str, Callable[[], object]] = {}
    for layers in LAYERS:
        model = _tiny_llama(layers, device=device)
        calls |= {f"generate1 {layers}": _generate(model, ids, 1, device),
                  f"generate17 {layers}": _generate(model, ids, 17, device),
                  f"training {layers}": _training_step(model, ids, device)}
    rounds = _rounds(calls, repeats)
    phases: dict[str, Callable[[dict[str, float], int], float]] = {
        "inference": lambda r, n: r[f"generate1 {n}"], "decode": _decode_s,
        "training": lambda r, n: r[f"training {n}"]}
    out: dict[str, float] = {}
    for key, seconds in phases.items():
        counts = op_counts("llama", "fp32", "sdpa")[key]
        per_layer, fixed = _per_layer_and_fixed(rounds, seconds)
        ops = counts["kernels_per_layer"] + counts["views_per_layer"] / 3
        out[f"{key}_op_s"] = per_layer / ops
        model_ops = counts["kernels_model"] + counts["views_model"] / 3
        out[f"{key}_step_s"] = max(0.0, fixed - model_ops * out[f"{key}_op_s"])
    return out


COLD_LAYERS = 4
FLUSH_BYTES = 32 * 2**20  # read between layers: past the L2, a third of this LLC


def measure_cold_factor(repeats: int = 40) -> float:
    """How much more the runtime's per-op cost is when the caches are cold, as in a real
    model, whose every matmul streams megabytes of weights through them between two ops:
    a tiny Llama's decode step with `FLUSH_BYTES` read before each layer (less the reads'
    own time, timed in the same round) over the same step without, median over rounds."""
    import torch

    model = _tiny_llama(COLD_LAYERS).eval()
    flush = torch.ones(FLUSH_BYTES // 4)
    cold = {"on": False}

    def read_before(*_: object) -> None:
        if cold["on"]:
            flush.sum()

    for layer in model.model.layers:
        layer.register_forward_pre_hook(read_before)
    step = _forward_steps(model, torch.randint(0, VOCABS[0], (1, 8)), steps=1)

    def run(on: bool) -> Callable[[], object]:
        def timed() -> None:
            cold["on"] = on
            step()

        return timed

    def reads() -> None:
        for _ in range(COLD_LAYERS):
            flush.sum()

    rounds = _rounds({"hot": run(False), "cold": run(True), "reads": reads}, repeats)
    extra = _over_rounds(rounds, lambda r: r["cold"] - r["reads"] - r["hot"])
    hot = _over_rounds(rounds, lambda r: r["hot"])
    return min(3.0, max(1.0, 1.0 + extra / hot))


GEMV_SHAPES = ((576, 1536), (1536, 576), (2048, 8192), (4096, 4096))  # (in, out)
GEMV_SET_BYTES = 384 * 2**20  # cycle through more weights than any cache holds


def measure_gemv(dtypes: tuple[str, ...] = ("fp32", "bf16"),
                 device: str = "cpu") -> dict[str, list[list[float]]]:
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
            weights = [torch.randn(n, k, dtype=torch_dtypes[dtype], device=device)
                       for _ in range(count)]
            x = torch.randn(1, k, dtype=torch_dtypes[dtype], device=device)

            def sweep(ws: list = weights, x: Any = x) -> None:
                for w in ws:
                    torch.nn.functional.linear(x, w)

            seconds = median_call_s(_synced(sweep, device), 3)
            points.append([float(k * n * item), count * k * n * item / seconds])
            del weights
        out[dtype] = sorted(points)
    return out
