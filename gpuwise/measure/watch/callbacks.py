"""Callbacks for the Hugging Face Trainer and PyTorch Lightning, on gpuwise.watch(auto=True).

Both libraries are imported only when a callback is built, so this module imports without
them. The callback opens a watch when training starts (its hooks time DataLoader waits,
host-to-device copies, backward and optimizer steps) and marks a step where the library
ends one, so a step is exactly one optimizer step of the Trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.watch.api import watch


class _WatchedTraining:
    """The watch a callback holds for one training run."""

    def __init__(self, log: str | Path | None, interval_s: float) -> None:
        self.log = log
        self.interval_s = interval_s
        self.watch: watch | None = None

    def begin(self) -> None:
        self.watch = watch(self.log, interval_s=self.interval_s, auto=True)
        self.watch.__enter__()

    def step(self) -> None:
        if self.watch is not None:
            self.watch.step()

    def end(self) -> None:
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
            self.watch = None


def hf_callback(log: str | Path | None = None, interval_s: float = 0.2) -> Any:
    """A transformers TrainerCallback: `Trainer(..., callbacks=[hf_callback()])`."""
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise GpuwiseError("hf_callback needs transformers", "pip install transformers") from exc

    class GpuwiseWatchCallback(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.training = _WatchedTraining(log, interval_s)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.training.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.training.step()

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.training.end()

        @property
        def log_path(self) -> Path | None:
            return self.training.watch.log_path if self.training.watch else None

    return GpuwiseWatchCallback()


def lightning_callback(log: str | Path | None = None, interval_s: float = 0.2) -> Any:
    """A PyTorch Lightning Callback: `Trainer(callbacks=[lightning_callback()])`."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError as exc:
            raise GpuwiseError("lightning_callback needs PyTorch Lightning",
                               "pip install lightning") from exc

    class GpuwiseWatchCallback(Callback):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.training = _WatchedTraining(log, interval_s)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.training.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            self.training.step()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.training.end()

    return GpuwiseWatchCallback()
