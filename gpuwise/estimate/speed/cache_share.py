"""How much of a stream a CPU's last-level cache serves: all of it up to the size the probe
found it holds (`full`), none from the size where reads ran at memory's rate (`none`), and a
share linear in log(size) between (measure/llama_cpp/cache_sweep.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheSpan:
    full: float  # bytes a stream may read again and again and stay in the cache
    none: float  # bytes from which it runs from memory

    def share(self, read_bytes: float) -> float:
        """The share of `read_bytes`, read again and again, served from the cache."""
        if not self.full or read_bytes <= self.full:
            return 1.0 if self.full else 0.0
        if read_bytes >= self.none:
            return 0.0
        return math.log(self.none / read_bytes) / math.log(self.none / self.full)
