"""Where a run ran: the node, and the hardware its arithmetic ran on.

Every record of a study carries them, local or under Ray, so that runs on different hardware
are told apart in the analysis ("hardware" is then one more source of variance). The
hardware label is the model of the devices the run sees (its visible GPUs, else the CPU),
with the thread count its environment fixes when the condition does not set one: a replica
that asks Ray for 1 CPU runs with OMP_NUM_THREADS=1 (Ray's rule), a local run with every
core, and the two sum in a different order.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Mapping
from functools import cache
from typing import Any

from gpuwise.measure.hardware.gpus import nvml_gpus
from gpuwise.measure.hardware.host import cpu_model
from gpuwise.measure.hardware.nvml import shared_nvml

THREAD_VARS = ("OMP_NUM_THREADS",)


@cache
def _gpu_names() -> tuple[str, ...]:
    """This node's NVIDIA GPUs by NVML index (none without a driver); they do not change."""
    gpus, _ = nvml_gpus(shared_nvml())
    return tuple(g.name for g in gpus)


@cache
def _cpu() -> str:
    return cpu_model()


def visible_gpu_names(visible: str | None, names: tuple[str, ...]) -> list[str]:
    """The names of the GPUs CUDA_VISIBLE_DEVICES=`visible` leaves a process (None: unset,
    every GPU). Indices select by NVML order; UUIDs or MIG ids cannot be mapped here, so they
    count as this node's model when all its GPUs are one model."""
    if visible is None:
        return list(names)
    out = []
    for item in (v.strip() for v in visible.split(",")):
        if not item:
            continue
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0:  # CUDA stops at the first invalid index
                break
            if index < len(names):
                out.append(names[index])
        elif len(set(names)) == 1:
            out.append(names[0])
    return out


def hardware_label(gpu_names: list[str], cpu: str) -> str:
    """'NVIDIA H100 80GB HBM3', '2x NVIDIA A100-SXM4-80GB', 'A + B', or the CPU's model."""
    if not gpu_names:
        return cpu
    counts = Counter(gpu_names)
    return " + ".join(f"{n}x {name}" if n > 1 else name for name, n in sorted(counts.items()))


def placement(env: Mapping[str, str], node_id: str | None = None) -> dict[str, Any]:
    """The record fields that say where a run with environment `env` runs: node (host name),
    node_id (Ray's, None locally), hardware (device model) and the thread count `env` fixes
    (None: the libraries' default, every core)."""
    threads = env.get("OMP_NUM_THREADS")
    return {
        "node": socket.gethostname(),
        "node_id": node_id,
        "hardware": hardware_label(visible_gpu_names(env.get("CUDA_VISIBLE_DEVICES"),
                                                     _gpu_names()), _cpu()),
        "omp_num_threads": int(threads) if threads and threads.strip().isdigit() else None,
    }


def hardware_key(record: Mapping[str, Any]) -> str | None:
    """The label a run is grouped by when hardware is a source of variance: its hardware and,
    where its condition does not set the thread count, the thread count its environment
    fixed. None for records written before gpuwise recorded where runs ran."""
    hardware = record.get("hardware")
    if hardware is None:
        return None
    threads = record.get("omp_num_threads")
    if record.get("threads") is None and threads is not None:
        return f"{hardware}, {threads} thread{'s' if threads != 1 else ''}"
    return str(hardware)
