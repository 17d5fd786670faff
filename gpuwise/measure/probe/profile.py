"""What the probe records: its plan, its readings and the saved profile."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpuwise.estimate.speed.probe_record import Check
from gpuwise.measure.probe.profile_schema import PARTS, core_check, part_problems

SCHEMA_VERSION = 1
BACKENDS = ("torch-cuda", "torch-cpu", "numpy-cpu", "null")
STREAM_ARRAYS = {"read": 1, "copy": 2, "triad": 3}  # arrays moved per pass, the STREAM way
TRIAD_SCALAR = 0.5  # below 1, so repeated copy + triad passes never overflow
LINK_KINDS = ("h2d", "d2h", "d2d")
OVERHEAD_OPS = ("add", "matmul_1x1")
OVERHEAD_BATCH = 10  # tiny ops per timed batch: one clock read costs about as much as one op
SAFETY = 1.5  # a larger matmul is predicted this much slower per flop than the best so far
DEFAULT_CACHE_BYTES = 32 * 2**20
NO_LINK = "CPU backend: no host-device link to measure"
Op = Callable[[], object]
Progress = Callable[[str, float], None]


def matmul_flops(shape: tuple[int, int, int]) -> int:
    """FLOPs of an (m, n, k) shape: one multiply and one add per product."""
    m, n, k = shape
    return 2 * m * n * k


# A headline rate (read bandwidth, a 1024^3 matmul) that moved by more than this between the
# start and the end of a probe marks the machine as unsteady: estimates inherit the motion.
STEADY = 0.10


def largest_move(ratios: dict[str, float]) -> float:
    """How far the headline rate that moved most is from 1.0 (as when probed)."""
    return max((abs(r - 1.0) for r in ratios.values()), default=0.0)


def describe_ratios(ratios: dict[str, float]) -> str:
    """'read x0.87, matmul fp32 x1.39': headline rates against the probe's."""
    return ", ".join(f"{k.replace('_', ' ')} x{r:.2f}" for k, r in ratios.items())


@dataclass(frozen=True)
class BandwidthReading:
    """One bandwidth: memory (read/copy/triad) or a link (h2d/d2h/d2d), in GB/s (1e9 B/s)."""

    kind: str
    gbs: float | None
    array_bytes: int  # size of each array (or of one transfer)
    bytes_per_pass: int  # bytes counted per pass
    best_s: float | None
    fraction_of_spec: float | None = None


@dataclass(frozen=True)
class MatmulPoint:
    """One matmul (m x k) @ (k x n) = 2*m*n*k flops; `flops_per_s` uses the best time."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float  # best of the repeats
    median_s: float
    flops_per_s: float
    repeats: int


@dataclass(frozen=True)
class ProbePlan:
    """What to measure and how long to spend; `ProbePlan.for_mode` gives quick and full."""

    array_bytes: int  # per stream array
    stream_repeats: int
    matmul_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k), fewest flops first
    matmul_target_s: float  # timed seconds per point
    matmul_max_call_s: float  # skip a point predicted slower than this per call
    matmul_dtype_budget_s: float  # seconds for one dtype's whole sweep
    matmul_repeats: tuple[int, int]  # (min, max)
    overhead_samples: int
    link_bytes: int
    link_repeats: int

    @classmethod
    def for_mode(cls, quick: bool, cache_bytes: int, on_gpu: bool = False) -> ProbePlan:
        floor = (256 if quick else 1024) * 2**20 if on_gpu else 0
        full = not quick or on_gpu  # a GPU does the whole sweep in seconds
        squares = (64, 128, 256, 512, 1024, 2048, 4096, 8192) if full else (64, 256, 1024, 2048)
        llm = {(1, 4096, 4096), (128, 4096, 4096)}
        if full:
            llm |= {(16, 4096, 4096), (512, 11008, 4096), (2048, 4096, 4096)}
        return cls(
            array_bytes=max(4 * cache_bytes, floor),
            stream_repeats=5 if quick else 20,
            matmul_shapes=tuple(sorted({(s, s, s) for s in squares} | llm, key=matmul_flops)),
            matmul_target_s=0.05 if quick else 0.3,
            matmul_max_call_s=0.3 if quick else 2.0,
            matmul_dtype_budget_s=1.5 if quick else 15.0,
            matmul_repeats=(3, 50) if quick else (5, 200),
            overhead_samples=100 if quick else 1000,
            link_bytes=(256 if quick else 1024) * 2**20,
            link_repeats=5 if quick else 20,
        )


@dataclass(frozen=True)
class Profile:
    """What the probe measured on one machine with one backend. Units in the field names."""

    fingerprint: str
    device: str
    backend: str  # torch-cpu | numpy-cpu | torch-cuda | null | none
    threads: int | None  # CPU threads the backend used
    bandwidth: tuple[BandwidthReading, ...]
    links: tuple[BandwidthReading, ...]
    matmul_points: tuple[MatmulPoint, ...]
    matmul_best: dict[str, MatmulPoint | None]
    matmul_fraction_of_spec: dict[str, float | None]
    overhead_s: dict[str, float | None]
    missing: dict[str, str]  # measurement -> why it is not there
    created_at: str
    versions: dict[str, str]
    cache_bytes: int | None = None
    spec_id: str | None = None  # the catalogue entry that fractions of spec refer to
    quick: bool = False
    notes: tuple[str, ...] = ()
    schema: int = SCHEMA_VERSION
    # The eager runtime's own costs (gpuwise.measure.probe.runtime_costs), when transformers is here.
    runtime: dict[str, Any] | None = None
    # Kernels at model shapes (gpuwise.measure.probe.kernels): linear grid, SDPA, elementwise.
    kernels: dict[str, Any] | None = None
    # llama.cpp's rates on this CPU, with --runtime llama.cpp: `dataclasses.asdict` of a
    # gpuwise.measure.llama_cpp.record.LlamaCppPart (the schema is derived from that class).
    llama_cpp: dict[str, Any] | None = None
    # Headline rates (read, matmul_fp32, matmul_bf16) measured again at the probe's end, as
    # ratios to its own readings (gpuwise.measure.probe.steadiness): 1.0 held still.
    steadiness: dict[str, float] | None = None
    # Why this probe is not trusted, one line each (gpuwise.measure.probe.plausible): readings
    # outside what a real device of its kind gives, or a machine that changed speed beyond the
    # bound while it was probed. A profile with warnings is saved aside and no estimate uses it.
    warnings: tuple[str, ...] = ()

    @property
    def trusted(self) -> bool:
        return not self.warnings

    def without_part(self, part: str, why: str) -> Profile:
        """This profile with one part (PARTS) set aside: taken out, and `missing` says why.
        The rest of the probe stays in use."""
        missing = {**self.missing, part: f"{SET_ASIDE} ({why})"}
        return dataclasses.replace(self, **{part: None}, missing=missing)  # type: ignore[arg-type]

    def without_dtype(self, dtype: str, why: str) -> Profile:
        """This profile with one dtype's matmul readings set aside (`missing` says why); the
        estimates of that dtype fall back as for a dtype never measured."""
        steadiness = {k: v for k, v in (self.steadiness or {}).items() if k != f"matmul_{dtype}"}
        return dataclasses.replace(
            self, matmul_points=tuple(p for p in self.matmul_points if p.dtype != dtype),
            matmul_best={**self.matmul_best, dtype: None},
            matmul_fraction_of_spec={**self.matmul_fraction_of_spec, dtype: None},
            steadiness=steadiness or None,
            missing={**self.missing, f"matmul.{dtype}": f"{SET_ASIDE} ({why})"})

    def parts_set_aside(self) -> dict[str, str]:
        """The parts this profile's probe measured but that were set aside, with why."""
        return {part: why for part, why in self.missing.items()
                if part in PARTS and why.startswith(SET_ASIDE)}

    def bandwidth_gbs(self, kind: str = "triad") -> float | None:
        """Measured GB/s of a memory kind (read/copy/triad) or a link (h2d/d2h/d2d)."""
        found = [r.gbs for r in (*self.bandwidth, *self.links) if r.kind == kind]
        return found[0] if found else None

    def best_flops_per_s(self, dtype: str) -> float | None:
        best = self.matmul_best.get(dtype)
        return best.flops_per_s if best else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        """Read `to_json` output back; ValueError for another schema, or naming the first
        field of the core of the wrong type or shape (`profile_schema`). A part (runtime,
        kernels, llama_cpp) that fails its check is set aside alone (`parts_set_aside`)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
        except RecursionError:  # "[[[[...": json gives up past the interpreter's depth
            raise ValueError("not a probe profile: nested too deeply") from None
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not a probe profile of schema {SCHEMA_VERSION}")
        _check(raw)
        problems = part_problems(raw)  # a malformed part is set aside alone
        raw = {**raw, **dict.fromkeys(problems)}
        raw["missing"] = {**raw["missing"],
                          **{part: f"{SET_ASIDE} ({why})" for part, why in problems.items()}}
        try:
            return cls(**{
                **raw,
                "bandwidth": tuple(BandwidthReading(**r) for r in raw["bandwidth"]),
                "links": tuple(BandwidthReading(**r) for r in raw["links"]),
                "matmul_points": tuple(MatmulPoint(**p) for p in raw["matmul_points"]),
                "matmul_best": {d: p and MatmulPoint(**p) for d, p in raw["matmul_best"].items()},
                "notes": tuple(raw.get("notes", ())),
                "warnings": tuple(raw.get("warnings", ())),
            })
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed probe profile: {exc}") from exc


# What `missing` says of a part of the profile whose readings failed their check.
SET_ASIDE = "set aside, not trusted"


def _check(raw: dict[str, Any]) -> None:
    """ValueError naming the first field of the profile's core that is missing, unknown or of
    the wrong type or shape; the check is derived from the dataclasses above."""
    _core_check()(raw, "profile")


@functools.cache
def _core_check() -> Check:
    return core_check(Profile, BandwidthReading, MatmulPoint)
