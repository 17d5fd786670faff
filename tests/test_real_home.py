"""Nothing in the tests writes to the user's real home or cache (issue 37: CI's smoke test
wrote its probe into the real ~/.cache/gpuwise, where it then stood in for the user's own).
conftest.py points HOME, XDG_CACHE_HOME and GPUWISE_CACHE_DIR at a temporary home; these check
that a command run from a test, in this process and in a child, writes there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuwise.measure.probe.store import cache_dir

REAL_HOME = Path(os.environ["GPUWISE_TEST_REAL_HOME"])
REAL_CACHE = Path(os.environ["GPUWISE_TEST_REAL_CACHE"])


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def test_the_cache_of_every_test_is_a_temporary_home_not_the_users() -> None:
    home = Path.home()
    assert home != REAL_HOME and "gpuwise-test-home-" in home.name
    assert _inside(cache_dir(), home) and not _inside(cache_dir(), REAL_CACHE)


def test_a_probe_saved_by_a_child_command_lands_in_the_temporary_home() -> None:
    code = ("from gpuwise.measure.probe import NullBackend, ProbePlan, probe_with\n"
            "from gpuwise.measure.probe.store import save_profile\n"
            "p = probe_with(NullBackend(), ProbePlan.for_mode(True, 2**20))\n"
            "print(save_profile(p))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    saved = Path(out.stdout.strip().splitlines()[-1])
    assert saved.is_file() and _inside(saved, Path.home()) and not _inside(saved, REAL_CACHE)
