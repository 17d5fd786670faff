"""What one runtime is to gpuwise (docs/architecture.md, "Runtimes"): everything that differs
about it in one object, which the rest of the code asks instead of comparing its name: its
memory rules, its step time, its scheduler, the options it reads, the checkpoint formats it
loads and what it runs on. One module of this folder a runtime (transformers.py, vllm.py,
sglang.py, llama_cpp.py); a new runtime is a new module here and its catalogue entries."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.runtime_speed import RuntimeSpeed, runtime_speed
from gpuwise.catalog.schedulers import SchedulerDefaults, scheduler_defaults
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.estimate.speed.step import RooflineStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

# The deployment options only some runtimes read, as `--option` names: a runtime lists
# those it reads in `reads`; the others are said to be ignored, never dropped silently.
StepModel = GgmlStep | RooflineStep
RUNTIME_OPTIONS = {"ctx": "--ctx", "gpu_memory_utilization": "--gpu-memory-utilization",
                   "gpu_layers": "--gpu-layers", "threads": "--threads",
                   "expert_parallel": "--expert-parallel", "cpu_moe_layers": "--n-cpu-moe"}


@dataclass(frozen=True)
class RuntimeUnit:
    """One runtime. Subclasses say how it allocates memory and times a step."""

    id: str  # as --runtime takes it
    reads: frozenset[str] = frozenset()  # of RUNTIME_OPTIONS, the plan fields it reads
    loads: frozenset[str] = frozenset({"safetensors"})  # checkpoint formats it runs as stored
    dequantises: frozenset[str] = frozenset()  # and those it loads as bf16
    convert_hint: str = ""  # how to get a checkpoint it loads from one it does not
    memory_note: str = ""  # where its memory follows another runtime's rules: said
    own_memory_rules: bool = False  # sized by its own rules, not a replay of an allocator
    shards_memory: bool = False  # under --tp each device holds its share of weights and cache
    # splits the layers into stages with batches in flight in each (vLLM
    # --pipeline-parallel-size, SGLang --pp-size; estimate/serve/pipeline.py)
    pipelines: bool = False
    torch_compile: bool = False  # runs the model through torch.compile (training too)
    # the part of `gpuwise probe --runtime` that times it: "" the machine's own probe (the
    # roofline's rates), a part's name where it has its own, None where nothing probes it
    probe_part: str | None = None
    # the weight formats it runs, highest precision first, as `check` lists them (empty: the
    # framework formats, check_rows.CHECK_PRECISIONS); llama.cpp's are GGUF types
    precisions: tuple[str, ...] = ()
    serves_as: str = ""  # the runtime whose scheduler it serves with (itself where empty)

    @cached_property
    def speed(self) -> RuntimeSpeed:
        return runtime_speed(self.id)

    @cached_property
    def scheduler(self) -> SchedulerDefaults:
        return scheduler_defaults(self.serves_as or self.id)

    def scheduler_on(self, hw: Hardware) -> SchedulerDefaults:
        """Its scheduler's defaults as it picks them on `hw` (vLLM's larger on H100s)."""
        return self.scheduler.on(hw.memory_bytes, hw.id)

    def scheduler_for(self, arch: Architecture, plan: InferencePlan,
                      hw: Hardware) -> SchedulerDefaults:
        """Its scheduler's defaults for `plan` on `hw`: the device's, with what the runtime
        sizes by its memory (SGLang's running requests by its KV pool)."""
        return self.scheduler_on(hw)

    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        raise NotImplementedError

    def context_step(self) -> int:
        """The granule its context is allocated in (llama.cpp pads n_ctx to 256): every
        context within one takes the same memory."""
        return 1

    def as_run(self, arch: Architecture, plan: InferencePlan, hw: Hardware) -> InferencePlan:
        """The plan with what the runtime picks itself where the user left it (llama-server's
        context and layers): what its steps are timed on."""
        return plan

    def step(self, arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
             host: DeviceRates | None = None) -> StepModel:
        raise NotImplementedError

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """Positions of keys and values a serving replica of `tp` devices holds."""
        raise NotImplementedError


PLAN_FIELDS = {"ctx": "context_alloc"}  # an option's field on InferencePlan, where named apart
