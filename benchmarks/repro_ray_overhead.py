"""What running a study's replicas as Ray tasks costs over running them here, side by side.

A Ray head is started on this machine (`ray start --head --block`, SLOTS CPUs, no dashboard)
and the same study of a tiny replica (tests/repro_tiny.py: pure Python, ~50 ms of process)
runs alternately through the local runner (`--parallel SLOTS`, in a process of its own that
never imports Ray, as `gpuwise repro` without `--ray`) and through Ray (one CPU per
replica, so SLOTS at a time as well): PAIRS studies of BLOCK replicas each way, every one
into a fresh results file, which of the two goes first alternating. Reported, medians:

- per replica: the study's wall time over its replicas, local and on Ray, and the difference
  (what Ray adds to each replica: task submission, scheduling, a worker's turn, the record
  coming back, the driver writing it), as the median of the pairs' differences;
- the replica's own process time (the records' wall_s), here and in a Ray worker;
- the time per replica outside its process (the study's time less its processes' over
  SLOTS): the runner's own cost, local and on Ray, free of the processes' noise;
- fixed costs of a study on Ray: reaching the cluster (the child-process probe and the
  driver's ray.init), and the first study's start-up (Ray starts its worker processes).

Run:  .venv/bin/python benchmarks/repro_ray_overhead.py [--block 10] [--pairs 10] [--slots 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuwise.measure.repro.ray_runner import RayCluster, RaySettings
from gpuwise.measure.repro.runner import Study

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "repro_tiny.py")
RAY_CLI = Path(sys.executable).with_name("ray")


def start_head(slots: int, temp_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = subprocess.Popen(
        [str(RAY_CLI), "start", "--head", "--block", f"--port={port}", f"--num-cpus={slots}",
         "--num-gpus=0", "--object-store-memory=100000000", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"})
    import psutil

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # up once its raylet runs (a driver attaches to it)
        if any(p.name() == "raylet" for p in psutil.Process(head.pid).children(recursive=True)):
            time.sleep(0.5)
            return head, f"127.0.0.1:{port}"
        time.sleep(0.2)
    raise SystemExit("the Ray head did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the head and everything under it, each by its pid."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(tree, timeout=10)


def study(path: Path, replicas: int, slots: int) -> Study:
    return Study((sys.executable, TINY), ("seeds",), replicas, path, parallel=slots)


# A local study runs in a process of its own, without Ray (as `gpuwise repro` does): a process
# connected to Ray as a driver carries Ray's threads, which a local run would not have.
LOCAL = """
import json, sys, time
from pathlib import Path
from gpuwise.measure.repro.runner import Study, run_study
path, block, slots = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
study = Study((sys.executable, sys.argv[4]), ("seeds",), block, path, parallel=slots)
start = time.perf_counter()
records = run_study(study, fresh=True)
print(json.dumps({"t": time.perf_counter() - start, "records": records}))
"""


def local_study(path: Path, block: int, slots: int) -> tuple[float, list[dict[str, Any]]]:
    out = subprocess.run([sys.executable, "-c", LOCAL, str(path), str(block), str(slots), TINY],
                         capture_output=True, text=True, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return float(answer["t"]), list(answer["records"])


def timed(fn: Any) -> tuple[float, list[dict[str, Any]]]:
    start = time.perf_counter()
    records = fn()
    return time.perf_counter() - start, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=10, help="replicas per study")
    ap.add_argument("--pairs", type=int, default=10, help="local and Ray studies, alternating")
    ap.add_argument("--slots", type=int, default=1, help="replicas at a time, both ways")
    args = ap.parse_args()
    # This benchmark's own cluster, without token authentication on either side (`ray start`
    # turns it on where ~/.ray/auth_token exists; a driver sends one only in token mode).
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="gw-ray-bench-", dir="/tmp")
    head, address = start_head(args.slots, temp_dir)
    out: dict[str, Any] = {"block": args.block, "pairs": args.pairs, "slots": args.slots}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            cluster = RayCluster(RaySettings(address, cpus=1.0, gpus=0.0))
            cluster.connect()
            out["connect_s"] = time.perf_counter() - start
            # warm-up: Ray starts its workers on the first tasks (reported, not counted)
            out["first_study_s"], _ = timed(lambda: cluster.run(
                study(Path(tmp) / "warm.jsonl", args.slots, args.slots), fresh=True))
            local_s: list[float] = []
            ray_s: list[float] = []
            replica_s: dict[str, list[float]] = {"local": [], "ray": []}
            around: dict[str, list[float]] = {"local": [], "ray": []}  # outside the process
            for i in range(args.pairs):  # alternate which goes first: drifts cancel
                ways = [("local", local_s), ("ray", ray_s)]
                for way, times in ways if i % 2 == 0 else ways[::-1]:
                    path = Path(tmp) / f"{way}{i}.jsonl"
                    block = study(path, args.block, args.slots)
                    if way == "local":
                        t, recs = local_study(path, args.block, args.slots)
                    else:
                        t, recs = timed(lambda block=block: cluster.run(block, fresh=True))
                    assert all(r["returncode"] == 0 for r in recs)
                    times.append(t / args.block)
                    replica_s[way] += [r["wall_s"] for r in recs]
                    inside = sum(r["wall_s"] for r in recs) / args.slots
                    around[way].append((t - inside) / args.block)
            cluster.close()
    finally:
        stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
    local, ray = statistics.median(local_s), statistics.median(ray_s)
    paired = statistics.median(r - q for r, q in zip(ray_s, local_s, strict=True))
    out |= {"local_per_replica_s": local, "ray_per_replica_s": ray,
            "ray_overhead_per_replica_s": paired,
            "replica_process_local_s": statistics.median(replica_s["local"]),
            "replica_process_ray_s": statistics.median(replica_s["ray"]),
            "around_local_s": statistics.median(around["local"]),
            "around_ray_s": statistics.median(around["ray"]),
            "local_blocks_s": local_s, "ray_blocks_s": ray_s}
    print(json.dumps(out, indent=1))
    print(f"per replica: local {local * 1e3:.0f} ms, Ray {ray * 1e3:.0f} ms: Ray adds "
          f"{paired * 1e3:.0f} ms (median of pairs; {args.slots} at a time; the replica's process "
          f"{out['replica_process_local_s'] * 1e3:.0f} ms here, "
          f"{out['replica_process_ray_s'] * 1e3:.0f} ms in a Ray worker); reaching the cluster "
          f"{out['connect_s']:.2f} s, first study's start-up {out['first_study_s']:.2f} s")
    print(f"outside the replica's process, per replica: local {out['around_local_s'] * 1e3:.1f} "
          f"ms, Ray {out['around_ray_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
