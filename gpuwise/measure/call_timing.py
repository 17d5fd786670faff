"""The median time of one call, the way every probe times a kernel or a runtime step."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_call_s(fn: Callable[[], object], repeats: int,
                  after: Callable[[], object] | None = None) -> float:
    """Median seconds of one call of `fn` over `repeats` calls, after one warm-up call;
    `after` runs inside each timing (a device synchronisation)."""
    fn()
    if after is not None:
        after()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if after is not None:
            after()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
