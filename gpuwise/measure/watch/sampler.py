"""A background thread that reads the sensors every `interval_s` and logs each reading."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from gpuwise.measure.watch.inject._gpuwise_watch_recorder import JsonlLog
from gpuwise.measure.watch.sensors import CpuSensor, GpuSensor, RaplSensor

LOG_FORMAT = "gpuwise-watch/1"


class Sampler:
    """Samples the process `pid` (and its children) and the machine until `stop()`."""

    def __init__(self, log: JsonlLog, pid: int, interval_s: float = 0.2) -> None:
        self.log = log
        self.interval_s = interval_s
        self.latest: dict[str, Any] | None = None
        self.cpu = CpuSensor(pid)
        self.gpu = GpuSensor()
        self.rapl = RaplSensor()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuwise-watch", daemon=True)

    def unavailable(self) -> dict[str, str]:
        """Each missing reading and why (no GPU, no permission, not on this OS)."""
        return {**self.cpu.unavailable, **self.gpu.unavailable, **self.rapl.unavailable}

    def header(self, cmd: list[str], inject: bool, source: str) -> dict[str, Any]:
        return {"kind": "header", "format": LOG_FORMAT, "cmd": cmd, "t": time.time(),
                "host": socket.gethostname(), "interval_s": self.interval_s,
                "gpus": self.gpu.names, "inject": inject, "source": source,
                "unavailable": self.unavailable()}

    def start(self) -> None:
        self._write(self.read())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._write(self.read())  # the last reading closes the energy intervals

    def read(self) -> dict[str, Any]:
        """One reading of every sensor; a sensor that fails leaves its fields None."""
        sample: dict[str, Any] = {"kind": "sample", "t": time.time()}
        for name, read in (("cpu", self.cpu.read), ("gpus", self.gpu.read),
                           ("cpu_energy_j", self.rapl.read)):
            try:
                value = read()
            except Exception as exc:  # never let a sensor stop the job or the sampler
                self.cpu.unavailable[name] = repr(exc)
                continue
            if isinstance(value, dict):
                sample.update(value)
            else:
                sample[name] = value
        return sample

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write(self.read())

    def _write(self, sample: dict[str, Any]) -> None:
        self.latest = sample
        with contextlib.suppress(OSError):  # a full disk must not stop the job
            self.log.write(sample)
