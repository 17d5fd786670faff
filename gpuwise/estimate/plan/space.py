"""What `gpuwise plan` searches (docs/plan.md, "The space"): per device, each runtime that runs
on it, each weight format and KV dtype the runtime serves, each tensor-parallel width up to 8
on linked devices (with and without expert parallelism for a mixture of experts), and the
scheduler's limits at the runtime's default or below it. A configuration is one replica's
settings; the search sizes the replicas."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import LINKED_KINDS
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.workload import Architecture

TP_WIDTHS = (1, 2, 4, 8)
PP_STAGES = (1, 2, 4, 8)  # pipeline stages, each of tp devices
MOST_DEVICES = 8  # tp x pp: one node's devices (one NVLink domain)
SERVERS = ("vllm", "sglang")  # batching servers: safetensors formats, paged KV
GGUF_WEIGHTS = ("q4_k_m", "q8_0")  # llama.cpp's usual files
SERVER_WEIGHTS = ("bf16", "fp8", "int4")  # a checkpoint as shipped, fp8 online, AWQ/GPTQ
KV_DTYPES = (None, "fp8")
# narrower scheduler limits, as shares of the default (max_num_seqs, max_num_batched_tokens):
# a quarter of the sequences (each step shorter: TPOT), a quarter of the chunk (a prompt's
# chunks delay the decode steps less: TPOT, at the prompt's cost: TTFT)
NARROWER = ((0.25, 1.0), (1.0, 0.25), (0.25, 0.25))


@dataclass(frozen=True)
class Shapes:
    """The replica shapes searched (gpuwise plan --tp, --pp, --prefill-decode): tensor-parallel
    widths, pipeline stages, and aggregated (False) or disaggregated (True) prefill and
    decode."""

    tp: tuple[int, ...] = TP_WIDTHS
    pp: tuple[int, ...] = PP_STAGES
    split: tuple[bool, ...] = (False, True)


@dataclass(frozen=True, order=True)
class Config:
    """One replica's settings. `seq_share`, `token_share`: the scheduler's limits as a share
    of the runtime's default on this device (1: its default), as a plan can only narrow them
    (a wider batch than the default needs memory the default's pool sizes already)."""

    device: str
    runtime: str
    weights: str
    kv_dtype: str | None
    tp: int
    expert_parallel: bool = False
    seq_share: float = 1.0
    token_share: float = 1.0
    pp: int = 1
    disagg: bool = False  # a prefill pool and a decode pool of these replicas

    @property
    def base(self) -> Config:
        """The same settings at the scheduler's default limits."""
        return replace(self, seq_share=1.0, token_share=1.0)

    @property
    def devices(self) -> int:
        """A replica's devices."""
        return self.tp * self.pp

    @property
    def label(self) -> str:
        width = f"{self.tp}x" if self.pp == 1 else f"{self.tp}x{self.pp}pp"
        parts = [f"{width} {self.device}", self.runtime, self.weights]
        if self.kv_dtype:
            parts.append(f"kv {self.kv_dtype}")
        if self.expert_parallel:
            parts.append("EP")
        if self.disagg:
            parts.append("disaggregated")
        if self.seq_share != 1.0:
            parts.append(f"seqs x{self.seq_share:g}")
        if self.token_share != 1.0:
            parts.append(f"chunk x{self.token_share:g}")
        return " ".join(parts)


def runtimes_on(kind: str, asked: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The runtimes searched on a kind of device: the servers where they run, llama.cpp
    everywhere it runs (its server on a CPU, a Mac, or a GPU at light load); `asked` limits
    them to those named."""
    names = (*SERVERS, "llama.cpp")
    found = tuple(n for n in names if kind in runtime_speed(n).devices)
    return tuple(n for n in found if n in asked) if asked else found


def weights_for(runtime: str, shipped: str | None, asked: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The weight formats searched under a runtime: its own files where it names them
    (llama.cpp's GGUF types), else the checkpoint as shipped (or bf16), fp8 and int4; `asked`
    instead where given."""
    if asked:
        return asked
    own = runtime_unit(runtime).precisions
    if own:
        return tuple(w for w in GGUF_WEIGHTS if w in own)
    first = shipped or "bf16"
    return (first, *(w for w in SERVER_WEIGHTS if w != first))


def base_configs(arch: Architecture, device: str, kind: str, shipped: str | None,
                 runtimes: tuple[str, ...] = (), weights: tuple[str, ...] = (),
                 gpus_max: int | None = None, shapes: Shapes = Shapes()) -> list[Config]:
    """Every configuration at the scheduler's defaults on one device."""
    out = []
    moe = arch.moe is not None
    for rt in runtimes_on(kind, runtimes):
        sharded = runtime_unit(rt).shards_memory  # a batching server splitting each layer
        linked = kind in LINKED_KINDS and sharded
        for w in weights_for(rt, shipped, weights):
            for kv in (KV_DTYPES if sharded else (None,)):
                for tp, pp in widths(linked, runtime_unit(rt).pipelines, gpus_max, shapes):
                    for ep in ((False, True) if moe and tp > 1 else (False,)):
                        # its prefill and decode together, or on pools of their own
                        for split in shapes.split if linked and pp == 1 else (False,):
                            out.append(Config(device, rt, w, kv, tp, ep, pp=pp, disagg=split))
    return out


def widths(linked: bool, pipelines: bool, gpus_max: int | None,
           shapes: Shapes = Shapes()) -> list[tuple[int, int]]:
    """(tensor-parallel width, pipeline stages) of a replica: one device where they are not
    linked; else the shapes asked, up to one node's devices and `gpus_max`."""
    if not linked:
        return [(1, 1)] if 1 in shapes.tp and 1 in shapes.pp and False in shapes.split else []
    most = min(MOST_DEVICES, gpus_max or MOST_DEVICES)
    stages = shapes.pp if pipelines else tuple(p for p in shapes.pp if p == 1)
    return [(tp, pp) for pp in stages for tp in shapes.tp if tp * pp <= most]


def knob_variants(base: Config) -> list[Config]:
    """The base configuration with narrower scheduler limits (a batching server's; llama.cpp
    keeps its defaults)."""
    if not runtime_unit(base.runtime).shards_memory or base.disagg:
        return []
    return [replace(base, seq_share=s, token_share=t) for s, t in NARROWER]
