"""gpuwise: the truth about GPUs for machine learning.

The command line is `gpuwise` (`gpuwise --help`). In a Python program:

- `from_module(model, example_inputs, training=False, ...)`: memory and time of any PyTorch
  module, traced on the meta device (no memory, no weights used).
- `watch()`: `with gpuwise.watch() as w:` times a training loop from inside (`w.loader(...)`,
  `w.phase("forward")`, `w.step()`); `gpuwise watch --report` reads its log;
  `watch(prometheus=9400)` also serves its metrics for Prometheus.
- `seed_everything(seed=None)`: seed Python, NumPy and torch the way `gpuwise repro` asks.
- `report_metric(name, value)`: hand a run's result to `gpuwise repro`.
- `report_params_hash(model)`: the parameters' hash, to tell bit-identical runs apart.
- `step_hash(step, value)`: a per-step hash (of the loss, say), to find where runs diverge.
- `__version__`: the installed version.

Everything is imported on first use, so `import gpuwise` stays light (no torch).
"""

from __future__ import annotations

from typing import Any

_REPRO_API = ("seed_everything", "report_metric", "report_params_hash", "step_hash")
__all__ = ["from_module", "watch", *_REPRO_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _REPRO_API:
        from gpuwise.measure.repro import program_api as repro_api

        return getattr(repro_api, name)
    if name == "from_module":  # traces a torch module: torch is imported only when used
        from gpuwise.app.module import from_module

        return from_module
    if name == "watch":  # `with gpuwise.watch() as w:` times a training loop
        from gpuwise.measure.watch.api import watch

        return watch
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("gpuwise")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'gpuwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
