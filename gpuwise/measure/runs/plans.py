"""What a real run runs, in the child process, on the built model: a greedy `generate` of the
plan's tokens, or training steps (forward with labels, backward, optimizer step, zero_grad).
Inputs are random token ids (seed 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwise.measure.runs.jobs import KV_QUANTIZED
from gpuwise.measure.runs.model_build import torch_dtype
from gpuwise.measure.runs.optimizers import make_optimizer


def _vocab_size(model: Any) -> int:
    return int(model.config.get_text_config().vocab_size)


def inference_plan(model: Any, job: dict) -> Callable[[], None]:
    import torch

    generator = torch.Generator().manual_seed(0)
    shape = (job["batch"], job["prompt_tokens"])
    ids = torch.randint(0, _vocab_size(model), shape, generator=generator).to(job["device"])
    mask = torch.ones_like(ids)
    extra: dict[str, Any] = {}
    if job["kv_dtype"] is not None:
        backend, nbits = KV_QUANTIZED[job["kv_dtype"]]
        cache_config: dict[str, Any] = {"backend": backend}
        if nbits is not None:
            cache_config["nbits"] = nbits
        extra = {"cache_implementation": "quantized", "cache_config": cache_config}

    def run() -> None:
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=job["new_tokens"],
            min_new_tokens=job["new_tokens"],
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            **extra,
        )

    return run


def training_plan(model: Any, job: dict) -> tuple[Callable[[], None], Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    shape = (job["batch"], job["seq"])
    ids = torch.randint(0, _vocab_size(model), shape, generator=generator).to(job["device"])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(job["optimizer"], params)
    device_type = "cuda" if job["device"].startswith("cuda") else "cpu"
    mixed = job["dtype"].startswith("mixed-")
    autocast_dtype = torch_dtype(job["dtype"].removeprefix("mixed-")) if mixed else None
    # No GradScaler for mixed-fp16: its state is a few scalars, and with random weights it
    # could skip the first steps, which would leave the optimizer states uncreated.

    def step() -> None:
        with torch.autocast(device_type, dtype=autocast_dtype, enabled=mixed):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def run() -> None:
        for _ in range(job["steps"]):
            step()

    return run, optimizer
