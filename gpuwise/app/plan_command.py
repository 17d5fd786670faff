"""What `gpuwise plan` hands back to run (docs/plan.md, "The command to run"): the chosen
configuration as the server's command line, a Kubernetes Deployment where it runs as several
replicas, and a note where the command needs a file or checkpoint gpuwise cannot name. A
disaggregated choice is two pools, each its own command and Deployment (`role`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.formats import shipped_weights, weight_format
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.plan.search import Evaluated
from gpuwise.workload.launch import Launch, command_line, replicas_snippet

ROUTER_NOTE = ("a router in front that sends each request to a prefill server, then with its KV "
               "cache to a decode server (vLLM's disaggregated proxy, SGLang's router with "
               "--pd-disaggregation, NVIDIA Dynamo)")


@dataclass(frozen=True)
class PlanCommand:
    command: str  # one line a server (a pool: two, prefill first)
    snippet: str  # the Deployment(s), where a pool has several replicas
    note: str


def plan_command(model: ResolvedModel, e: Evaluated) -> PlanCommand:
    c, sizing = e.config, e.sizing
    hub = model.entry.hf_id if model.entry else model.name
    gguf = weight_format(c.weights).gguf
    launch = Launch(model=hub, runtime=c.runtime, tp=c.tp, pp=c.pp,
                    expert_parallel=c.expert_parallel, replicas=sizing.replicas,
                    weights=c.weights, checkpoint=shipped_weights(model.config) or "bf16",
                    kv_dtype=c.kv_dtype,
                    gguf_file=f"{hub.split('/')[-1]}-{c.weights}.gguf" if gguf else None,
                    gpu_layers=99 if gguf else None)
    note = f"the {c.weights} GGUF file of {hub}: convert it or download one" if gguf else ""
    try:
        command_line(launch)
    except GpuwiseError:  # a format the server does not make as it loads: its own checkpoint
        launch = replace(launch, checkpoint=c.weights)
        note = f"a {c.weights} checkpoint of {hub} (an AWQ or GPTQ export): give its hub id"
    if not sizing.prefill_replicas:
        return PlanCommand(command_line(launch),
                           replicas_snippet(launch) if sizing.replicas > 1 else "", note)
    pools = [replace(launch, role="prefill", replicas=sizing.prefill_replicas),
             replace(launch, role="decode", replicas=sizing.replicas - sizing.prefill_replicas)]
    return PlanCommand("\n".join(command_line(p) for p in pools),
                       "---\n".join(replicas_snippet(p) for p in pools),
                       "; ".join(n for n in (note, ROUTER_NOTE) if n))
