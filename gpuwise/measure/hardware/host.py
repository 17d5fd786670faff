"""This machine's CPU model, core counts and RAM. Each reading falls back to what the OS
offers without psutil, and none raises."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

UNKNOWN_CPU = "unknown CPU"


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 9654 96-Core Processor"), or "unknown CPU"."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                text=True,
                capture_output=True,
                timeout=2,
                check=False,
            ).stdout.strip()
            if out:
                return out
        except Exception:
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    try:
        return platform.processor() or UNKNOWN_CPU
    except Exception:
        return UNKNOWN_CPU


def core_counts() -> tuple[int | None, int]:
    """(physical cores or None, logical cores)."""
    try:
        import psutil

        physical: int | None = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True)
    except Exception:
        physical, logical = None, None
    return physical, logical or os.cpu_count() or 1


def ram_bytes() -> tuple[int, int]:
    """(total, available) bytes of RAM; (0, 0) if neither psutil nor sysconf can tell."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.total), int(mem.available)
    except Exception:
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0
