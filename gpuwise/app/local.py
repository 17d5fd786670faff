"""`gpuwise` with no command: this machine, and what of the model catalogue runs on it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from gpuwise.app.side_by_side import side_by_side
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import load_models
from gpuwise.estimate.memory.check_rows import PrecisionRow, catalogue_rows
from gpuwise.measure.hardware.detect import LocalMachine, detect_local
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan

LOCAL_PRECISIONS = ("bf16", "int8", "int4")
# On a CPU or a Mac people run llama.cpp, at the GGUF types models are shipped in
HOST_RUNTIME, HOST_PRECISIONS = "llama.cpp", ("fp16", "q8_0", "q4_k_m")


@dataclass(frozen=True)
class LocalAnswer:
    machine: LocalMachine
    hardware: Hardware
    plan: InferencePlan
    rows: list[PrecisionRow]


def this_machine() -> LocalAnswer:
    """Detect the machine; each catalogue model's memory on its best device, per precision:
    on a CPU or a Mac under llama.cpp at its GGUF types, elsewhere under transformers."""
    machine = detect_local()
    hw = machine.best_device()
    plan = InferencePlan(prompt_tokens=2048, new_tokens=256)
    precisions = LOCAL_PRECISIONS
    if hw.kind in ("cpu", "apple"):
        plan, precisions = replace(plan, runtime=HOST_RUNTIME), HOST_PRECISIONS
    models = [(e.id, from_config(e.load_config(), e.id)) for e in load_models()]
    rows = catalogue_rows(models, plan, hw, precisions, partial(side_by_side, what="model"))
    return LocalAnswer(machine, hw, plan, rows)
