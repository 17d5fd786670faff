"""The child process's resident memory on Linux: the resident set now, the kernel's high-water
mark (`VmHWM`) and its reset, and a sampling thread where the reset is not possible."""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


def hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    if match is None:
        raise OSError("no VmHWM in /proc/self/status")
    return int(match.group(1)) * 1024


def reset_hwm() -> bool:
    """Reset the kernel's resident high-water mark to the current resident set."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        hwm_bytes()
    except OSError:
        return False
    return True


class RssSampler:
    """Fallback peak reader: the largest resident set seen, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> RssSampler:
        self._old_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._old_interval)
        self.peak = max(self.peak, rss_bytes())


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_stats() -> dict[str, int]:
    """glibc's own account (mallinfo2(3), glibc >= 2.33): bytes its arenas took from the system
    (`heap_bytes`), of them free (`heap_free_bytes`) and at the top (`heap_top_bytes`), and
    bytes in chunks mapped on their own (`mapped_bytes`). Empty where glibc has no mallinfo2."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = _MallInfo2
    m = mallinfo2()
    return {"heap_bytes": m.arena, "heap_free_bytes": m.fordblks, "heap_top_bytes": m.keepcost,
            "mapped_bytes": m.hblkhd}
