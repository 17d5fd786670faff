"""Run a study's replicas as Ray tasks, spread over a cluster (`gpuwise repro --ray`).

Each planned run is one Ray task that asks for the CPUs and GPUs one replica needs and runs
the user's command exactly as the local runner does (runner.run_one: a fresh process, the
same environment but for the devices Ray gives it), on whichever node Ray places it. The
driver (this process) writes each record to the same results file, through the same
StudyLog, as soon as its task finishes (ray.wait), so an interrupted study keeps what
finished and resumes with Ray or without it.

Failures: a replica whose command fails is retried once (retry_exceptions); one whose worker
or node dies is retried once by Ray itself (max_retries covers both, so two attempts in all);
after that it is recorded as failed, with the error, never dropped.

Connecting cannot hang: a Ray driver that cannot reach the cluster's GCS retries for a
minute, and with shorter timeouts it aborts the whole process, so the address is first
tried in a child process, killed after CONNECT_TIMEOUT_S, which also reports the nodes'
resources; a replica that no node can hold is refused before anything runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.repro.collect import parse_metric_patterns
from gpuwise.measure.repro.plan import RunSpec
from gpuwise.measure.repro.runner import Progress, Study, StudyLog, run_one

# Seconds to reach a cluster: a child process imports Ray (under a second here) and connects.
CONNECT_TIMEOUT_S = 8.0
RETRIES = 1  # a failed or lost replica runs once more, then is recorded as failed
WAIT_S = 1.0  # the driver wakes at least this often (Ctrl-C stays prompt)
INSTALL_HINT = "pip install 'gpuwise[ray]' (on the driver and on every node)"
ADDRESS_HINT = ("check the address (the head's host:port, 6379 by default; `ray status` on "
                "the head prints it) and that this machine can reach it")
RESOURCES_HINT = "ask for less with --ray-cpus / --ray-gpus, or add a node that has them"
NODE_HINT = ("run gpuwise on the head node (ssh, `ray job submit`, a KubeRay RayJob or a Slurm "
             "batch script: docs/repro.md)")
AUTH_HINT = ("set RAY_AUTH_MODE=token and give this machine the cluster's token (RAY_AUTH_TOKEN, "
             "or ~/.ray/auth_token), as its nodes have")
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b.*:")

# A child process connects and prints the alive nodes: a driver that cannot connect retries
# for a minute or aborts, neither of which the CLI may do.
_PROBE = """
import json, logging, sys
import ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False,
         include_dashboard=False)
nodes = [{"id": n["NodeID"], "host": n.get("NodeManagerHostname"), "resources": n["Resources"]}
         for n in ray.nodes() if n.get("Alive")]
print("GPUWISE_NODES " + json.dumps(nodes), flush=True)
"""


@dataclass(frozen=True)
class RaySettings:
    """Where and how replicas run on Ray.

    address: the cluster's (host:port of its head's GCS, or 'auto'); None: what ray.init()
    finds by itself (RAY_ADDRESS, else a cluster started on this machine, else a new local
    one). cpus, gpus: what each replica asks for; gpus None: 1 on a cluster with GPUs, else 0.
    """

    address: str | None = None
    cpus: float = 1.0
    gpus: float | None = None


class ReplicaFailed(Exception):
    """A replica's command failed; carries its record (the retry's, if it was retried)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(f"{record['condition']} #{record['index']}: exit {record['returncode']}")
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:  # the record crosses processes with it
        return (ReplicaFailed, (self.record,))


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def fits(resources: dict[str, float], cpus: float, gpus: float) -> bool:
    return resources.get("CPU", 0.0) >= cpus and resources.get("GPU", 0.0) >= gpus


def _amount(n: float, what: str) -> str:
    return f"{n:g} {what}" + ("" if n == 1 else "s")


def check_fits(nodes: list[dict[str, Any]], cpus: float, gpus: float, where: str) -> None:
    """Refuse a replica that no alive node can hold (it would wait for ever)."""
    if any(fits(n["resources"], cpus, gpus) for n in nodes):
        return
    most_gpus = max((n["resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    most_cpus = max((n["resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    asks = _amount(cpus, "CPU") + (f" and {_amount(gpus, 'GPU')}" if gpus else "")
    raise GpuwiseError(
        f"no node of the Ray cluster {where} has the {asks} a replica asks for (the most on "
        f"one node: {_amount(most_cpus, 'CPU')}, {_amount(most_gpus, 'GPU')}; "
        f"{len(nodes)} node{'s' if len(nodes) != 1 else ''})", RESOURCES_HINT)


def host_port(address: str) -> tuple[str, int] | None:
    """('10.0.0.5', 6379) from '10.0.0.5:6379', 'ray://h:10001' or '[::1]:6379'; None for
    what names no port ('auto')."""
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _reachable(address: str, timeout_s: float) -> None:
    """Fail at once where nothing listens (refused, no route), in `timeout_s` where nothing
    answers; a listening port may still not be Ray's (probe then tells)."""
    where = host_port(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except TimeoutError:
        raise GpuwiseError(f"cannot reach a Ray cluster at {address}: no answer in "
                           f"{timeout_s:g} s", ADDRESS_HINT) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise GpuwiseError(f"cannot reach a Ray cluster at {address}: {reason}",
                           ADDRESS_HINT) from None


def probe(address: str, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """The alive nodes of the cluster at `address` ({id, host, resources} each), asked by a
    child process within `timeout_s` (CONNECT_TIMEOUT_S); a cluster that cannot be reached
    or does not answer as a Ray cluster is a GpuwiseError."""
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    _reachable(address, timeout_s)
    if not address.startswith("ray://") and host_port(address) and not local_raylet():
        raise GpuwiseError(f"cannot reach a Ray cluster at {address} from here: no Ray node "
                           "runs on this machine, and a Ray driver runs on a node of its "
                           "cluster", NODE_HINT)
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True,
                             text=True, timeout=timeout_s, env=os.environ | {
                                 "RAY_USAGE_STATS_ENABLED": "0"})
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        auth_refused(address, err or "")
        raise GpuwiseError(f"cannot reach a Ray cluster at {address}: no answer in "
                           f"{timeout_s:g} s", ADDRESS_HINT) from None
    for line in out.stdout.splitlines():
        if line.startswith("GPUWISE_NODES "):
            nodes: list[dict[str, Any]] = json.loads(line.split(" ", 1)[1])
            return nodes
    auth_refused(address, out.stderr)
    errors = [ln.strip() for ln in out.stderr.splitlines() if _ERROR_LINE.match(ln.strip())]
    reason = errors[-1][:200] if errors else f"exit {out.returncode}"
    raise GpuwiseError(f"cannot reach a Ray cluster at {address}: {reason}", ADDRESS_HINT)


def auth_refused(address: str, stderr: str) -> None:
    """A cluster that wants a token this driver does not send: say so, not 'no answer'."""
    if "InvalidAuthToken" in stderr or "AuthenticationError" in stderr:
        raise GpuwiseError(f"the Ray cluster at {address} wants an authentication token this "
                           "machine does not send", AUTH_HINT)


def local_raylet() -> bool:
    """Whether a Ray node (its raylet) runs on this machine: a driver given a cluster's
    host:port attaches to one, and without one Ray waits a minute before it fails."""
    import psutil

    return any(proc.info.get("name") == "raylet" for proc in psutil.process_iter(["name"]))


class RayCluster:
    """This process connected to a Ray cluster as the study's driver; a context manager
    (leaving it disconnects, and stops a local Ray that ray.init() started)."""

    def __init__(self, settings: RaySettings) -> None:
        self.settings = settings
        self.nodes: list[dict[str, Any]] = []
        self.cpus = settings.cpus
        self.gpus = settings.gpus or 0.0
        self.address = settings.address or os.environ.get("RAY_ADDRESS") or None
        self._ray: Any = None

    @property
    def where(self) -> str:
        return f"at {self.address}" if self.address else "(the one ray.init() found or started)"

    def __enter__(self) -> RayCluster:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Reach the cluster, learn its nodes and check that one replica fits on one of them.
        Raises GpuwiseError (and leaves nothing connected) when any of it fails."""
        if not ray_installed():
            raise GpuwiseError("--ray needs Ray, which is not installed", INSTALL_HINT)
        address = self.address
        if address:
            check_fits(probe(address), self.settings.cpus, self.settings.gpus or 0.0, self.where)
        import ray

        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                     include_dashboard=False)
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError, RpcError ...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise GpuwiseError(f"cannot start or reach Ray {self.where}: {first}",
                               ADDRESS_HINT) from None
        self._ray = ray
        try:
            self.nodes = [{"id": n["NodeID"], "host": n.get("NodeManagerHostname"),
                           "resources": n["Resources"]} for n in ray.nodes() if n.get("Alive")]
            if self.settings.gpus is None:
                has_gpus = any(n["resources"].get("GPU", 0.0) >= 1 for n in self.nodes)
                self.gpus = 1.0 if has_gpus else 0.0
            check_fits(self.nodes, self.cpus, self.gpus, self.where)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def run(self, study: Study, progress: Progress | None = None,
            fresh: bool = False) -> list[dict[str, Any]]:
        """Run what the results file lacks as Ray tasks; return every run of the study."""
        ray = self._ray
        if ray is None:
            raise RuntimeError("RayCluster.run before connect")
        parse_metric_patterns(list(study.metric_specs))  # bad patterns: before any file
        log = StudyLog(study, fresh, progress)
        task = ray.remote(replica)
        options = {"num_cpus": self.cpus, "num_gpus": self.gpus, "max_retries": RETRIES,
                   "retry_exceptions": [ReplicaFailed], "scheduling_strategy": "SPREAD"}
        cwd = os.getcwd()
        pending = {task.options(name=f"gpuwise repro {s.condition} #{s.index}", **options)
                   .remote(study, s, cwd): s for s in log.todo}
        try:
            while pending:
                refs = list(pending)
                done, _ = ray.wait(refs, num_returns=1, timeout=WAIT_S)
                if done:  # and every other one finished by now, in one call
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in done:
                    log.add(self._outcome(ref, pending.pop(ref)))
        except BaseException:  # interrupted, or the study stopped: the finished runs are saved
            for ref in pending:  # a KeyboardInterrupt in each task: it kills its process
                with contextlib.suppress(Exception):  # finished already, or its node is gone
                    ray.cancel(ref)
            raise
        return log.records

    def _outcome(self, ref: Any, spec: RunSpec) -> dict[str, Any]:
        """The record of a finished task: its own, the last attempt's if its command failed,
        or a lost run's (returncode None, the error) if its worker or node died twice."""
        ray = self._ray
        try:
            record: dict[str, Any] = ray.get(ref)
            return record
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ReplicaFailed):
                return cause.record
            return lost_record(spec, f"{type(cause or exc).__name__}: {cause or exc}")
        except ray.exceptions.RayError as exc:
            return lost_record(spec, f"{type(exc).__name__}: {exc}")


def lost_record(spec: RunSpec, error: str) -> dict[str, Any]:
    """The record of a run that never finished (no return code): its error instead."""
    first = (error.strip().splitlines() or ["lost"])[0][:500]
    return {"condition": spec.condition, "index": spec.index, "seed": spec.seed,
            "threads": spec.threads, "deterministic": spec.deterministic, "device": None,
            "returncode": None, "wall_s": None, "energy_j": None, "energy_note": None,
            "metrics": {}, "params_hash": None, "steps": [], "deterministic_applied": None,
            "stderr_tail": error[-2000:], "error": first, "node": None, "node_id": None,
            "hardware": None, "omp_num_threads": None}


def replica(study: Study, spec: RunSpec, driver_cwd: str) -> dict[str, Any]:
    """One run, inside a Ray task on whichever node Ray chose: the local runner's run_one in
    the worker's environment (where Ray has set CUDA_VISIBLE_DEVICES to this task's GPUs),
    started in the driver's directory where this node has it. Raises ReplicaFailed (so that
    Ray retries it) when the command fails."""
    import ray

    patterns = parse_metric_patterns(list(study.metric_specs))
    live: set[subprocess.Popen[str]] = set()
    context = ray.get_runtime_context()
    cwd = driver_cwd if os.path.isdir(driver_cwd) else None
    try:
        record = run_one(study, spec, patterns, None, None, live, context.get_node_id(), cwd)
    except BaseException:  # cancelled (KeyboardInterrupt): the command must not outlive it
        for proc in list(live):
            proc.kill()
        raise
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    record["device"] = ",".join(gpu_ids) if gpu_ids else None
    if record["returncode"] != 0:
        raise ReplicaFailed(record)
    return record
