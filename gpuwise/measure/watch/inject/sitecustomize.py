"""gpuwise watch's start-up hook, put first on a watched program's PYTHONPATH.

Python imports `sitecustomize` at start-up. This one first runs the sitecustomize it hides
(the next one on sys.path, if any), then, when GPUWISE_WATCH_LOG names a log, opens a step
recorder and arranges for torch to be instrumented right after torch is imported (torch is
never imported here: a program that does not use it pays nothing). Every failure is silent:
the program must run as it would without gpuwise.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_to_hidden_sitecustomize() -> None:
    me = sys.modules.get("sitecustomize")
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        del sys.modules["sitecustomize"]
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception:
        pass
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


class _AfterTorchImport:
    """A meta-path finder that runs `callback(torch)` once `import torch` has finished."""

    def __init__(self, callback: Callable[[ModuleType], None]) -> None:
        self.callback = callback

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            with contextlib.suppress(Exception):
                callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _start() -> None:
    path = os.environ.get("GPUWISE_WATCH_LOG")
    if not path or os.environ.get("GPUWISE_WATCH_INJECT", "1") == "0" or "torch" in sys.modules:
        return
    import atexit

    import _gpuwise_watch_recorder as recorder  # noqa: I001  (beside this file)

    sync = None if os.environ.get("GPUWISE_WATCH_SYNC", "1") != "0" else False
    rec = recorder.StepRecorder(recorder.JsonlLog(path), source="inject", sync=sync)
    recorder.active = rec
    atexit.register(rec.close)

    def instrument(torch: ModuleType) -> None:
        import _gpuwise_watch_hooks as hooks

        hooks.install(torch, rec)

    sys.meta_path.insert(0, _AfterTorchImport(instrument))


_chain_to_hidden_sitecustomize()
with contextlib.suppress(Exception):
    _start()
