"""What every test shares: the markers acted on, and the light-import check.

- `torch`: needs torch (and transformers) installed; skipped, with the reason, without them.
- `gpu`: needs a CUDA GPU; skipped without one.
- `slow`: real runs of seconds to minutes; run only when asked (`pytest --slow`, as
  `make test` and CI do).

Nothing a test runs writes to the user's real home or cache: before any test is collected,
HOME, XDG_CACHE_HOME and GPUWISE_CACHE_DIR point at a new temporary home (inherited by every
command a test starts), and the session fails if the real gpuwise cache changed while it ran
(tests/test_real_home.py checks where the commands write).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("torch", "numpy", "transformers")


REAL_HOME_ENV = "GPUWISE_TEST_REAL_HOME"
CACHE_VARS = ("HOME", "XDG_CACHE_HOME", "GPUWISE_CACHE_DIR")


def _real_cache() -> Path:
    """The gpuwise cache a user's run here reads (store.cache_dir, before the tests move it)."""
    from gpuwise.measure.probe.store import cache_dir

    return cache_dir()


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time (empty: none)."""
    if not folder.is_dir():
        return {}
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _ci_examples() -> None:
    """Under CI (CI=true), hypothesis draws the same examples each run, so that a property's
    rare counterexample is found here, exploring, not by a submission's CI run at random."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    _ci_examples()
    real = _real_cache()
    config.stash[_REAL_CACHE] = (real, _listing(real))
    home = Path(tempfile.mkdtemp(prefix="gpuwise-test-home-"))
    os.environ[REAL_HOME_ENV] = str(Path.home())
    os.environ["GPUWISE_TEST_REAL_CACHE"] = str(real)
    os.environ.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
                       "GPUWISE_CACHE_DIR": str(home / ".cache" / "gpuwise")})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    real, before = session.config.stash[_REAL_CACHE]
    if _listing(real) != before:
        print(f"\nerror: the tests changed the user's real gpuwise cache {real}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_REAL_CACHE = pytest.StashKey[tuple[Path, dict[str, tuple[int, int]]]]()
FIGURES: list[str] = []  # lines a test asks to show in the run's summary (`figure`)


@pytest.fixture
def figure() -> Callable[[str], None]:
    """figure(line): show `line` in the summary at the run's end, so a log shows what a real
    run measured (the llama.cpp workflow's probe time and errors) without -s."""
    return FIGURES.append


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("figures measured by the tests")
        for line in FIGURES:
            terminalreporter.write_line(line)


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
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    return run
