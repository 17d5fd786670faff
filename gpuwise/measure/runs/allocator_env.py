"""The environment a measured process gets for the host allocator a plan names
(catalog/data/allocators.toml): glibc's variables, or the library LD_PRELOAD loads instead."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwise.catalog.allocators import allocator_choice

# Where Debian, Ubuntu, Fedora and source installs put shared libraries.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64", "/usr/lib", "/usr/local/lib")


def find_library(name: str) -> str | None:
    """The path of the shared library `name` (e.g. libjemalloc.so.2), or None."""
    for folder in LIBRARY_DIRS:
        path = Path(folder) / name
        if path.exists():
            return str(path)
    return None


def allocator_env(name: str) -> dict[str, str]:
    """Variables to set in the measured process for allocator `name`; RuntimeError when the
    library it preloads is not installed."""
    choice = allocator_choice(name)
    env = choice.env_vars
    if choice.preload:
        path = find_library(choice.preload)
        if path is None:
            raise RuntimeError(f"--allocator {name} preloads {choice.preload}, which is not in "
                               f"{', '.join(LIBRARY_DIRS)}: install it (Debian: apt-get install "
                               f"{'libjemalloc2' if 'jemalloc' in name else 'libtcmalloc-minimal4'})")
        env["LD_PRELOAD"] = os.pathsep.join(p for p in (path, os.environ.get("LD_PRELOAD")) if p)
    return env
