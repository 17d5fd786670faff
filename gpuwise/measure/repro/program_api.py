"""The API a training program calls under `gpuwise repro` (exported from `gpuwise`).

    import gpuwise
    gpuwise.seed_everything()            # the seed, threads and determinism of this run
    for step in range(steps):
        ...
        gpuwise.step_hash(step, loss)    # finds the first step where two runs diverge
    gpuwise.report_metric("val_loss", val_loss)
    gpuwise.report_params_hash(model)    # tells bit-identical runs from merely close ones

`gpuwise repro` sets the environment variables below for each run; outside a study, every
call here is harmless: the seed defaults to 0 and nothing is written.

- GPUWISE_SEED: the run's seed; GPUWISE_THREADS: the CPU thread count to use (if set);
- GPUWISE_DETERMINISTIC=1: turn deterministic algorithms on;
- GPUWISE_REPRO_OUT: the file (JSON lines) where the calls report to the runner.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import random
import struct
import sys
from typing import Any

SEED_VAR = "GPUWISE_SEED"
THREADS_VAR = "GPUWISE_THREADS"
DETERMINISTIC_VAR = "GPUWISE_DETERMINISTIC"
OUT_VAR = "GPUWISE_REPRO_OUT"
# cuBLAS needs a fixed workspace to be deterministic; it must be set before CUDA starts.
CUBLAS_WORKSPACE = ":4096:8"


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(OUT_VAR)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _installed(name: str) -> bool:
    return name in sys.modules or importlib.util.find_spec(name) is not None


def seed_everything(seed: int | None = None) -> int:
    """Seed Python's `random`, numpy and torch (when installed) and apply the run's settings.

    seed: None takes GPUWISE_SEED (0 when unset). Also applies GPUWISE_THREADS
    (torch.set_num_threads) and GPUWISE_DETERMINISTIC=1 (torch.use_deterministic_algorithms,
    cuDNN deterministic and not benchmarking). PYTHONHASHSEED cannot change inside a running
    process; `gpuwise repro` sets it for each run. Returns the seed used.
    """
    if seed is None:
        seed = int(os.environ.get(SEED_VAR, "0"))
    deterministic = os.environ.get(DETERMINISTIC_VAR, "") == "1"
    threads = int(os.environ[THREADS_VAR]) if os.environ.get(THREADS_VAR) else None
    random.seed(seed)
    if _installed("numpy"):
        import numpy as np

        np.random.seed(seed % 2**32)
    if _installed("torch"):
        _seed_torch(seed, deterministic, threads)
    _write({"kind": "seed", "seed": seed, "deterministic": deterministic, "threads": threads})
    return seed


def _seed_torch(seed: int, deterministic: bool, threads: int | None) -> None:
    import torch

    torch.manual_seed(seed)  # seeds every CUDA device too
    if threads is not None:
        torch.set_num_threads(threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def report_metric(name: str, value: float) -> None:
    """Report a result of this run (the last report of a name wins)."""
    number = float(value)
    # JSON has no NaN or infinity: those travel as text ("nan", "inf") and are read back.
    _write(
        {"kind": "metric", "name": name, "value": number if math.isfinite(number) else repr(number)}
    )


def hash_of(thing: Any) -> str:
    """SHA-256 (hex) of a number, a tensor, a model (its state dict), a state dict or a list."""
    digest = hashlib.sha256()
    _feed(digest, thing)
    return digest.hexdigest()


def _feed(digest: Any, thing: Any) -> None:
    if isinstance(thing, bool | int | float):
        digest.update(struct.pack("<d", float(thing)))
    elif thing is None or isinstance(thing, str):  # settings inside an optimizer's state
        digest.update(repr(thing).encode())
    elif hasattr(thing, "state_dict"):  # a torch module: parameters and buffers, by name
        _feed(digest, thing.state_dict())
    elif isinstance(thing, dict):
        for key in sorted(thing, key=str):
            digest.update(str(key).encode())
            _feed(digest, thing[key])
    elif isinstance(thing, list | tuple):
        for item in thing:
            _feed(digest, item)
    elif hasattr(thing, "detach"):  # a tensor: dtype, shape, then the raw bytes
        digest.update(f"{thing.dtype}{tuple(thing.shape)}".encode())
        digest.update(_tensor_bytes(thing))
    elif hasattr(thing, "tobytes"):  # a numpy array
        digest.update(f"{thing.dtype}{thing.shape}".encode())
        digest.update(thing.tobytes())
    else:
        raise TypeError(f"cannot hash a {type(thing).__name__}")


def _tensor_bytes(tensor: Any) -> bytes:
    import torch

    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    if _installed("numpy"):
        return bytes(raw.numpy().tobytes())
    return bytes(raw.tolist())


def report_params_hash(model: Any) -> str:
    """Report the hash of the final parameters (a module, state dict or tensors); returns it."""
    value = hash_of(model)
    _write({"kind": "params_hash", "hash": value})
    return value


def step_hash(step: int, value: Any) -> str:
    """Report a hash of this step's loss, tensor or model; returns it (16 hex digits)."""
    value_hash = hash_of(value)[:16]
    _write({"kind": "step", "step": int(step), "hash": value_hash})
    return value_hash
