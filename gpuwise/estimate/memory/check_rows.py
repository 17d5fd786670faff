"""The can-I-run-it views: one model across precisions, or a catalogue on one device."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.in_turn import MapAll, in_turn
from gpuwise.estimate.memory.fits import max_context
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.plans import InferencePlan

CHECK_PRECISIONS = ("fp32", "bf16", "fp8", "int8", "int4", "nf4")


@dataclass(frozen=True)
class DecodeCell:
    """A row's decode step under its runtime, with its 80% interval, or why the runtime
    cannot run the row's precision (`unavailable`)."""

    s_per_token: float | None = None
    low: float | None = None
    high: float | None = None
    tokens_per_s: float | None = None
    kernel: str | None = None
    source: str = ""
    missing_parts: tuple[str, ...] = ()
    unavailable: str = ""

    def record(self) -> dict[str, Any]:
        if self.unavailable:
            return {"unavailable": self.unavailable}
        rec = asdict(self)
        del rec["unavailable"]
        return {**rec, "missing_parts": list(self.missing_parts)}


@dataclass(frozen=True)
class PrecisionRow:
    """One weight precision of a model on a device: its memory, whether it fits and the
    largest context that does (`check`'s rows; with `model` and `params`, the main job's)."""

    weights: str
    weight_bytes: int
    total_bytes: int
    fits: bool
    verdict: str
    margin_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    max_context: int
    model_max_context: int
    breakdown: dict[str, int] = field(repr=False)
    model: str = ""  # the main job's rows: the catalogue model
    params: int = 0
    decode: DecodeCell | None = None  # check's rows: the decode step
    # where the runtime moved layers off the device to fit (llama-server's --fit): how many
    # it kept there, of how many (0, 0: it moved none)
    device_layers: tuple[int, int] = (0, 0)

    def record(self) -> dict[str, Any]:
        """The JSON row: the fields, without the ones this kind of row has not."""
        rec = {k: v for k, v in self.__dict__.items()
               if k not in ("model", "params", "decode", "device_layers")}
        if self.device_layers[1]:
            rec["device_layers"] = {"on_device": self.device_layers[0],
                                    "of": self.device_layers[1]}
        if self.model:
            rec.update(model=self.model, params=self.params)
        if self.decode is not None:
            rec["decode"] = self.decode.record()
        return rec


def precision_row(arch: Architecture, plan: InferencePlan, hw: Hardware) -> PrecisionRow:
    est = estimate_inference(arch, plan, hw)
    run = runtime_unit(plan.runtime).as_run(arch, plan, hw)
    moved = plan.gpu_layers is None and run.gpu_layers is not None
    return PrecisionRow(plan.weights, est.breakdown["weights"], est.total_bytes, est.fits,
                        est.verdict, est.margin_bytes, est.capacity_bytes, est.headroom_bytes,
                        max_context(arch, run, hw), arch.max_position, est.breakdown,
                        device_layers=(run.gpu_layers or 0, arch.num_layers) if moved else (0, 0))


def check_rows(arch: Architecture, plan: InferencePlan, hw: Hardware,
               precisions: tuple[str, ...] = CHECK_PRECISIONS,
               map_all: MapAll[str, PrecisionRow] = in_turn) -> list[PrecisionRow]:
    """A row per precision; `map_all` runs them (each a search of the largest context)."""
    return map_all(partial(_precision_row_at, arch, plan, hw), list(precisions))


def _precision_row_at(arch: Architecture, plan: InferencePlan, hw: Hardware,
                      weights: str) -> PrecisionRow:
    return precision_row(arch, replace(plan, weights=weights), hw)


def catalogue_rows(models: list[tuple[str, Architecture]], plan: InferencePlan, hw: Hardware,
                   precisions: tuple[str, ...],
                   map_all: MapAll[tuple[str, Architecture], list[PrecisionRow]] = in_turn,
                   ) -> list[PrecisionRow]:
    """Each model's rows, a model at a time through `map_all` (its precisions share the
    replays of its allocator)."""
    per_model = map_all(partial(_model_rows, plan, hw, precisions), models)
    return [row for rows in per_model for row in rows]


def _model_rows(plan: InferencePlan, hw: Hardware, precisions: tuple[str, ...],
                model: tuple[str, Architecture]) -> list[PrecisionRow]:
    name, arch = model
    fitted = _within_model_limit(arch, plan)
    params = count_params(arch).total
    return [replace(precision_row(arch, replace(fitted, weights=p), hw), model=name,
                    params=params) for p in precisions]


def _within_model_limit(arch: Architecture, plan: InferencePlan) -> InferencePlan:
    """Shorten the prompt so prompt + new tokens stay inside the model's context window."""
    limit = arch.max_position
    if not limit or plan.context_tokens <= limit:
        return plan
    new = min(plan.new_tokens, limit // 4)
    return replace(plan, prompt_tokens=max(1, limit - new), new_tokens=new)
