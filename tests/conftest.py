"""What every test shares: the markers acted on, and the light-import check.

- `torch`: needs torch (and transformers) installed; skipped, with the reason, without them.
- `gpu`: needs a CUDA GPU; skipped without one.
- `slow`: real runs of seconds to minutes; run only when asked (`pytest --slow`, as
  `make test` and CI do).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from functools import cache

import pytest

HEAVY = ("torch", "numpy", "transformers")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the slow real-run tests")


@cache
def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


@cache
def _has_cuda() -> bool:
    if not _has_torch():
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = config.getoption("--slow")
    for item in items:
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow real run: pytest --slow runs it"))
        if "torch" in item.keywords and not _has_torch():
            item.add_marker(pytest.mark.skip(reason="needs torch: pip install 'gpuwise[torch]'"))
        if "gpu" in item.keywords and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture
def heavy_imports() -> Callable[[str], list[str]]:
    """heavy_imports(code): which of torch, numpy and transformers a fresh interpreter has
    imported after running `code` (gpuwise's estimators answer without any of them)."""

    def run(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
        probe = (f"{code}\nimport json, sys\n"
                 f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True)  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])

    return run
