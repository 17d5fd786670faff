"""Real PyTorch runs inside this process, as the real-run validations build them (random
weights from a config, transformers' generate() and training step: gpuwise.measure.runs), timed
with the energy they used where a counter can be read (RAPL, NVML), else with the threads'
busy share so the energy can be estimated."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwise.measure.repro.energy import EnergyMeter
from gpuwise.measure.runs.jobs import inference_job, training_job
from gpuwise.measure.runs.model_build import build_model
from gpuwise.measure.runs.plans import inference_plan, training_plan


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
                 vocab: int = 32000) -> dict[str, Any]:
    """config.json facts of a llama model of these sizes (untied head, as the GGUFs)."""
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 4096,
            "tie_word_embeddings": False}


@dataclass(frozen=True)
class TorchTiming:
    """Seconds (and joules, where counted) per unit: a generated token or a training step."""

    seconds: float
    joules: float | None  # None: no counter could be read (energy_note says why)
    energy_note: str
    busy_share: float | None  # CPU time of this process over wall time x threads, timed loop
    threads: int
    device: str
    weight_bytes: int  # the parameters' bytes, the input embedding table excluded
    params: int


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


class _Window:
    """Wall time, CPU time and counted joules over a stretch of work."""

    def __init__(self, meter: EnergyMeter, sync: Callable[[], None]) -> None:
        self.meter, self.sync = meter, sync

    def __enter__(self) -> _Window:
        self.sync()
        self.energy0 = self.meter.read() if self.meter.available else None
        self.cpu0, self.t0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sync()
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0
        after = self.meter.read() if self.energy0 is not None else None
        self.joules = (self.meter.delta(self.energy0, after)
                       if self.energy0 is not None and after is not None else None)


def _int8_linears(model: Any) -> Any:
    """The model with every nn.Linear's weights in int8, activations quantized on the fly
    (torch.ao's dynamic quantization: what PyTorch offers for int8 on a CPU without torchao)."""
    import warnings

    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # deprecated in favour of torchao, which is not required
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def _weights(model: Any) -> tuple[int, int]:
    """(bytes, count) of the parameters, the input embedding table excluded: what a decode step
    reads (it reads one row of that table)."""
    embedding = model.get_input_embeddings().weight
    params = [p for p in model.parameters() if p is not embedding]
    nbytes, count = (sum(p.numel() * p.element_size() for p in params),
                     sum(p.numel() for p in params))
    for module in model.modules():  # dynamically quantized linears keep packed int8 weights
        packed = getattr(module, "_packed_params", None)
        if packed is not None and hasattr(module, "weight"):
            weight = module.weight()
            nbytes += weight.numel() * weight.element_size()
            count += weight.numel()
    return nbytes, count


def _threads(device: str) -> int:
    import torch

    return 1 if device.startswith("cuda") else torch.get_num_threads()


def decode_timing(config: dict[str, Any], device: str, dtype: str, prompt: int,
                  new_tokens: int, repeats: int, int8: bool = False) -> TorchTiming:
    """A generated token: (generate N tokens - generate 1) / (N - 1), as the real runs time
    decode, over `repeats` runs of each (medians; energy over all of them). `int8`: the
    linear layers' weights quantized to int8 first (torch's dynamic quantization, a CPU)."""
    job = inference_job(config, batch=1, prompt_tokens=prompt, new_tokens=new_tokens,
                        dtype=dtype, device=device)
    model = build_model(job)
    if int8:
        model = _int8_linears(model)
    one, full = inference_plan(model, {**job, "new_tokens": 1}), inference_plan(model, job)
    one(), full()  # warm-up
    meter, sync = EnergyMeter(), _sync(device)
    ones: list[float] = []
    fulls: list[float] = []
    joules, cpu, wall = [0.0, 0.0], 0.0, 0.0
    counted = meter.available
    for _ in range(repeats):
        for i, (run, times) in enumerate(((one, ones), (full, fulls))):
            with _Window(meter, sync) as w:
                run()
            times.append(w.wall)
            counted = counted and w.joules is not None
            joules[i] += w.joules or 0.0
            if i == 1:
                cpu, wall = cpu + w.cpu, wall + w.wall
    n = new_tokens - 1
    seconds = (statistics.median(fulls) - statistics.median(ones)) / n
    per_token_j = (joules[1] - joules[0]) / (repeats * n) if counted else None
    nbytes, count = _weights(model)
    threads = _threads(device)
    return TorchTiming(max(seconds, 0.0), per_token_j, meter.note(), _busy(cpu, wall, threads),
                       threads, device, nbytes, count)


def training_timing(config: dict[str, Any], device: str, dtype: str, batch: int, seq: int,
                    steps: int) -> TorchTiming:
    """A training step (forward with labels, backward, AdamW step, zero_grad): the median of
    `steps` after a warm-up step; energy over all of them."""
    job = training_job(config, batch=batch, seq=seq, dtype=dtype, device=device, steps=1)
    model = build_model(job)
    step, _ = training_plan(model, job)
    step()  # warm-up: creates the optimizer states
    meter, sync = EnergyMeter(), _sync(device)
    times, joules, cpu, wall, counted = [], 0.0, 0.0, 0.0, meter.available
    for _ in range(steps):
        with _Window(meter, sync) as w:
            step()
        times.append(w.wall)
        cpu, wall = cpu + w.cpu, wall + w.wall
        counted = counted and w.joules is not None
        joules += w.joules or 0.0
    nbytes, count = _weights(model)
    threads = _threads(device)
    return TorchTiming(statistics.median(times), joules / steps if counted else None,
                       meter.note(), _busy(cpu, wall, threads), threads, device, nbytes, count)


def _busy(cpu_s: float, wall_s: float, threads: int) -> float | None:
    if wall_s <= 0 or threads < 1:
        return None
    return min(1.0, cpu_s / (wall_s * threads))
