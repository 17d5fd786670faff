"""Should I use a GPU at all, and rent or buy? A workload turned into priced options and a
recommendation with its reasons. Pure: the caller passes the candidates and their rates."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from gpuwise.catalog.costs import CostAssumptions, at_site
from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.catalog.thresholds import advise_thresholds
from gpuwise.estimate.cost.option_search import Floor, Priced, Unsized, sized_cheapest_first
from gpuwise.estimate.cost.prices import (
    OptionCost,
    Usage,
    api_cost,
    break_even_utilisation,
    owned_cost,
    rent_cost,
)
from gpuwise.estimate.cost.serving_sim import Prepared, prepare_serving, size_serving_simulated
from gpuwise.estimate.cost.sizing import Candidate, Sizing, size_training
from gpuwise.estimate.in_turn import Stream, one_by_one
from gpuwise.units import HOURS_PER_MONTH
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad, TrainLoad
from gpuwise.workload.plans import InferencePlan, TrainingPlan

CPU_WEIGHTS = ("int8", "int4")  # what a CPU serves an LLM in (llama.cpp's q8_0 and q4_0)


def cpu_weights(asked: str) -> tuple[str, ...]:
    """The weights CPUs are sized at: a GGUF type asked for (q4_k_m) as asked, else int8 and
    int4 (no one serves a language model from a CPU in fp32 or bf16)."""
    return (asked,) if weight_format(asked).other_bits else CPU_WEIGHTS


@dataclass(frozen=True)
class Option:
    """One way to run the workload, priced."""

    sizing: Sizing | None  # None for the hosted API
    cost: OptionCost
    break_even: float | None = None  # buy-vs-rent break-even share of hours for this device
    power_ratio: float = 0.0  # owned: wall kW / the site's limit (0: no limit given)

    @property
    def meets(self) -> bool:
        return bool(self.sizing and self.sizing.meets) and self.power_ratio <= 1

    @property
    def misses(self) -> tuple[str, ...]:
        over = ("site power",) if self.power_ratio > 1 else ()
        return (self.sizing.misses if self.sizing else ()) + over

    @property
    def miss_ratio(self) -> float:
        """Estimate / target of the worst-missed target (<= 1: every target met)."""
        return max(self.sizing.miss_ratio if self.sizing else 0.0, self.power_ratio)

    @property
    def kind(self) -> str:
        return self.sizing.candidate.hw.kind if self.sizing else "api"

    @property
    def label(self) -> str:
        if self.sizing is None:
            return "hosted API"
        s = self.sizing
        return f"{s.devices}x {s.candidate.name} {s.precision} {self.cost.mode}"


@dataclass(frozen=True)
class Advice:
    options: tuple[Option, ...]  # meeting the target first, then by cost per month
    choice: Option | None
    reasons: tuple[str, ...]
    closest: tuple[Option, ...]  # when nothing meets the target
    skipped: tuple[tuple[str, str], ...] = ()  # (candidate, why it has no option)
    # (candidate, the least it can cost a month): not sized, as no option of it could
    # change the options shown or the reasons (option_search.py)
    unsized: tuple[tuple[str, float], ...] = ()


def price_options(sizing: Sizing, a: CostAssumptions,
                  max_wall_kw: float | None = None) -> list[Option]:
    """Owned (when it has a price or is this machine), on demand and reserved (when rented).
    `max_wall_kw`, the power the user's site can deliver, limits owned hardware only."""
    cand, hw, usage = sizing.candidate, sizing.candidate.hw, sizing.usage
    price = hw.list_price_usd if cand.price_usd is None else cand.price_usd
    rate = hw.cloud_usd_per_hour if cand.rate_usd_per_hour is None else cand.rate_usd_per_hour
    site = a.site or hw.site
    here = at_site(a, site)  # an owned device's costs where it runs
    even = break_even_utilisation(hw, here, price, rate)
    out = []
    if price > 0 or hw.source == "detected":
        owned = owned_cost(hw, usage, here, price)
        if site == "home":
            owned = replace(owned, notes=(*owned.notes, (
                f"costed at home: PUE {here.pue:g}, hosting ${here.hosting_usd_per_kw_month:g}/kW-"
                f"month, electricity ${here.electricity_usd_per_kwh:g}/kWh (--site)")))
        if price <= 0:  # this machine: already bought
            note = "already owned: purchase price not counted (pass --local-price)"
            owned = replace(owned, notes=(*owned.notes, note))
        ratio = (owned.wall_kw or 0.0) / max_wall_kw if max_wall_kw else 0.0
        out.append(Option(sizing, owned, even, ratio))
    if rate > 0:
        out.append(Option(sizing, rent_cost(hw, usage, a, False, rate), even))
        out.append(Option(sizing, rent_cost(hw, usage, a, True, rate), even))
    return out


Skipped = list[tuple[str, str]]
ROWS_SHOWN = 15  # options advise's table shows (all with --all); the search sizes for these
Job = tuple[Candidate, str, str]  # a candidate, its weights, its runtime


def serving_options(arch: Architecture, load: ServeLoad, candidates: list[Candidate],
                    a: CostAssumptions, weights: str = "bf16", runtime: str = "auto",
                    api_usd_per_mtok: tuple[float, float] | None = None,
                    max_wall_kw: float | None = None, skipped: Skipped | None = None,
                    deployment: InferencePlan | None = None,
                    stream: Stream[tuple[int, Job], Sizing | str] = one_by_one,
                    rows: int | None = None, unsized: list[Unsized[Job]] | None = None,
                    ) -> list[Option]:
    """Every candidate that fits, at `weights` (CPUs: `cpu_weights`), priced; the
    others go to `skipped` with the reason. `stream` runs the sizings (a few simulations
    each), in turn or side by side. `rows`: size only what can change the `rows` cheapest options that meet the
    targets and the reasons (option_search.py), the others to `unsized` with their floors;
    None: size every one."""
    runtimes = runtime_list(runtime)
    jobs = [(cand, fmt, rt) for cand in candidates for rt in runtimes
            for fmt in (cpu_weights(weights) if cand.hw.kind == "cpu" else (weights,))]
    ready = [prepare_serving(arch, load, c, fmt, rt, deployment) for c, fmt, rt in jobs]
    floors = [None if isinstance(p, str) else floor_of(j[0], p, load, a, max_wall_kw)
              for j, p in zip(jobs, ready, strict=True)]
    size = partial(_size_job, arch, load, deployment)
    priced_of = partial(_priced, a=a, max_wall_kw=max_wall_kw)
    done, left = sized_cheapest_first(jobs, floors, rows, size, priced_of, stream)
    options: list[Option] = []
    for i, (cand, fmt, rt) in enumerate(jobs):
        sizing = done.get(i)
        if isinstance(sizing, str) and skipped is not None:
            under = f" ({rt})" if len(runtimes) > 1 else ""
            skipped.append((f"{cand.name} {fmt}{under}", sizing))
        elif isinstance(sizing, Sizing):
            options += price_options(sizing, a, max_wall_kw)
    if unsized is not None:
        unsized += left
    if api_usd_per_mtok is not None:
        cost = api_cost(load.input_tokens_per_month, load.output_tokens_per_month,
                        *api_usd_per_mtok, load.requests_per_month)
        options.append(Option(None, cost))
    return options


def floor_of(cand: Candidate, prep: Prepared, load: ServeLoad, a: CostAssumptions,
           max_wall_kw: float | None) -> Floor:
    """The fewest devices the candidate's sizing can have, at the least they cost: powered,
    idle, for the service's hours (each cost grows with devices and busy hours)."""
    usage = Usage(prep.devices_floor, 0.0, load.service_hours_per_month, 0.0)
    sizing = Sizing(cand, "", prep.plan.tp, prep.replicas_floor, 1, usage, False, (), 0.0)
    cost = min(o.cost.usd_per_month for o in price_options(sizing, a, max_wall_kw))
    return Floor(prep.devices_floor, cost, cand.hw.kind == "cpu")


def _priced(sizing: Sizing | str, a: CostAssumptions,
            max_wall_kw: float | None) -> list[Priced]:
    if isinstance(sizing, str):
        return []
    return [Priced(o.meets, sizing.devices, o.cost.usd_per_month, o.kind == "cpu")
            for o in price_options(sizing, a, max_wall_kw)]


def runtime_list(runtime: str) -> tuple[str, ...]:
    """`--runtime` as a list: one name, `auto`, or several compared side by side
    (`vllm,sglang,llama.cpp`), each checked."""
    names = tuple(dict.fromkeys(n.strip() for n in runtime.split(",") if n.strip()))
    for name in names:
        if name != "auto":
            runtime_speed(name)  # "did you mean" where unknown
    return names or ("auto",)


def _size_job(arch: Architecture, load: ServeLoad, deployment: InferencePlan | None,
              job: tuple[Candidate, str, str]) -> Sizing | str:
    cand, fmt, runtime = job
    return size_serving_simulated(arch, load, cand, fmt, runtime, deployment)


def training_options(arch: Architecture, plan: TrainingPlan, load: TrainLoad,
                     candidates: list[Candidate], a: CostAssumptions,
                     max_wall_kw: float | None = None,
                     skipped: Skipped | None = None) -> list[Option]:
    """Every candidate the plan fits on, priced; the others go to `skipped` with the reason."""
    options: list[Option] = []
    for cand in candidates:
        sizing = size_training(arch, plan, load, cand)
        if isinstance(sizing, str) and skipped is not None:
            skipped.append((cand.name, sizing))
        elif not isinstance(sizing, str):
            options += price_options(sizing, a, max_wall_kw)
    return options


def _order(options: list[Option]) -> tuple[Option, ...]:
    return tuple(sorted(options, key=lambda o: (not o.meets, o.cost.usd_per_month)))


def advise(options: list[Option], a: CostAssumptions, measured_util: float | None = None,
           target: str = "the load", skipped: Skipped | None = None,
           unsized: list[Unsized[Job]] | None = None) -> Advice:
    """The cheapest option that meets the target, and why; the closest ones when none does."""
    ordered = _order(options)
    left = tuple((f"{u.job[0].name} {u.job[1]}", u.floor.usd_per_month) for u in unsized or ())
    meeting = [o for o in ordered if o.meets]
    reasons: list[str] = []
    # Below `pipeline_util`, measured while a job runs, the chip mostly waits for its input.
    if measured_util is not None and measured_util < advise_thresholds().pipeline_util:
        reasons.append(_pipeline_reason(measured_util))
    if not meeting:
        hardware = [o for o in ordered if o.sizing is not None]
        closest = sorted(hardware, key=lambda o: (o.miss_ratio, o.cost.usd_per_month))[:3]
        reasons.insert(0, f"no option meets the target ({target}); the three closest (smallest "
                          "estimate / target) are listed")
        return Advice(ordered, None, tuple(reasons), tuple(closest), tuple(skipped or ()), left)
    best = meeting[0]
    reasons.insert(0, f"cheapest option that meets the target ({target}): {best.label}, "
                      f"${best.cost.usd_per_month:,.0f}/month")
    reasons += _smallest_reason(meeting, best) + _cpu_reason(meeting, best)
    reasons += _rent_or_buy_reasons(best, a) + _api_reason(ordered, best)
    return Advice(ordered, best, tuple(reasons), (), tuple(skipped or ()), left)


def _pipeline_reason(mu: float) -> str:
    target = advise_thresholds().target_util  # what a well-fed job reaches
    return (f"your measured utilisation is {mu:.0%} (from `gpuwise watch`): the chip waits for "
            f"its input {1 - mu:.0%} of the time, so the data pipeline is the problem, not the "
            f"chip; fed at {target:.0%} the same work needs {target / mu:.1f}x fewer "
            "device-hours. Fix the input pipeline (loader workers, prefetching, pinned memory, "
            "faster storage) before buying more compute")


def _smallest_reason(meeting: list[Option], best: Option) -> list[str]:
    def size(o: Option) -> tuple[int, float]:
        return (o.sizing.devices if o.sizing else 0, o.cost.usd_per_month)

    hardware = [o for o in meeting if o.sizing is not None]
    if not hardware:
        return []
    smallest = min(hardware, key=size)
    if best.sizing is None or size(smallest)[0] < size(best)[0]:
        kw = f", {smallest.cost.wall_kw:.2f} kW at the wall" if smallest.cost.wall_kw else ""
        return [f"smallest deployment that meets it: {smallest.label}{kw}, "
                f"${smallest.cost.usd_per_month:,.0f}/month"]
    return []


def _cpu_reason(meeting: list[Option], best: Option) -> list[str]:
    cpus = [o for o in meeting if o.kind == "cpu"]
    if not cpus:
        return ["no CPU option meets it: use an accelerator"]
    if best.kind == "cpu":
        return [f"a CPU suffices ({best.label}): no GPU is needed at this load"]
    cpu = cpus[0]
    return [f"a CPU also meets it ({cpu.label}, ${cpu.cost.usd_per_month:,.0f}/month) but "
            f"costs more than {best.label}"]


def _rent_or_buy_reasons(best: Option, a: CostAssumptions) -> list[str]:
    s = best.sizing
    if s is None or best.break_even is None:
        return []
    used = s.usage.held_hours / HOURS_PER_MONTH
    even, name = best.break_even, s.candidate.name
    if even > 1:
        rule = f"renting {name} costs less than owning it even if busy every hour"
    elif used < even:
        rule = (f"rent: the workload holds each {name} {_share(used)} of the month's hours, below "
                f"the buy-vs-rent break-even of {even:.0%}")
    else:
        rule = (f"buy: the service holds each {name} {_share(used)} of the month's hours (busy "
                f"{_share(s.usage.busy_hours / max(s.usage.held_hours, 1e-9))} of them), above the "
                f"buy-vs-rent break-even of "
                f"{even:.0%}")
    reserved = (f"a reservation beats on-demand above {1 - a.reserved_discount:.0%} of the "
                f"hours (discount {a.reserved_discount:.0%})")
    return [rule, reserved]


def _share(x: float) -> str:
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def _api_reason(ordered: tuple[Option, ...], best: Option) -> list[str]:
    api = [o for o in ordered if o.sizing is None]
    if not api:
        return []
    cost = api[0].cost.usd_per_month
    if cost < best.cost.usd_per_month:
        return [f"the hosted API at your price costs ${cost:,.0f}/month, less than "
                f"{best.label}; its latency is the vendor's and is not checked here"]
    return [f"the hosted API at your price costs ${cost:,.0f}/month, more than {best.label}"]
