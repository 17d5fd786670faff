"""`with gpuwise.watch() as w:`: time a training loop from inside, per step and phase.

    with gpuwise.watch() as w:
        for x, y in w.loader(train_loader):       # times the wait for each batch
            with w.phase("h2d"):
                x, y = x.to(device), y.to(device)
            with w.phase("forward"):
                loss = loss_fn(model(x), y)
            with w.phase("backward"):
                loss.backward()
            with w.phase("optimizer"):
                opt.step(); opt.zero_grad()
    print(w.verdict().findings[0].title)         # or: gpuwise watch --report <w.log_path>

Each fetch from `w.loader` ends the previous step, unless the loop marks steps itself with
`w.step()`. On a GPU every phase boundary synchronises, so asynchronous kernels are timed in
the phase that launched them. `auto=True` instead times DataLoader waits, copies, backward
and optimizer steps with the same hooks `gpuwise watch` injects, with no phases to write.

Under `gpuwise watch -- ...` the steps go to that command's log and it does the sampling;
alone, this samples the process itself and writes its own log (one per rank under torchrun).

`prometheus="[HOST:]PORT"` serves the loop's metrics for Prometheus while the block runs
(gpuwise.measure.watch.exporter; each torchrun process on PORT + LOCAL_RANK), unless a
`gpuwise watch --prometheus` above the process serves every rank's already.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.summary import summarize
from gpuwise.estimate.watch.verdict import verdict
from gpuwise.files import own_output
from gpuwise.measure.watch.exporter import (
    SERVED_ENV,
    MetricsServer,
    default_job_name,
    parse_listen,
)
from gpuwise.measure.watch.inject import _gpuwise_watch_hooks as hooks
from gpuwise.measure.watch.inject import _gpuwise_watch_recorder as _own_recorder
from gpuwise.measure.watch.log import WHAT, is_watch_log, read_log
from gpuwise.measure.watch.sampler import Sampler

PHASE_NAMES = ("data", "h2d", "forward", "backward", "optimizer")


def recorder_module() -> Any:
    """The process's recorder module: the injected one under `gpuwise watch`, else ours."""
    return _own_recorder.shared_recorder()


class watch:  # noqa: N801  (used as `gpuwise.watch()`, like a function)
    """Watch a training loop in this process; see the module docstring."""

    def __init__(self, log: str | Path | None = None, *, interval_s: float = 0.2,
                 sync: bool | None = None, auto: bool = False, sample: bool = True,
                 prometheus: str | int | None = None, job_name: str | None = None) -> None:
        self.interval_s = interval_s
        self.sync = sync
        self.auto = auto
        self.sample = sample
        self.prometheus = prometheus
        self.job_name = job_name
        self.metrics_url: str | None = None  # where this process serves its metrics, if it does
        self._server: Any = None
        self.under_cli = bool(os.environ.get(_own_recorder.LOG_ENV))
        self.log_path = (
            Path(os.environ[_own_recorder.LOG_ENV]) if self.under_cli else _own_path(log)
        )
        self._rec: Any = None
        self._log: Any = None
        self._sampler: Any = None
        self._muted: Any = None
        self._uninstall: Any = None

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> watch:
        self._server = self._bind_exporter()  # first: a port in use stops here, untouched
        try:
            return self._open()
        except BaseException:
            self._close_exporter()
            raise

    def _open(self) -> watch:
        mod = recorder_module()
        injected = mod.active
        if self.auto and injected is not None:
            self._rec = injected  # `gpuwise watch` already hooked this process
            self._attach_exporter()
            return self
        if not self.under_cli:  # a new file, or an old log of gpuwise's: never another file
            own_output(self.log_path, is_watch_log, WHAT, "pass another path as log=")
            self.log_path.write_bytes(b"")
        self._attach_exporter()
        self._log = mod.JsonlLog(str(self.log_path))
        self._rec = mod.StepRecorder(self._log, source="api", sync=self.sync)
        if self.auto:
            if mod.active is not None:
                raise GpuwiseError("a gpuwise.watch(auto=True) is already open in this process",
                                   "open one at a time")
            self._uninstall = _install_hooks(self._rec)
            mod.active = self._rec
        elif injected is not None:  # explicit phases: the injected hooks would count twice
            injected.hooks_enabled, self._muted = False, injected
        if not self.under_cli and self.sample:
            self._start_sampler()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_exporter()
        if self._rec is None:
            return
        self._rec.close()
        if self._uninstall is not None:
            self._uninstall()
            recorder_module().active = None
        if self._muted is not None:
            self._muted.hooks_enabled = True
        if self._sampler is not None:
            self._sampler.stop()
            self._log.write({"kind": "end", "t": time.time(), "exit_code": None})
        if self._log is not None:
            self._log.close()

    # -- marking the loop -------------------------------------------------------------------
    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield the batches of `iterable`, timing how long each one took to arrive."""
        rec = self._recorder()
        iterator = iter(iterable)
        while True:
            t0, ops = time.perf_counter(), rec.ops_so_far()
            try:
                batch = next(iterator)
            except StopIteration:
                rec.on_loader_exhausted()
                return
            rec.on_data(t0, time.perf_counter() - t0, batch, rec.ops_so_far() - ops)
            if not rec.explicit_steps:
                rec.on_optimizer_done()  # the next fetch ends this step
            yield batch

    def step(self, samples: int | None = None) -> None:
        """End the current step here (`samples`: how many samples it processed)."""
        self._recorder().mark_step(samples)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase: data, h2d, forward, backward or optimizer."""
        if name not in PHASE_NAMES:
            raise GpuwiseError(f"unknown phase {name!r}", f"use one of {', '.join(PHASE_NAMES)}")
        rec = self._recorder()
        rec.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            rec.sync()
            rec.on_phase(name, t0, time.perf_counter() - t0)

    # -- results ------------------------------------------------------------------------------
    def summary(self) -> Any:
        """The WatchSummary of the log so far (gpuwise.estimate.watch.summary)."""
        if self._rec is not None:
            self._rec.flush()
        return summarize(read_log([self.log_path], allow_empty=True))

    def verdict(self) -> Any:
        """The Verdict of the log so far (gpuwise.estimate.watch.verdict)."""
        return verdict(self.summary())

    def _recorder(self) -> Any:
        if self._rec is None:
            raise GpuwiseError(
                "gpuwise.watch() is not open", "use it as `with gpuwise.watch() as w:`"
            )
        return self._rec

    def _bind_exporter(self) -> Any:
        """The metrics server of `prometheus=`, bound: none when not asked, or when the
        `gpuwise watch` above this process serves every rank's metrics already. Under
        torchrun each process listens on PORT + LOCAL_RANK (a port 0 picks a free one)."""
        if self.prometheus is None or (self.under_cli and os.environ.get(SERVED_ENV)):
            return None
        host, port = parse_listen(self.prometheus, "prometheus=")
        local_rank = os.environ.get("LOCAL_RANK", "0")
        if port and local_rank.isdigit():
            port += int(local_rank)
        server = MetricsServer(host, port, "prometheus=")
        self.metrics_url = server.url
        return server

    def _attach_exporter(self) -> None:
        if self._server is None:
            return
        rank = _own_recorder.rank_and_world()[0] if self.under_cli else None
        self._server.attach(self.log_path, self.job_name or default_job_name(sys.argv), rank)

    def _close_exporter(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _start_sampler(self) -> None:
        try:
            self._sampler = Sampler(self._log, os.getpid(), self.interval_s)
            self._log.write(self._sampler.header(sys.argv, self.auto, source="gpuwise.watch()"))
            self._sampler.start()
        except Exception as exc:  # sensors failing must not stop training
            self._log.write({"kind": "note", "text": f"sampler did not start: {exc!r}"})


def _own_path(log: str | Path | None) -> Path:
    """The log path; under torchrun without `gpuwise watch`, one file per rank."""
    path = Path(log) if log else Path(f"gpuwise-watch-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    rank, world = _own_recorder.rank_and_world()
    if world > 1:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.jsonl'}")
    return path


def _install_hooks(rec: Any) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise GpuwiseError("gpuwise.watch(auto=True) needs torch", "pip install torch") from exc
    return hooks.install(torch, rec)
