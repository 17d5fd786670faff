"""What the claims' experiments share: the mode, a scratch folder, this machine, the device the
torch experiments run on, and what more than one experiment uses (the measured bandwidth, the
GGUF models written), each made once."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gpuwise.measure.hardware.detect import LocalMachine, detect_local

# progress(what is running, share of this experiment done from 0 to 1)
Step = Callable[[str, float], None]


def _quiet(what: str, done: float) -> None:
    """The progress of an experiment when nobody watches."""


@dataclass
class Context:
    quick: bool
    workdir: Path
    progress: Step = _quiet  # the runner's: this experiment's share of the run's bar
    _cache: dict[Any, Any] = field(default_factory=dict)
    _done: float = 0.0

    def step(self, what: str, done: float | None = None) -> None:
        """Say what runs now and how much of the experiment is done (None: as before)."""
        if done is not None:
            self._done = min(max(done, 0.0), 1.0)
        self.progress(what, self._done)

    @cached_property
    def machine(self) -> LocalMachine:
        return detect_local()

    @cached_property
    def device(self) -> str:
        """Where the torch experiments run: "cuda" when torch sees a GPU, else "cpu"."""
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def device_kind(self) -> str:
        """The kind of device the experiments judge inference on (hardware.toml's: gpu where
        torch sees one, else this machine's best device's: cpu or apple): what
        judged_on.runtime_for picks the runtime people use by."""
        return "gpu" if self.on_gpu else self.machine.best_device().kind

    @property
    def cores(self) -> int:
        return os.cpu_count() or 1

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        """`make()` the first time `key` is asked for; the same value after."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full
