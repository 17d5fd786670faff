"""`gpuwise plan`: search the deployment space for a model and a load, and hand back the
command to run (docs/plan.md). The search is estimate/plan/; the command, workload/launch.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from gpuwise.app.cost import assumptions, candidate, candidates
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.app.plan_command import PlanCommand, plan_command
from gpuwise.app.plan_load import AskedLoad, asked_load, at_asked_load
from gpuwise.app.plan_runs import at_rate, replica_engine, speed_points
from gpuwise.app.side_by_side import Progress, Workers
from gpuwise.catalog.formats import shipped_weights, weight_format
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.cost.advise import runtime_list
from gpuwise.estimate.cost.sizing import Candidate
from gpuwise.estimate.plan.closed_loop import LoadRun
from gpuwise.estimate.plan.frontier import SpeedPoint, cost_frontier, speed_frontier
from gpuwise.estimate.plan.search import Evaluated, Limits, Problem, Searched, search
from gpuwise.estimate.plan.space import Shapes, base_configs
from gpuwise.estimate.serve.metrics import ServeSummary
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad

RUNNERS_UP = 6  # devices and runtimes shown beside the choice


@dataclass(frozen=True)
class PlanAnswer:
    model: ResolvedModel
    arch: Architecture
    load: ServeLoad  # the rate the search sized at
    # the search's record; at clients or a trace its cheapest configurations re-simulated there
    found: Searched
    at_load: ServeSummary | None  # the choice's fleet re-simulated at the load itself
    runners_up: tuple[tuple[Evaluated, str], ...]  # the next devices and runtimes, and why
    speed_frontier: tuple[SpeedPoint, ...]
    cost_frontier: tuple[Evaluated, ...]
    command: str
    snippet: str
    command_note: str
    seconds: float
    asked: AskedLoad | None = None  # the load as given: a rate, clients or a trace
    # the re-simulation at the load asked (one replica's run is `at_load`)
    load_run: LoadRun | None = None
    chosen: Evaluated | None = None  # the fleet to run (`found.best`)
    speed_points: tuple[SpeedPoint, ...] = ()  # every knee the speed frontier was drawn from

    @property
    def best(self) -> Evaluated | None:
        return self.found.best


def plan(kw: dict[str, Any], progress: Progress | None = None) -> PlanAnswer:
    start = time.perf_counter()
    model, arch = model_named(kw["model"])
    asked = asked_load(kw)
    load = asked.load
    cands = _devices(kw)
    dep = build_plan(model, Deployment(runtime="vllm", ctx=kw.get("ctx")),
                     Workload(1, kw["prompt"], kw["output"])).plan
    shipped = shipped_weights(model.config)
    for w in _names(kw, "weights"):
        weight_format(w)  # "did you mean" where unknown
    runtime_list(kw.get("runtime") or "auto")  # "did you mean" where unknown
    shapes = _shapes(kw)
    bases = [c for cand in cands.values()
             for c in base_configs(arch, cand.hw.id, cand.hw.kind, shipped,
                                   _names(kw, "runtime"), _names(kw, "weights"),
                                   kw.get("gpus_max"), shapes)]
    if not bases:
        raise GpuwiseError("no configuration to search",
                           "check --on, --runtime, --weights, --tp, --pp and --prefill-decode")
    p = Problem(arch, load, replace(dep, weights="bf16", stored_weights=None), cands,
                assumptions(kw), Limits(kw.get("budget"), kw.get("gpus_max")), kw.get("max_kw"))
    with Workers("configuration", progress) as workers:
        found = search(p, bases, stream=workers.stream, progress=progress)
    at_load, run = None, None
    if found.best is not None and asked.kind == "rate":
        at_load, run = at_rate(p, found.best) or (None, None)
    elif found.best is not None:  # re-simulated at the clients or the trace, grown to meet it
        resim = at_asked_load(asked, p, found, lambda e: replica_engine(p, e))
        if resim is not None:
            found, at_load, run = resim
    best = found.best
    run_it = plan_command(model, best) if best else PlanCommand("", "", "")
    command, snippet, note = run_it.command, run_it.snippet, run_it.note
    costs = tuple(cost_frontier(found.evaluated))
    points = tuple(speed_points(p, found, costs))
    return PlanAnswer(model, arch, load, found, at_load, _runners_up(found),
                      tuple(speed_frontier(points)), costs, command,
                      snippet, note, time.perf_counter() - start, asked, run, best, points)


def _names(kw: dict[str, Any], key: str) -> tuple[str, ...]:
    """A comma list option's names (none: search every one)."""
    return tuple(n.strip() for n in (kw.get(key) or "").split(",") if n.strip())


SPLITS = {"both": (False, True), "aggregated": (False,), "disaggregated": (True,)}


def _shapes(kw: dict[str, Any]) -> Shapes:
    """The replica shapes asked: --tp and --pp comma lists of widths, --prefill-decode."""
    split = (kw.get("prefill_decode") or "both").strip().lower()
    if split not in SPLITS:
        raise GpuwiseError(f"--prefill-decode {split!r} is not one of " + ", ".join(SPLITS),
                           "both (the default) searches each")
    default = Shapes()
    return Shapes(_widths(kw, "tp", default.tp), _widths(kw, "pp", default.pp), SPLITS[split])


def _widths(kw: dict[str, Any], key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    names = _names(kw, key)
    try:
        widths = tuple(int(n) for n in names)
    except ValueError:
        widths = ()
    if names and (not widths or any(w not in default for w in widths)):
        raise GpuwiseError(f"--{key} takes {', '.join(map(str, default))}, a comma list, not "
                           f"{kw.get(key)!r}", f"e.g. --{key} 2,4")
    return widths or default


def _devices(kw: dict[str, Any]) -> dict[str, Candidate]:
    if kw.get("on"):
        found = [candidate(hardware_named(n.strip())) for n in kw["on"].split(",") if n.strip()]
    else:
        found = candidates(None, None, None)
    return {c.hw.id: c for c in found}


def _runners_up(found: Searched) -> tuple[tuple[Evaluated, str], ...]:
    """Each device and runtime's best configuration after the choice's, with why it lost."""
    best = found.best
    groups: dict[tuple[str, str], Evaluated] = {}
    for e in found.evaluated:
        key = (e.config.device, e.config.runtime)
        if key not in groups or (e.meets, -e.cost) > (groups[key].meets, -groups[key].cost):
            groups[key] = e
    if best is not None:
        groups.pop((best.config.device, best.config.runtime), None)
    out = []
    for e in sorted(groups.values(), key=lambda e: (not e.meets, e.cost))[:RUNNERS_UP]:
        out.append((e, _why(e, best)))
    return tuple(out)


def _why(e: Evaluated, best: Evaluated | None) -> str:
    if not e.allowed:
        return "over the budget or the device limit"
    if not e.option.meets:
        return "misses " + ", ".join(e.option.misses or ("the targets",))
    if best is None:
        return ""
    more = e.cost - best.cost
    return f"costs ${more:,.0f}/month more (+{more / max(best.cost, 1e-9):.0%})"


