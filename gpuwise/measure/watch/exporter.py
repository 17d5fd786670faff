"""Serve a watched job's metrics for Prometheus to scrape (`gpuwise watch --prometheus`,
`gpuwise.watch(prometheus=...)`), through prometheus-client (the `[prometheus]` extra).

The server binds first, before the job starts (a port in use is one error, nothing else
touched), then `attach`es to the job's log. Nothing runs between scrapes: each scrape (at
most one computation per `refresh_s`; concurrent scrapes share it) reads the records the log
gained since the last one and serves `gpuwise.estimate.watch.metrics`'s families, the same
summary and verdict as the report, over a recent window. The registry is the server's own,
never prometheus-client's global one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.metric_families import Family
from gpuwise.estimate.watch.metrics import LiveWindow
from gpuwise.measure.watch.log import LogTail

# The environment variable that tells a watched program the `gpuwise watch` above it serves
# every rank's metrics (gpuwise.watch(prometheus=...) inside then serves none).
SERVED_ENV = "GPUWISE_WATCH_PROMETHEUS"
DEFAULT_HOST = "0.0.0.0"  # every interface, as exporters listen: Prometheus scrapes from afar
LISTEN_HINT = "give PORT or HOST:PORT, e.g. 9400, 127.0.0.1:9400 or [::1]:9400 (0: a free port)"
INSTALL_HINT = "pip install 'gpuwise[prometheus]' (prometheus-client)"
REFRESH_S = 1.0
READ_CHUNK = 8 << 20  # log bytes parsed at a time: a scrape after a long gap stays in bounds


def parse_listen(spec: str | int, what: str = "--prometheus") -> tuple[str, int]:
    """(host, port) from `PORT`, `:PORT`, `HOST:PORT` or `[IPV6]:PORT`; the host defaults
    to every interface. Anything else is one GpuwiseError."""
    text = str(spec).strip()
    host, port = "", text
    if text.startswith("["):
        inside, close, rest = text[1:].partition("]")
        if not close or not rest.startswith(":") or not inside:
            raise GpuwiseError(f"{what} {text!r} is not [HOST:]PORT", LISTEN_HINT)
        host, port = inside, rest[1:]
    elif ":" in text:
        host, _, port = text.rpartition(":")
        if ":" in host:
            raise GpuwiseError(f"{what} {text!r} is not [HOST:]PORT (an IPv6 address goes in "
                               "brackets)", LISTEN_HINT)
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise GpuwiseError(f"{what} {text!r} is not [HOST:]PORT: the port is a number from 0 "
                           "to 65535", LISTEN_HINT)
    if host and (any(c.isspace() for c in host) or "/" in host):
        raise GpuwiseError(f"{what} {text!r} is not [HOST:]PORT: {host!r} is not a host",
                           LISTEN_HINT)
    return host or DEFAULT_HOST, int(port)


def default_job_name(cmd: list[str]) -> str:
    """The `job` label when none is given: Slurm's job name, else the script's name (`train`
    for `torchrun ... train.py`, the module for `python -m pkg.mod`), else the program's."""
    if os.environ.get("SLURM_JOB_NAME"):
        return os.environ["SLURM_JOB_NAME"]
    for i, arg in enumerate(cmd):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(cmd):
            return cmd[i + 1]
    return Path(cmd[0]).name if cmd else "gpuwise-watch"


class _Source:
    """The job's log and its LiveWindow; computes the families at most once per refresh_s."""

    def __init__(self, log_path: Path, window: LiveWindow, job: str, refresh_s: float) -> None:
        self.tail = LogTail(log_path)
        self.window = window
        self.job = job
        self.host = socket.gethostname()
        self.refresh_s = refresh_s
        self.version = _version()
        self.host_memory = _host_memory()
        self.cpu_s = 0.0
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._families: list[Family] = []
        self._failed = False  # said once on stderr

    def families(self) -> list[Family]:
        with self._lock:  # concurrent scrapes wait for one computation and share it
            if time.monotonic() - self._at >= self.refresh_s:
                start = time.thread_time()
                try:
                    while records := self.tail.read_new(READ_CHUNK):
                        self.window.feed(records)
                    so_far = self.cpu_s + time.thread_time() - start
                    self._families = self.window.families(self.job, self.host, self.host_memory,
                                                          self.version, so_far)
                except Exception as exc:  # never the job's problem: the last metrics stay
                    if not self._failed:
                        self._failed = True
                        with contextlib.suppress(OSError, ValueError):
                            sys.stderr.write(f"gpuwise watch: metrics not updated ({exc!r})\n")
                self.cpu_s += time.thread_time() - start
                self._at = time.monotonic()
            return self._families


class _Collector:
    """prometheus-client's custom collector protocol: `collect()` yields metric families."""

    def __init__(self) -> None:
        self.source: _Source | None = None

    def collect(self) -> Iterator[Any]:
        source = self.source
        if source is None:
            return
        from prometheus_client.metrics_core import Metric

        for family in source.families():
            if not family.samples:
                continue
            spec = family.spec
            name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            metric = Metric(name, spec.help, spec.kind)
            for sample_name, labels, value in family.samples:
                metric.add_sample(sample_name, labels, value)
            yield metric


class MetricsServer:
    """An HTTP server for Prometheus on HOST:PORT, bound at once; `attach` gives it a log."""

    def __init__(self, host: str, port: int, what: str = "--prometheus") -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise GpuwiseError(f"{what} needs prometheus-client, which is not installed",
                               INSTALL_HINT) from None
        self.collector = _Collector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)  # type: ignore[arg-type]
        self._server = _bind(host, port, make_wsgi_app(self.registry), what)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={
            "poll_interval": 0.1}, name="gpuwise-watch-prometheus", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def attach(self, log_path: str | os.PathLike[str], job: str, rank: int | None = None,
               refresh_s: float = REFRESH_S, window: LiveWindow | None = None) -> None:
        """Serve the metrics of the log at `log_path` (only `rank`'s steps, if given)."""
        self.collector.source = _Source(Path(log_path), window or LiveWindow(rank=rank), job,
                                        refresh_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
            self._server.server_close()


def serve(spec: str | int, what: str = "--prometheus") -> MetricsServer:
    """Parse `[HOST:]PORT` and bind the server there (GpuwiseError if it cannot)."""
    host, port = parse_listen(spec, what)
    return MetricsServer(host, port, what)


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: the job's stderr is the user's."""


def _bind(host: str, port: int, app: Any, what: str) -> WSGIServer:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise GpuwiseError(f"{what}: cannot listen on {host}:{port}: {reason}",
                           LISTEN_HINT) from None

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True

        def server_bind(self) -> None:  # HTTPServer's, without its reverse DNS lookup
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = host, int(self.server_address[1])
            self.setup_environ()

    if port > 65535:  # PORT + LOCAL_RANK
        raise GpuwiseError(f"{what}: port {port} is past 65535", LISTEN_HINT)
    try:
        return make_server(host, port, app, Server, handler_class=_Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise GpuwiseError(f"{what}: port {port} is in use on {host}",
                               f"choose another port, or 0 for a free one; {LISTEN_HINT}") from None
        raise GpuwiseError(f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}",
                           LISTEN_HINT) from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuwise")
    except PackageNotFoundError:
        return "0+unknown"


def _host_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        return None
