"""Backends: the only code of the probe that touches hardware (torch on the CPU or CUDA,
numpy, and a null backend that measures nothing, for tests and machines without libraries)."""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import subprocess
import time
import warnings
from pathlib import Path

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.errors import normalise_name
from gpuwise.measure.hardware.catalogue_match import match_catalogue
from gpuwise.measure.hardware.host import cpu_model
from gpuwise.measure.probe.profile import NO_LINK, TRIAD_SCALAR, Op


def why(exc: BaseException) -> str:
    """A reading's reason for being missing, from the exception that stopped it."""
    if isinstance(exc, Unsupported):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Unsupported(Exception):
    """A measurement the backend cannot make; the message is the reason."""


class Backend:
    """The interface the probe measures through. This base measures nothing (null backend)."""

    name = "null"

    def __init__(self, reason: str = "null backend: nothing is measured") -> None:
        self.reason = reason

    def describe(self) -> str:
        return "no device"

    def threads(self) -> int | None:
        raise Unsupported(self.reason)

    def versions(self) -> dict[str, str]:
        return {}

    def notes(self) -> tuple[str, ...]:
        return (self.reason,)

    def spec(self) -> Hardware | None:
        raise Unsupported(self.reason)

    def cache_bytes(self) -> int | None:
        raise Unsupported(self.reason)

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16", "int8")

    def stream_ops(self, n: int) -> dict[str, Op]:
        """read/copy/triad over three fp32 arrays of n elements."""
        raise Unsupported(self.reason)

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        raise Unsupported(self.reason)

    def tiny_ops(self) -> dict[str, Op]:
        raise Unsupported(self.reason)

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        raise Unsupported(self.reason)

    def time_calls(self, op: Op, calls: int) -> list[float]:
        """Seconds each of `calls` calls took, one after another."""
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        return times

    def time_batch(self, op: Op, calls: int) -> float:
        """Mean seconds per call over `calls` back-to-back calls."""
        start = time.perf_counter()
        for _ in range(calls):
            op()
        return (time.perf_counter() - start) / calls

    def release(self) -> None:
        gc.collect()

    def close(self) -> None:
        """Undo what the backend changed (thread count); called once at the end."""


class NullBackend(Backend):
    """Measures nothing: every reading is None with the reason. For tests, and no libraries."""

    def __init__(self, reason: str = "null backend: nothing is measured", name: str = "null"):
        super().__init__(reason)
        self.name = name


class _CpuBackend(Backend):
    def describe(self) -> str:
        return cpu_model()

    def threads(self) -> int | None:
        return _compute_cores()

    def notes(self) -> tuple[str, ...]:
        return ()

    def spec(self) -> Hardware | None:
        model = normalise_name(cpu_model())
        found = [hw for hw in load_hardware() if hw.kind == "cpu" and model in
                 {hw.id, normalise_name(hw.name), *map(normalise_name, hw.aliases)}]
        if not found:
            raise Unsupported(f"CPU {cpu_model()!r} not in the catalogue: no fraction of spec")
        return found[0]

    def cache_bytes(self) -> int | None:
        return _llc_bytes()

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        raise Unsupported(NO_LINK)


class TorchBackend(_CpuBackend):
    """torch on the CPU, on all physical cores."""

    name = "torch-cpu"

    def __init__(self) -> None:
        import torch

        self.torch, self.device = torch, torch.device("cpu")
        self._threads_before = torch.get_num_threads()
        if self.name == "torch-cpu":
            torch.set_num_threads(_compute_cores())

    def threads(self) -> int | None:
        return int(self.torch.get_num_threads())

    def versions(self) -> dict[str, str]:
        return {"torch": self.torch.__version__, "cuda": str(self.torch.version.cuda)}

    def stream_ops(self, n: int) -> dict[str, Op]:
        t, f32 = self.torch, {"dtype": self.torch.float32, "device": self.device}
        a, b, c = (t.empty(n, **f32).fill_(v) for v in (1.0, 2.0, 0.5))  # fill_: parallel touch
        return {"read": lambda: t.sum(a), "copy": lambda: c.copy_(a),
                "triad": lambda: t.add(b, c, alpha=TRIAD_SCALAR, out=a)}

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        t, dev = self.torch, self.device
        if dtype == "int8":
            a8 = t.randint(-8, 8, (m, k), dtype=t.int8, device=dev)
            b8 = t.randint(-8, 8, (k, n), dtype=t.int8, device=dev)
            out = t.empty(m, n, dtype=t.int32, device=dev)
            return lambda: t._int_mm(a8, b8, out=out)
        types = {"fp32": t.float32, "tf32": t.float32, "bf16": t.bfloat16, "fp16": t.float16}
        if dtype not in types:
            raise Unsupported(f"{self.name}: no {dtype} matmul")
        # B stored (n, k) and used transposed, as F.linear uses its weight: the layout a
        # model runs. Without bf16 instructions (AVX2), torch's bf16 A @ B with both
        # contiguous falls to a generic loop, 20x slower than this one.
        a, w = (t.randn(*s, device=dev).to(types[dtype]) for s in ((m, k), (n, k)))
        b = w.t()
        out = t.empty(m, n, dtype=types[dtype], device=dev)
        if dtype != "tf32":
            return lambda: t.mm(a, b, out=out)

        def tf32() -> object:
            with warnings.catch_warnings():  # newer torch prefers another switch; same effect
                warnings.simplefilter("ignore")
                before = t.get_float32_matmul_precision()
                t.set_float32_matmul_precision("high")
                try:
                    return t.mm(a, b, out=out)
                finally:
                    t.set_float32_matmul_precision(before)

        return tf32

    def tiny_ops(self) -> dict[str, Op]:
        t = self.torch
        x, y = t.ones(1, device=self.device), t.ones(1, 1, device=self.device)
        return {"add": lambda: t.add(x, x), "matmul_1x1": lambda: t.mm(y, y)}

    def close(self) -> None:
        self.torch.set_num_threads(self._threads_before)


class TorchCudaBackend(TorchBackend):
    """torch on CUDA device 0: timed with CUDA events; host links and peer copies too."""

    name = "torch-cuda"

    def __init__(self) -> None:
        super().__init__()
        if not self.torch.cuda.is_available():
            raise Unsupported(f"torch {self.torch.__version__}: no CUDA device")
        self.device = self.torch.device("cuda", 0)
        self.props = self.torch.cuda.get_device_properties(0)

    def describe(self) -> str:
        return f"{self.props.name} (GPU 0 of {self.torch.cuda.device_count()})"

    def spec(self) -> Hardware | None:
        return match_catalogue(self.props.name, int(self.props.total_memory))

    def cache_bytes(self) -> int | None:
        return int(self.props.L2_cache_size)

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32", "tf32", "bf16", "fp16", "int8")

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        t = self.torch
        host = t.empty(nbytes, dtype=t.uint8, pin_memory=True)
        dev = t.empty(nbytes, dtype=t.uint8, device=self.device)
        ops: dict[str, Op] = {"h2d": lambda: dev.copy_(host, non_blocking=True),
                              "d2h": lambda: host.copy_(dev, non_blocking=True)}
        if t.cuda.device_count() > 1:
            peer = t.empty(nbytes, dtype=t.uint8, device="cuda:1")
            ops["d2d"] = lambda: (peer.copy_(dev, non_blocking=True), t.cuda.synchronize(1))
        return ops

    def time_calls(self, op: Op, calls: int) -> list[float]:
        cuda = self.torch.cuda
        cuda.synchronize()
        times = []
        for _ in range(calls):
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return times

    def time_batch(self, op: Op, calls: int) -> float:
        self.torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            op()
        self.torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls

    def release(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()


class NumpyBackend(_CpuBackend):
    """numpy: elementwise ops on one thread; matmul through numpy's BLAS (fp32 only)."""

    name = "numpy-cpu"

    def __init__(self) -> None:
        import numpy

        self.np = numpy

    def threads(self) -> int | None:
        return 1

    def notes(self) -> tuple[str, ...]:
        return ("numpy backend: elementwise ops run on one thread, so bandwidth is one core's; "
                "triad is two passes (s*c, then + b) counted as one; fp16/int8 matmul have no "
                "BLAS path in numpy",)

    def versions(self) -> dict[str, str]:
        return {"numpy": self.np.__version__}

    def stream_ops(self, n: int) -> dict[str, Op]:
        np = self.np
        a, b, c = (np.full(n, v, dtype=np.float32) for v in (1.0, 2.0, 0.5))

        def triad() -> object:
            np.multiply(c, TRIAD_SCALAR, out=a)
            return np.add(a, b, out=a)

        return {"read": lambda: a.sum(), "copy": lambda: np.copyto(c, a), "triad": triad}

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        np = self.np
        types = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}
        if dtype not in types:
            raise Unsupported(f"numpy has no {dtype} matmul")
        rng = np.random.default_rng(0)
        a, b = (rng.integers(-8, 8, size=s).astype(types[dtype]) for s in ((m, k), (k, n)))
        out = np.empty((m, n), dtype=types[dtype])
        return lambda: np.matmul(a, b, out=out)

    def tiny_ops(self) -> dict[str, Op]:
        np = self.np
        x, y = np.ones(1, dtype=np.float32), np.ones((1, 1), dtype=np.float32)
        return {"add": lambda: np.add(x, x), "matmul_1x1": lambda: np.matmul(y, y)}


def make_backend(name: str) -> Backend:
    """The named backend, or a null one carrying the reason it could not start."""
    if name == "null":
        return NullBackend()
    try:
        if name == "numpy-cpu":
            return NumpyBackend()
        return TorchCudaBackend() if name == "torch-cuda" else TorchBackend()
    except Exception as exc:
        return NullBackend(f"{name} unavailable: {why(exc)}", name=name)


def auto_backend() -> Backend:
    """torch-cuda, torch-cpu, numpy-cpu: the first that starts; else a null one saying why."""
    reasons = []
    for name, module in (("torch-cuda", "torch"), ("torch-cpu", "torch"), ("numpy-cpu", "numpy")):
        if not _installed(module):
            reasons.append(f"{module} not installed")
            continue
        backend = make_backend(name)
        if not isinstance(backend, NullBackend):
            return backend
        reasons.append(backend.reason)
    why = "; ".join(dict.fromkeys(reasons))
    return NullBackend(f"no backend: {why} (pip install 'gpuwise[torch]')", name="none")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --- CPU facts ----------------------------------------------------------------------------------


def _compute_cores() -> int:
    """Physical cores this process may run on (SMT siblings add no bandwidth or FMA units)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:
        physical = None
    return max(1, min(physical or usable or 1, usable or 1))


def _size_bytes(text: str) -> int:
    found = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not found:
        raise ValueError(f"not a cache size: {text!r}")
    return int(float(found[1]) * 1024 ** " KMG".index(found[2].upper() or " "))


def _llc_bytes() -> int | None:
    """Total last-level cache (all instances): sysfs first, then lscpu; None if unreadable."""
    level, size, owners = 0, 0, set()
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            lvl, kib = int((index / "level").read_text()), _size_bytes((index / "size").read_text())
            owner = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if lvl > level:
            level, size, owners = lvl, kib, {owner}
        elif lvl == level:
            size, owners = max(size, kib), owners | {owner}
    if size:
        return size * len(owners)
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        caches = re.findall(r"^L(\d)\S* cache:\s*([\d.]+ *[KMG]i?B)", out, re.MULTILINE)
        return _size_bytes(max(caches)[1]) if caches else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
