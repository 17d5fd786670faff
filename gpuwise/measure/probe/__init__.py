"""Probe this machine: memory bandwidth, matmul throughput by size and dtype, per-op overhead.

Time estimates use these measured numbers instead of datasheet peaks. The measurements are
generic; the hardware sits behind a narrow `Backend` (torch on the CPU or CUDA, numpy when
torch is missing, and a null backend for tests) that builds the operations and times them.

- Bandwidth, the STREAM way: read (a sum), copy (c = a) and triad (a = b + s*c) over fp32
  arrays at least 4x the last-level cache, best of >= 5 interleaved passes, counting 1, 2 and
  3 arrays moved per pass (write-allocate traffic is not counted, as in STREAM).
- Matmul: square and LLM-shaped (tokens x out x in) sizes per dtype, smallest first, each
  warmed up then timed (best and median). A point predicted to break the time budget is
  skipped and said so in `missing`, so a slow path (fp16 on most CPUs) cannot stall the probe.
- Overhead: the median time of a tiny op (add of 1-element tensors, 1x1 matmul): the dispatch
  cost on a CPU, the launch cost on a GPU.
- Links (GPU only): host-to-device and device-to-host copies from pinned memory, and
  device-to-device with two GPUs.

Every reading is a number or None with the reason in `Profile.missing`; nothing raises.
Other work on the machine stalls multithreaded ops (a 2-thread op waits a scheduler tick for
a busy core), so the CPU time other processes took during the probe is checked, and a note
says when the readings are suspect. torch and numpy are imported only inside functions: importing this module stays light.
"""

from gpuwise.measure.probe.backends import (
    Backend,
    NullBackend,
    NumpyBackend,
    TorchBackend,
    TorchCudaBackend,
    Unsupported,
)
from gpuwise.measure.probe.profile import (
    DEFAULT_CACHE_BYTES,
    BandwidthReading,
    MatmulPoint,
    ProbePlan,
    Profile,
)
from gpuwise.measure.probe.run import machine_fingerprint, probe_with, run_probe

__all__ = ["DEFAULT_CACHE_BYTES", "Backend", "BandwidthReading", "MatmulPoint", "NullBackend",
           "NumpyBackend", "ProbePlan", "Profile", "TorchBackend", "TorchCudaBackend",
           "Unsupported", "machine_fingerprint", "probe_with", "run_probe"]
