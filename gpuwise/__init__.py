"""gpuwise: the truth about GPUs for machine learning.

The training-program API is imported on first use, so `import gpuwise` stays light.
"""

from __future__ import annotations

from typing import Any

_REPRO_API = ("seed_everything", "report_metric", "report_params_hash", "step_hash")


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
    raise AttributeError(f"module 'gpuwise' has no attribute {name!r}")
