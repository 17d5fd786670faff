"""`gpuwise plan`'s search (docs/plan.md, "The search"): the cheapest configuration whose fleet
meets the targets at the load, each candidate sized by advise's serving simulation
(estimate/cost/serving_sim.py) at its own tensor-parallel width and scheduler limits.

Pruned by bounds, never by guesses: a configuration whose weights do not fit is ruled out by
the memory estimate before any simulation; one a request alone misses the targets on is
ruled out by its engine's no-load latency; and one whose floor (its devices at the fewest
replicas the load needs at its rate ceiling, powered but idle: option_search.py) already
costs more than the best found is left unsized, with every narrower scheduler setting of it
(a narrower batch only lowers the ceiling). So the choice is the one an exhaustive search
over the same space finds (`exhaustive=True`; tests/test_plan_search.py). The devices and
runtimes with the cheapest floors (GROUPS_SIZED of them) are sized even past the bound, each
at its GROUP_TRIES cheapest floors, so that the runners-up can say why they lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from gpuwise.catalog.costs import CostAssumptions
from gpuwise.estimate.cost.advise import Option, floor_of, price_options
from gpuwise.estimate.cost.disaggregated import Pools, prepare_pools, size_pools
from gpuwise.estimate.cost.option_search import Floor
from gpuwise.estimate.cost.serving_sim import Prepared, prepare_serving, size_serving_simulated
from gpuwise.estimate.cost.sizing import Candidate, Sizing
from gpuwise.estimate.in_turn import Stream, one_by_one
from gpuwise.estimate.plan.space import Config, knob_variants
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.serve.replica import ReplicaOptions, no_load_latency
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan

Progress = Callable[[str, float], None]
# devices and runtimes sized past the bound, each at its cheapest floor, cheapest first: the
# runners-up that say why they lost (app/plan.py shows six beside the choice)
GROUPS_SIZED = 8
GROUP_TRIES = 3  # of each, its cheapest floors (the cheapest floor is not always the best)


@dataclass(frozen=True)
class Limits:
    """What the user caps: $ a month, devices in all."""

    budget_usd_per_month: float | None = None
    gpus_max: int | None = None

    def allows(self, cost: float, devices: int) -> bool:
        return ((self.budget_usd_per_month is None or cost <= self.budget_usd_per_month)
                and (self.gpus_max is None or devices <= self.gpus_max))


@dataclass(frozen=True)
class Evaluated:
    """A configuration sized: its fleet, its cheapest way to pay, whether it meets the
    targets within the limits."""

    config: Config
    sizing: Sizing
    option: Option
    allowed: bool

    @property
    def meets(self) -> bool:
        return self.option.meets and self.allowed

    @property
    def cost(self) -> float:
        return self.option.cost.usd_per_month

    @property
    def rank(self) -> tuple[float, int, float]:
        return (self.cost, self.sizing.devices, self.sizing.tpot_s or 0.0)


@dataclass
class Searched:
    """The search's record: every configuration sized, those ruled out and why, and how
    many the bound left unsized."""

    evaluated: list[Evaluated] = field(default_factory=list)
    refused: list[tuple[Config, str]] = field(default_factory=list)
    unsized: int = 0
    considered: int = 0

    @property
    def best(self) -> Evaluated | None:
        meeting = [e for e in self.evaluated if e.meets]
        return min(meeting, key=lambda e: e.rank) if meeting else None


@dataclass(frozen=True)
class Problem:
    """One search's fixed inputs."""

    arch: Architecture
    load: ServeLoad
    deployment: InferencePlan  # the options given (context, attention...), each config's base
    candidates: dict[str, Candidate]  # by device id
    assumptions: CostAssumptions
    limits: Limits = Limits()
    max_wall_kw: float | None = None


def search(p: Problem, bases: list[Config], exhaustive: bool = False,
           stream: Stream[Config, Evaluated | str] = one_by_one,
           progress: Progress | None = None) -> Searched:
    """The cheapest configuration meeting the targets within the limits, of `bases` and their
    narrower scheduler settings (space.py); every one sized where `exhaustive`. `stream`
    sizes the configurations it is handed, in turn or side by side, each chosen once the
    results before it are in. Two passes: the bases, cheapest floor first; then the narrower
    settings of those that missed the targets (a fleet that meets them at the defaults is
    not made cheaper by a narrower batch: as many devices or more, as busy or busier)."""
    global _PROBLEM
    _PROBLEM = p  # read by the sizing in this process and in the workers it forks
    out = Searched(considered=len(bases) + sum(len(knob_variants(c)) for c in bases))
    floors: dict[Config, Floor | str] = {}
    for i, cfg in enumerate(bases):
        if progress:
            progress(f"memory and bounds {i + 1} of {len(bases)}", 0.2 * i / len(bases))
        floors[cfg] = _floor(p, cfg)
    order = sorted(bases, key=lambda c: _floor_cost(floors[c]))
    out.refused += [(c, f) for c in order if isinstance(f := floors[c], str)]
    state = _State(p, exhaustive, out, len(order), progress)
    state.take(stream(_size, state.bases(order, floors)))
    state.take(stream(_size, state.variants(floors)))
    return out


_PROBLEM: Problem | None = None


def _size(cfg: Config) -> Evaluated | str:
    assert _PROBLEM is not None, "search() sets the problem before sizing"
    return _evaluate(_PROBLEM, cfg)


class _State:
    """The search as it goes: the best cost found, the devices and runtimes sized, and each
    base's result (for its narrower settings)."""

    def __init__(self, p: Problem, exhaustive: bool, out: Searched, total: int,
                 progress: Progress | None) -> None:
        self.p, self.exhaustive, self.out = p, exhaustive, out
        self.best = float("inf")
        self.groups: dict[tuple[str, str], int] = {}  # configurations sized past the bound
        self.sized: dict[Config, Evaluated] = {}
        self.total, self.done, self.progress = total, 0, progress

    def worth(self, f: Floor) -> bool:
        return self.exhaustive or _worth(self.p, f, self.best)

    def bases(self, order: list[Config], floors: dict[Config, Floor | str]) -> Iterator[Config]:
        """Each base within the bound, and the cheapest of the first GROUPS_SIZED devices and
        runtimes (for why they lost); the others counted unsized with their narrower
        settings."""
        for cfg in order:
            f = floors[cfg]
            if isinstance(f, str):
                continue
            group = (cfg.device, cfg.runtime)
            if self.worth(f):
                yield cfg
            elif self._past_bound(group):
                self.groups[group] = self.groups.get(group, 0) + 1
                yield cfg
            else:
                self.out.unsized += 1 + len(knob_variants(cfg))

    def _past_bound(self, group: tuple[str, str]) -> bool:
        """Whether to size one more of a device and runtime's configurations past the bound:
        its first GROUP_TRIES, for the first GROUPS_SIZED."""
        if group in self.groups:
            return self.groups[group] < GROUP_TRIES
        return len(self.groups) < GROUPS_SIZED

    def variants(self, floors: dict[Config, Floor | str]) -> Iterator[Config]:
        for base, e in list(self.sized.items()):
            f = floors[base]
            if isinstance(f, str) or not self.worth(f):
                self.out.unsized += len(knob_variants(base))
                continue
            if e.meets and not self.exhaustive:  # narrower limits help a fleet that misses
                self.out.unsized += len(knob_variants(base))
                continue
            for v in knob_variants(base):
                fv = _floor(self.p, v)
                if isinstance(fv, str):
                    self.out.refused.append((v, fv))
                elif self.worth(fv):
                    yield v
                else:
                    self.out.unsized += 1

    def take(self, results: Iterator[tuple[Config, Evaluated | str]]) -> None:
        for cfg, e in results:
            self.done += 1
            if self.progress:
                self.progress(f"sized {self.done}", min(0.99, 0.2 + 0.8 * self.done /
                                                        max(1, self.total)))
            if isinstance(e, str):
                self.out.refused.append((cfg, e))
                continue
            self.out.evaluated.append(e)
            if cfg == cfg.base:
                self.sized[cfg] = e
            if e.meets:
                self.best = min(self.best, e.cost)


def _worth(p: Problem, f: Floor, best: float) -> bool:
    cost = f.usd_per_month
    if p.limits.gpus_max is not None and f.devices > p.limits.gpus_max:
        return False
    if p.limits.budget_usd_per_month is not None and cost > p.limits.budget_usd_per_month:
        return False
    return cost <= best


def knobs_for(p: Problem, cfg: Config) -> ReplicaOptions:
    """The replica options of a configuration: its width and its scheduler limits."""
    cand = p.candidates[cfg.device]
    sched = runtime_unit(cfg.runtime).scheduler_on(cand.hw)
    seqs = max(1, round(sched.max_seqs * cfg.seq_share)) if cfg.seq_share != 1.0 else None
    tokens = (max(256, round(sched.max_batched_tokens * cfg.token_share))
              if cfg.token_share != 1.0 else None)
    return ReplicaOptions(tp=cfg.tp, pp=cfg.pp, max_seqs=seqs, max_batched_tokens=tokens)


def _deployment(p: Problem, cfg: Config) -> InferencePlan:
    return replace(p.deployment, kv_dtype=cfg.kv_dtype, expert_parallel=cfg.expert_parallel)


def prepared_for(p: Problem, cfg: Config) -> Prepared | str:
    """An aggregated configuration's replica made ready to size (its engine: a pipeline's,
    one of its batches in flight), or why it cannot run."""
    return prepare_serving(p.arch, p.load, p.candidates[cfg.device], cfg.weights, cfg.runtime,
                           _deployment(p, cfg), knobs_for(p, cfg))


def pools_for(p: Problem, cfg: Config) -> Pools | str:
    """A disaggregated configuration's two pools, or why it cannot run."""
    return prepare_pools(p.arch, p.load, p.candidates[cfg.device], cfg.weights, cfg.runtime,
                         _deployment(p, cfg), knobs_for(p, cfg))


def _floor(p: Problem, cfg: Config) -> Floor | str:
    """The configuration's floor (advise's: option_search.py), or why it cannot run or meet
    the targets at all."""
    cand = p.candidates[cfg.device]
    if cfg.disagg:
        return _pools_floor(p, cfg)
    prep = prepared_for(p, cfg)
    if isinstance(prep, str):
        return prep
    ttft, tpot = no_load_latency(prep.engine, p.load.prompt_tokens, p.load.output_tokens)
    return _alone(p, ttft, tpot) or floor_of(cand, prep, p.load, p.assumptions, p.max_wall_kw)


def _pools_floor(p: Problem, cfg: Config) -> Floor | str:
    """A disaggregated configuration's floor: both pools' fewest devices; or why a request
    alone misses (its prefill, the transfer and a decode step)."""
    cand = p.candidates[cfg.device]
    pools = pools_for(p, cfg)
    if isinstance(pools, str):
        return pools
    ttft_p = no_load_latency(pools.prefill, p.load.prompt_tokens, 1)[0]
    tpot = no_load_latency(pools.decode, p.load.prompt_tokens, p.load.output_tokens)[1]
    why = _alone(p, ttft_p + pools.transfer_s + tpot, tpot)
    return why or floor_of(cand, pools.prepared, p.load, p.assumptions, p.max_wall_kw)


def _alone(p: Problem, ttft: float, tpot: float) -> str:
    """Why a request alone misses a target ("" where it meets them)."""
    if p.load.tpot_ms is not None and tpot * 1e3 > p.load.tpot_ms:
        return f"a request alone takes {tpot * 1e3:.1f} ms a token, over {p.load.tpot_ms:g}"
    if p.load.ttft_ms is not None and ttft * 1e3 > p.load.ttft_ms:
        return f"a request alone takes {ttft * 1e3:,.0f} ms to its first token, over " \
               f"{p.load.ttft_ms:g}"
    return ""


def _floor_cost(f: Floor | str) -> float:
    return float("inf") if isinstance(f, str) else f.usd_per_month


def _evaluate(p: Problem, cfg: Config) -> Evaluated | str:
    cand = p.candidates[cfg.device]
    if cfg.disagg:
        pools = pools_for(p, cfg)
        sizing = pools if isinstance(pools, str) else size_pools(p.arch, p.load, cand, pools)
    else:
        sizing = size_serving_simulated(p.arch, p.load, cand, cfg.weights, cfg.runtime,
                                        _deployment(p, cfg), knobs_for(p, cfg))
    if isinstance(sizing, str):
        return sizing
    options = price_options(sizing, p.assumptions, p.max_wall_kw)
    if not options:
        return f"{cfg.device} has no price"
    option = min(options, key=lambda o: o.cost.usd_per_month)
    return Evaluated(cfg, sizing, option, p.limits.allows(option.cost.usd_per_month,
                                                          sizing.devices))
