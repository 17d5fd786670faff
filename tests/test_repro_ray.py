"""`gpuwise repro --ray`: a real two-node Ray cluster on this machine (a head and a second node,
one CPU each, started with the `ray` CLI), a study spread over it, one node killed in the
middle, the records checked against a local run of the same study, then resumed without Ray;
and the bad inputs (no Ray, an unreachable address, a replica no node can hold): one line,
exit 2, the results file untouched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_cli

from gpuwise.cli.repro import optional_value
from gpuwise.errors import GpuwiseError

TINY = str(Path(__file__).with_name("repro_tiny.py"))
RAY_CLI = Path(sys.executable).with_name("ray")
HAS_RAY = RAY_CLI.exists() and shutil.which(str(RAY_CLI)) is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="needs Ray: pip install 'gpuwise[ray]'")
# The cluster notices a dead node after two missed health checks half a second apart (not
# Ray's 15 s); token authentication is off on both sides (`ray start` turns it on where
# ~/.ray/auth_token exists, which a local ray.init() writes; a driver, only when told to).
CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
               "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
               "RAY_health_check_failure_threshold": "2"}
STORE_BYTES = 80 * 1024 * 1024  # Ray's object store: its minimum is 75 MiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    address: str
    head: subprocess.Popen[bytes]
    node: subprocess.Popen[bytes]
    temp_dir: str


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    # --block keeps each node's processes under this `ray start`: killing its tree ends them.
    return subprocess.Popen([str(RAY_CLI), "start", "--block", "--num-cpus=1", "--num-gpus=0",
                             f"--object-store-memory={STORE_BYTES}", "--disable-usage-stats",
                             *args], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env=os.environ | CLUSTER_ENV, start_new_session=True)


def _alive_nodes(address: str) -> int:
    code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', "
            "log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))")
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                         timeout=30, env=os.environ | CLUSTER_ENV)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0


def _wait_for_raylet(proc: subprocess.Popen[bytes], deadline: float, log: Path) -> None:
    """Until the node `proc` started has its raylet (a driver before that waits seconds)."""
    import psutil

    while not any(p.name() == "raylet" for p in psutil.Process(proc.pid).children(recursive=True)):
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.2)
    time.sleep(0.5)  # and it has registered with the head


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a `ray start --block` and every process under it (raylet, workers, replicas),
    each by its pid."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(tree, timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not HAS_RAY:
        pytest.skip("needs Ray: pip install 'gpuwise[ray]'")
    logs = tmp_path_factory.mktemp("ray-logs")
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # this process's drivers, as the cluster
    # Ray's sockets live under its temp dir: a short path, or they exceed the 107-byte limit.
    temp_dir = tempfile.mkdtemp(prefix="gw-ray-", dir="/tmp")
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = _start(["--head", f"--port={port}", "--include-dashboard=false",
                   f"--temp-dir={temp_dir}"], logs / "head.log")
    node = None
    try:
        deadline = time.monotonic() + 60
        _wait_for_raylet(head, deadline, logs / "head.log")
        node = _start([f"--address={address}"], logs / "node.log")
        _wait_for_raylet(node, deadline, logs / "node.log")
        while _alive_nodes(address) < 2:
            assert time.monotonic() < deadline and node.poll() is None, (logs / "node.log").read_text()
            time.sleep(0.5)
        yield Cluster(address, head, node, temp_dir)
    finally:
        for proc in (node, head):
            if proc is not None:
                kill_tree(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if saved_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_auth


def records(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "run"]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _records_so_far(path: Path) -> list[dict[str, Any]]:
    """The runs a study has written so far (a line being written is skipped)."""
    out = []
    for line in _lines(path)[1:]:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def _cmdline(proc: Any) -> list[str]:
    import psutil

    try:
        return list(proc.cmdline())
    except psutil.Error:
        return []


def by_run(recs: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["condition"], r["index"]): r for r in recs}


# Identical wherever a run ran: what the runs computed and every statistic made of it.
TIMES = ("wall_s", "energy_j")


def comparable(analysis: dict[str, Any]) -> dict[str, Any]:
    """The analysis without what depends on the machine's speed (times, energies)."""
    out = json.loads(json.dumps(analysis))
    for c in out["conditions"].values():
        for key in TIMES:
            c.pop(key)
    out.pop("deterministic_time_ratio")
    out.pop("deterministic_energy_ratio")
    return out


# --- bad input: one line, exit 2, the results file untouched ------------------------------------


def _untouched(path: Path, before: bytes | None) -> bool:
    return (not path.exists()) if before is None else path.read_bytes() == before


@pytest.mark.slow
@needs_ray
def test_a_replica_no_node_can_hold_is_refused(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    for extra, words in ((["--ray-gpus", "1"], "1 CPU and 1 GPU"),
                         (["--ray-cpus", "2"], "2 CPUs")):
        code, _, err = run_cli(["repro", "--ray", cluster.address, *extra, "--results",
                                str(results), "--", sys.executable, TINY], capsys)
        assert code == 2 and len(err.strip().splitlines()) <= 2, err
        assert f"has the {words} a replica asks for" in err
        assert "the most on one node: 1 CPU, 0 GPUs; 2 nodes" in err
        assert not results.exists()


# --- a study on a real two-node cluster ---------------------------------------------------------


@pytest.mark.slow
@needs_ray
def test_study_on_ray_survives_a_dead_node_and_matches_a_local_run(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import psutil

    counts, fail = tmp_path / "count.txt", tmp_path / "fail.txt"
    study = ["--runs", "4", "--conditions", "same-seed,seeds", "--json"]
    program = ["--", sys.executable, TINY, "--sleep", "0.8", "--count-file", str(counts),
               "--fail-file", str(fail)]
    # The local reference, as Ray runs a replica that asks for 1 CPU: OMP_NUM_THREADS=1.
    local = tmp_path / "local.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        code, out, _ = run_cli(["repro", *study, "--results", str(local), *program], capsys)
    assert code == 0
    reference = json.loads(out)
    counts.unlink()

    # On Ray: the `seeds` run with seed 3 fails (twice: it is retried once), and once both
    # nodes have finished a replica, the second node is killed (raylet, workers and the
    # replica it runs, by pid) in the middle of another replica.
    fail.write_text("3\n")
    ray_file = tmp_path / "ray.jsonl"
    start = time.monotonic()
    driver = subprocess.Popen([sys.executable, "-c", "from gpuwise.cli import main; main()",
                               "repro", "--ray", cluster.address, *study, "--results",
                               str(ray_file), *program], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    victim_seed = None
    while victim_seed is None and driver.poll() is None:
        started = dict(reversed(line.split()) for line in _lines(counts))  # pid -> seed
        on_node = [p.pid for p in psutil.Process(cluster.node.pid).children(recursive=True)
                   if TINY in " ".join(_cmdline(p))]
        running = [started[str(pid)] for pid in on_node if started.get(str(pid), "3") != "3"]
        if running and len({r["node_id"] for r in _records_so_far(ray_file)}) == 2:
            victim_seed = int(running[0])
            kill_tree(cluster.node)
        time.sleep(0.02)
    out, err = driver.communicate(timeout=120)
    took = time.monotonic() - start
    assert driver.returncode == 0, err
    assert victim_seed is not None, "no replica ran on the second node after a first one"

    runs = records(ray_file)
    keys = [(r["condition"], r["index"]) for r in runs]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 8  # each replica exactly once
    seeds_started = [int(line.split()[0]) for line in _lines(counts)]
    # 8 replicas, the failing one's retry, the killed one's retry
    assert len(seeds_started) == 10 and seeds_started.count(3) == 2
    failed = [r for r in runs if r["returncode"] != 0]
    assert [(r["condition"], r["seed"], r["returncode"]) for r in failed] == [("seeds", 3, 1)]
    assert "failing on purpose" in failed[0]["stderr_tail"]
    ok = [r for r in runs if r["returncode"] == 0]
    assert all(r["node_id"] and r["hardware"] and r["omp_num_threads"] == 1 for r in ok)
    assert len({r["node_id"] for r in ok}) == 2  # spread over both nodes

    # Resumed without Ray, as the local reference ran (one thread): only the failed replica
    # runs; then every run and every statistic equals the local run's.
    fail.unlink()
    mixed = tmp_path / "mixed.jsonl"
    shutil.copy(ray_file, mixed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        code, out, _ = run_cli(["repro", *study, "--results", str(ray_file), *program], capsys)
    assert code == 0
    started_again = _lines(counts)[len(seeds_started):]
    assert [int(line.split()[0]) for line in started_again] == [3]
    resumed = json.loads(out)
    final = by_run([r for r in records(ray_file) if r["returncode"] == 0])
    ref = by_run(records(local))
    assert final.keys() == ref.keys()
    for key, r in ref.items():
        for field in ("seed", "metrics", "params_hash", "steps", "hardware", "omp_num_threads"):
            assert final[key][field] == r[field], (key, field)
    assert comparable(resumed["analysis"]) == comparable(reference["analysis"])
    assert resumed["analysis"]["hardware"] == []  # one kind of hardware: no such source
    assert {p["hardware"] for p in resumed["placement"]} == {ok[0]["hardware"]}

    # Resumed with every core instead: that run's arithmetic is not the others', and the
    # analysis says so (hardware, thread count included, as a source of variance).
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("OMP_NUM_THREADS", raising=False)
        code, out, _ = run_cli(["repro", *study, "--results", str(mixed), *program], capsys)
    assert code == 0
    hardware = json.loads(out)["analysis"]["hardware"]
    assert {(h["metric"], h["condition"]) for h in hardware} == {("loss", "seeds"), ("w", "seeds")}
    assert sorted(hardware[0]["groups"]["runs"].values()) == [1, 3]
    print(f"study on Ray with a node killed: {took:.1f} s")


# --- bad input without a cluster ----------------------------------------------------------------


@needs_ray
def test_an_unreachable_address_fails_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port fails at once; an address that takes the connection but is no Ray
    cluster (10.255.255.1 is unroutable, or taken by a proxy here) within the timeout."""
    from gpuwise.measure.repro import ray_runner

    monkeypatch.setattr(ray_runner, "CONNECT_TIMEOUT_S", 3.0)  # the default is 8 s
    results = tmp_path / "r.jsonl"
    old = b'{"kind": "study", "command": ["x"]}\n'
    results.write_bytes(old)
    for address, within in ((f"127.0.0.1:{free_port()}", 1.0), ("10.255.255.1:6379", 5.0)):
        start = time.monotonic()
        code, _, err = run_cli(["repro", "--ray", address, "--results", str(results), "--",
                                sys.executable, TINY], capsys)
        assert code == 2 and f"cannot reach a Ray cluster at {address}" in err, err
        assert len(err.strip().splitlines()) == 2  # the line and its hint
        assert time.monotonic() - start < within
        assert _untouched(results, old)


@needs_ray
def test_a_port_that_is_not_ray_and_a_machine_that_is_no_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something listens, but it is no Ray cluster: no answer within the timeout; and a
    machine without a Ray node, whose driver Ray would keep waiting a minute: at once."""
    from gpuwise.measure.repro import ray_runner

    monkeypatch.setattr(ray_runner, "CONNECT_TIMEOUT_S", 2.0)
    results = tmp_path / "r.jsonl"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        for raylet, words, within in ((True, "no answer in 2 s", 4.0),
                                      (False, "no Ray node runs on this machine", 1.0)):
            monkeypatch.setattr(ray_runner, "local_raylet", lambda raylet=raylet: raylet)
            start = time.monotonic()
            code, _, err = run_cli(["repro", "--ray", address, "--results", str(results), "--",
                                    sys.executable, TINY], capsys)
            assert code == 2 and f"cannot reach a Ray cluster at {address}" in err, err
            assert words in err and time.monotonic() - start < within
    assert not results.exists()
    with pytest.raises(GpuwiseError, match="wants an authentication token"):
        ray_runner.auth_refused("h:1", "ray.exceptions.AuthenticationError: InvalidAuthToken")


def test_without_ray_one_line_and_the_install_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwise.measure.repro import ray_runner

    monkeypatch.setattr(ray_runner, "ray_installed", lambda: False)
    results = tmp_path / "r.jsonl"
    code, _, err = run_cli(["repro", "--ray", "--results", str(results), "--", "python", "t.py"],
                           capsys)
    assert code == 2 and "needs Ray" in err and "pip install 'gpuwise[ray]'" in err
    assert not results.exists()


def test_ray_options_are_checked_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwise.measure.repro import ray_runner

    def no_connection(self: object) -> None:
        raise AssertionError("connected")

    monkeypatch.setattr(ray_runner.RayCluster, "connect", no_connection)
    cmd = ["--results", str(tmp_path / "r.jsonl"), "--", "python", "t.py"]
    for args, words in ((["--ray-gpus", "1"], "need --ray"),
                        (["--ray", "--parallel", "2"], "do not apply with --ray"),
                        (["--ray", "h:1", "--ray-cpus", "-1"], "--ray-cpus"),
                        (["--ray", "--ray-gpus", "nan"], "--ray-gpus"),
                        (["--ray", "--runs", "0"], "--runs"),
                        (["--ray", "--conditions", "seed"], "unknown condition")):
        code, _, err = run_cli(["repro", *args, *cmd], capsys)
        assert code == 2 and words in err, (args, err)
    assert not (tmp_path / "r.jsonl").exists()


def test_ray_takes_an_optional_address() -> None:
    assert optional_value(["--ray", "--runs", "3", "--", "--ray"], "--ray", "") == [
        "--ray", "", "--runs", "3", "--", "--ray"]
    assert optional_value(["--ray"], "--ray", "") == ["--ray", ""]
    assert optional_value(["--ray", "h:6379", "--"], "--ray", "") == ["--ray", "h:6379", "--"]
    assert optional_value(["--ray=auto"], "--ray", "") == ["--ray=auto"]


def test_hardware_labels_and_keys() -> None:
    from gpuwise.measure.repro.placement import hardware_key, hardware_label, visible_gpu_names

    names = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA L4")
    assert visible_gpu_names(None, names) == list(names)
    assert visible_gpu_names("2,0", names) == ["NVIDIA L4", "NVIDIA H100 80GB HBM3"]
    assert visible_gpu_names("", names) == [] and visible_gpu_names("-1,0", names) == []
    assert visible_gpu_names("GPU-1234", names[:2]) == [names[0]]
    assert hardware_label(list(names), "cpu") == "2x NVIDIA H100 80GB HBM3 + NVIDIA L4"
    assert hardware_label([], "AMD EPYC") == "AMD EPYC"
    assert hardware_key({"hardware": "X", "threads": None, "omp_num_threads": 1}) == "X, 1 thread"
    assert hardware_key({"hardware": "X", "threads": 4, "omp_num_threads": 4}) == "X"
    assert hardware_key({"hardware": "X", "threads": None, "omp_num_threads": None}) == "X"
    assert hardware_key({"condition": "seeds"}) is None  # a record from before the field


def test_lost_and_failed_records_keep_their_shape() -> None:
    import pickle

    from gpuwise.measure.repro.plan import RunSpec
    from gpuwise.measure.repro.ray_runner import ReplicaFailed, lost_record
    from gpuwise.measure.repro.runner import condition_runs

    lost = lost_record(RunSpec("seeds", 2, 3, None, False), "NodeDiedError: the node died\nmore")
    assert lost["returncode"] is None and lost["error"] == "NodeDiedError: the node died"
    failed = ReplicaFailed({"condition": "seeds", "index": 1, "returncode": 1})
    assert pickle.loads(pickle.dumps(failed)).record == failed.record  # crosses processes
    grouped = condition_runs([lost], ("seeds",))
    assert grouped[0].failed == 1 and grouped[0].wall_s == []

