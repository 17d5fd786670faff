"""Per-step timing records, written as JSON lines. Standard library only.

This file is loaded two ways: by the `sitecustomize` next to it, inside a watched program
(where gpuwise itself may not be importable), and by `gpuwise.watch()` in-process. Both use
the instance registered in ``sys.modules[MODULE_NAME]``, so a process has one recorder.

A step is the time from the end of the previous step to the end of this one, so steps tile
the loop. It ends at the next DataLoader fetch after an optimizer step (so gradient
accumulation and several optimizers count as one step), at `w.step()` when the API marks
steps, or at the optimizer step itself when the program uses no DataLoader.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

MODULE_NAME = "_gpuwise_watch_recorder"
LOG_ENV = "GPUWISE_WATCH_LOG"
PHASES = ("data", "h2d", "forward", "backward", "optimizer")
# Steps whose operators are counted (a Python dispatch mode slows them: they are not timed).
COUNT_STEPS = (3, 10, 30)
# A counted step also times this many tiny operators (a 1-element CPU tensor times a Python
# number, as loops write them: 3 rounds, outside the count): this host's own cost of one
# operator, which the host-bound threshold scales with (a slow host dispatches slowly; about
# 5 ms a counted step).
DISPATCH_PROBE_OPS = 200
# A step's line is written at once when the last write is this old; faster steps are
# grouped into one write (a syscall costs ~20-30 us, a lot for a 1 ms step). A job killed
# with SIGKILL (or SIGTERM without a handler) loses at most this much of its steps.
FLUSH_S = 0.02
# RSS is read every step for the first steps, then at most this often (a read is ~2-20 us).
RSS_EVERY_STEP_UNTIL = 64
RSS_EVERY_S = 0.01
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# One encoder: json.dumps with non-default options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


class JsonlLog:
    """Append-only JSON lines. One `os.write` per record on an O_APPEND file: each line
    reaches the kernel at once (it survives the process being killed), and lines from
    several processes writing the same file do not interleave."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        self.write_lines(_encode(record) + "\n")

    def write_lines(self, text: str) -> None:
        """Complete lines, in one write (so they land together, uninterleaved)."""
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, text.encode())

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def rank_and_world() -> tuple[int, int]:
    """This process's rank under torchrun (RANK / WORLD_SIZE), or (0, 1)."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


_statm: list[int] = [-1, -1]  # [pid that opened it, fd]: reopened after a fork


def own_rss_bytes() -> int | None:
    """Resident memory of this process from /proc (a pread on an open file: ~2 us)."""
    try:
        if _statm[0] != os.getpid():
            _statm[:] = [os.getpid(), os.open("/proc/self/statm", os.O_RDONLY)]
        return int(os.pread(_statm[1], 64, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (tuple, list or dict)."""
    for _ in range(4):  # nested containers, a few levels deep
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, list | tuple):
            batch = batch[0] if batch else None
        else:
            break
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else None


class StepRecorder:
    """Accumulates phase times for the open step and writes one record when it ends."""

    def __init__(self, log: JsonlLog, source: str, sync: bool | None = None) -> None:
        self.log = log
        self.source = source
        self.rank, self.world = rank_and_world()
        self.hooks_enabled = True  # the injected hooks defer to an explicit gpuwise.watch()
        self.sync_enabled = sync
        self.explicit_steps = False
        self.loader_seen = False
        self._index = 0
        self._start: float | None = None
        self._start_unix = 0.0
        self._times = dict.fromkeys(PHASES, 0.0)
        self._samples: int | None = None
        self._optimizer_done = False
        self._counter: Any = None
        self._dispatch_us: float | None = None
        self._data_ops = 0
        self._pending: list[str] = []
        self._last_flush = 0.0
        self._last_rss = 0.0

    # -- events ---------------------------------------------------------------------------
    def on_data(self, t0: float, seconds: float, batch: Any, data_ops: int = 0) -> None:
        """A batch arrived after `seconds` of waiting that began at perf_counter `t0`;
        `data_ops` operators were counted while it was made (they are not the step's work)."""
        self.loader_seen = True
        self._data_ops += data_ops
        if self._start is not None and self._optimizer_done and not self.explicit_steps:
            self.end_step(t0)
        self._begin(t0)
        self._times["data"] += seconds
        n = batch_size(batch)
        if n is not None:
            self._samples = (self._samples or 0) + n

    def on_phase(self, phase: str, t0: float, seconds: float) -> None:
        """Time spent in a phase; a copy outside any step goes to the next step."""
        if phase != "h2d":
            self._begin(t0)
        self._times[phase] += seconds

    def on_optimizer_done(self) -> None:
        self._optimizer_done = True
        if not self.loader_seen and not self.explicit_steps:
            self.end_step(time.perf_counter())

    def on_loader_exhausted(self) -> None:
        if self._optimizer_done and not self.explicit_steps:
            self.end_step(time.perf_counter())
        self.flush()

    def mark_step(self, samples: int | None = None) -> None:
        """An explicit step boundary (`w.step()`): from now on only these end steps. With
        no step open (nothing timed yet), it starts the first one."""
        self.explicit_steps = True
        now = time.perf_counter()
        if self._start is None:
            self._begin(now)
            return
        if samples is not None:
            self._samples = samples
        self.end_step(now)

    def close(self) -> None:
        """At exit: write the open step if an optimizer step happened in it."""
        if self._optimizer_done:
            self.end_step(time.perf_counter())
        self._stop_counting()
        self.flush()

    def flush(self) -> None:
        """Write the step lines not written yet."""
        lines, self._pending = self._pending, []
        self._last_flush = time.perf_counter()
        if lines:
            self.log.write_lines("".join(lines))

    # -- steps ----------------------------------------------------------------------------
    def _begin(self, t0: float) -> None:
        if self._start is None:
            self._start = t0
            self._start_unix = time.time() - (time.perf_counter() - t0)
            if self._index in COUNT_STEPS:
                self._start_counting()

    def end_step(self, t_end: float) -> None:
        if self._start is None:
            return
        ops = self._stop_counting()
        record: dict[str, Any] = {
            "kind": "step", "rank": self.rank, "world": self.world, "pid": os.getpid(),
            "source": self.source, "step": self._index, "t_start": self._start_unix,
            "step_s": max(t_end - self._start, 0.0), "samples": self._samples,
            "ops": ops, "counted": ops is not None, "rss_bytes": self._rss(t_end),
            "dispatch_us": self._dispatch_us if ops is not None else None,
            "device_mem_bytes": device_memory_bytes(),
        }
        for phase, seconds in self._times.items():
            record[f"{phase}_s"] = seconds
        self._pending.append(_encode(record) + "\n")
        if t_end - self._last_flush >= FLUSH_S:
            self.flush()
        self._index += 1
        self._start, self._samples, self._optimizer_done = None, None, False
        self._times = dict.fromkeys(PHASES, 0.0)
        self._begin(t_end)

    def _rss(self, now: float) -> int | None:
        if self._index >= RSS_EVERY_STEP_UNTIL and now - self._last_rss < RSS_EVERY_S:
            return None
        self._last_rss = now
        return own_rss_bytes()

    def sync(self) -> None:
        """Wait for queued CUDA work so it is timed in the phase that queued it."""
        if self.sync_enabled is False:
            return
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # -- operator counts (host-bound evidence) -----------------------------------------------
    def _start_counting(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not self.hooks_enabled and self.source == "inject":
            return
        if compiled_graphs(torch):  # a dispatch mode would make torch.compile recompile
            return
        self._dispatch_us = dispatch_cost_us(torch)
        try:
            self._counter = _op_counter(torch)
            self._counter.__enter__()
        except Exception:
            self._counter = None

    def ops_so_far(self) -> int:
        """Operators counted in the open step so far (0 when this step is not counted)."""
        return int(self._counter.count) if self._counter is not None else 0

    def _stop_counting(self) -> int | None:
        counter, self._counter = self._counter, None
        excluded, self._data_ops = self._data_ops, 0
        if counter is None:
            return None
        try:
            counter.__exit__(None, None, None)
        except Exception:
            return None
        return max(int(counter.count) - excluded, 0)


def device_memory_bytes() -> int | None:
    """CUDA memory allocated by tensors in this process (no synchronisation), or None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        return int(torch.cuda.memory_allocated())
    except Exception:
        return None


def compiled_graphs(torch: Any) -> bool:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["stats"]["unique_graphs"])
    except Exception:
        return True


def dispatch_cost_us(torch: Any) -> float | None:
    """Microseconds per tiny eager operator on this host: the best of 3 rounds of
    DISPATCH_PROBE_OPS products of a 1-element CPU tensor and a Python number (the Python
    call, the number wrapped as a tensor, the dispatcher, a 1-element kernel)."""
    try:
        a = torch.ones(1)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(DISPATCH_PROBE_OPS):
                a * 1.0001  # noqa: B018 (timed for its cost)
            best = min(best, time.perf_counter() - t0)
        return 1e6 * best / DISPATCH_PROBE_OPS
    except Exception:
        return None


def _op_counter(torch: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        """Counts every operator the dispatcher runs, forward and backward; changes nothing."""

        count = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            self.count += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


def shared_recorder() -> Any:
    """The recorder module this process uses (the injected one when there is one)."""
    return sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])


# The recorder of this process's watched loop, when one is open (set by sitecustomize or
# by gpuwise.watch()).
active: StepRecorder | None = None
