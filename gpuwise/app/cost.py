"""`gpuwise advise` and `gpuwise cost`: the workload, the assumptions and the candidates from
their flags, checked; then every option priced (advise) or one (cost). docs/cost.md."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.app.side_by_side import Progress, Workers
from gpuwise.catalog.costs import SITES, CostAssumptions, load_costs, with_overrides
from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.cost.advise import (
    ROWS_SHOWN,
    Advice,
    Job,
    Option,
    advise,
    price_options,
    runtime_list,
    serving_options,
    training_options,
)
from gpuwise.estimate.cost.option_search import Unsized
from gpuwise.estimate.cost.prices import api_cost
from gpuwise.estimate.cost.serving_sim import size_serving_simulated
from gpuwise.estimate.cost.sizing import Candidate, size_training
from gpuwise.files import file_type, shown
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.units import format_count, parse_fraction
from gpuwise.workload.deployments import ServeLoad, TrainLoad, check_load_options
from gpuwise.workload.limits import check_number
from gpuwise.workload.plans import InferencePlan, TrainingPlan

ASSUMPTION_FLAGS = {
    "electricity": "electricity_usd_per_kwh", "pue": "pue",
    "depreciation_years": "depreciation_years", "hosting_per_kw_month": "hosting_usd_per_kw_month",
    "ops_per_year": "ops_usd_per_device_year", "idle_power": "idle_power_fraction",
    "busy_power": "busy_power_fraction", "memory_power": "memory_power_fraction",
    "grid_co2": "grid_gco2_per_kwh",
    "reserved_discount": "reserved_discount", "host_power_fraction": "host_power_fraction",
    "host_price_fraction": "host_price_fraction",
}


# key -> (flag, the most it may be, whether 0 is allowed, the unit). A device lists at up to
# ~$70,000 and rents at up to ~$12/h on demand (B200, 2025), draws up to ~2,700 W (GB200
# superchip); the largest sites deliver ~1 GW; APIs charge $0.02-600 per million tokens.
PRICE_LIMITS = {
    "price": ("--price", 1e7, False, "USD per device"),
    "rate": ("--rate", 1e4, False, "USD per device-hour"),
    "local_price": ("--local-price", 1e7, True, "USD (0: already paid for)"),
    "local_power_w": ("--local-power-w", 1e5, False, "watts per device when busy"),
    "max_kw": ("--max-kw", 1e6, False, "kW your site can deliver at the wall"),
}
MAX_API_USD_PER_MTOK = 1e4
# ServeLoad / TrainLoad field -> the key of its flag.
LOAD_FLAGS = {
    "requests_per_day": "requests_per_day", "tokens_per_day": "tokens_per_day",
    "prompt_tokens": "prompt", "output_tokens": "output", "tpot_ms": "latency_ms",
    "ttft_ms": "ttft_ms", "hours_per_day": "hours_per_day", "tokens_per_month": "train_tokens",
    "hours_per_month": "hours_per_month", "deadline_hours": "deadline_hours",
}


@dataclass(frozen=True)
class Header:
    """What advise's and cost's answers open with: the model, the workload and the target."""

    model: str  # the model's name
    workload: ServeLoad | TrainLoad
    workload_kind: str  # inference | training
    target: str  # the target in words
    title: str  # the workload in a few words (cost: and the option)
    workload_text: str  # the workload in words, then the target


@dataclass(frozen=True)
class AdviceAnswer:
    header: Header
    advice: Advice
    assumptions: CostAssumptions
    training: bool


@dataclass(frozen=True)
class CostAnswer:
    header: Header
    option: Option
    assumptions: CostAssumptions
    training: bool


def candidate(hw: Hardware, price: float | None = None, rate: float | None = None,
              power_w: float | None = None) -> Candidate:
    """A device with the rates the time model uses on it (probe for this machine, else spec)."""
    if power_w is not None:
        hw = replace(hw, tdp_w=power_w)
    rates, how = rates_for(hw)
    label = f"this machine ({hw.name})" if hw.source == "detected" else ""
    return Candidate(hw, rates, how, price, rate, label, 1 if hw.source == "detected" else None)


def candidates(local: Hardware | None, local_price: float | None,
               local_power_w: float | None) -> list[Candidate]:
    """Every catalogue device with a price, and this machine; not a laptop GPU or an edge
    module (hardware.toml `form_factor`): `--on` names one where it is meant."""
    out = [candidate(hw) for hw in load_hardware()
           if (hw.list_price_usd or hw.cloud_usd_per_hour)
           and hw.form_factor not in ("laptop", "module")]
    if local is not None:
        out.insert(0, candidate(local, local_price, None, local_power_w))
    return out


def assumptions(kw: dict[str, Any]) -> CostAssumptions:
    site = kw.get("site")
    if site is not None and site not in SITES:
        raise GpuwiseError(f"--site {shown(repr(site))} is not a site",
                           f"choose one of: {', '.join(SITES)}")
    a = with_overrides(load_costs(), **{v: kw[k] for k, v in ASSUMPTION_FLAGS.items()})
    return replace(a, site=site)


def api_prices(text: str | None) -> tuple[float, float] | None:
    """'0.5,1.5' (input, output USD per million tokens) or '1.0' for both."""
    if text is None:
        return None
    hint = "e.g. --api-price-per-mtok 0.5,1.5 (USD per million tokens)"
    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise GpuwiseError(f"--api-price-per-mtok {shown(repr(text))} is not 'INPUT,OUTPUT' "
                           "prices", hint)
    for part in parts:
        check_number(part, "--api-price-per-mtok", MAX_API_USD_PER_MTOK, hint=hint)
    return (parts[0], parts[-1])


def check_options(kw: dict[str, Any]) -> None:
    """Every number the flags give, whether or not this workload uses it (a typo in a flag
    the answer ignores is still a typo): prices, powers, the load and the training plan."""
    for key, (flag, high, zero_ok, unit) in PRICE_LIMITS.items():
        check_number(kw.get(key), flag, high, zero_ok=zero_ok, hint=f"{flag}: {unit}")
    check_load_options(**{field: kw[key] for field, key in LOAD_FLAGS.items()})
    parse_fraction(kw["utilisation"], "utilisation")
    training_plan(kw)


def workload(kw: dict[str, Any]) -> ServeLoad | TrainLoad:
    """The inference or training load the flags describe (exactly one of them)."""
    serve = [k for k in ("requests_per_day", "tokens_per_day", "request_rate") if kw.get(k) is not None]
    train = [k for k in ("train_tokens", "hours_per_month") if kw[k] is not None]
    if (serve and train) or len(serve) > 1 or len(train) > 1:
        given = ", ".join("--" + k.replace("_", "-").replace("request-rate", "rate")
                          for k in serve + train)
        raise GpuwiseError(f"give one workload, not {given}",
                           "inference: --requests-per-day, --tokens-per-day or --rate; training: "
                           "--train-tokens or --hours-per-month")
    if not serve and not train:
        raise GpuwiseError("no workload given", "inference: --requests-per-day N (or "
                           "--tokens-per-day); training: --train-tokens N (or --hours-per-month)")
    measured = kw["measured_util"]
    mu = measured_utilisation(measured) if measured is not None else None
    if train:
        return TrainLoad(kw["train_tokens"], kw["hours_per_month"], kw["deadline_hours"], mu)
    common = {"tpot_ms": kw["latency_ms"], "ttft_ms": kw["ttft_ms"],
              "max_utilisation": parse_fraction(kw["utilisation"], "utilisation"),
              "hours_per_day": kw["hours_per_day"], "measured_util": mu}
    if kw["tokens_per_day"] is not None:
        return ServeLoad.from_tokens_per_day(kw["tokens_per_day"], kw["prompt"], kw["output"],
                                             **common)
    per_day = kw["requests_per_day"]
    if kw.get("request_rate") is not None:  # requests a second while the service runs
        check_number(kw["request_rate"], "--rate", 1e9)
        per_day = kw["request_rate"] * 3600 * kw["hours_per_day"]
    return ServeLoad(per_day, kw["prompt"], kw["output"], **common)


def measured_utilisation(text: str) -> float:
    """A busy share ('0.3', '30%'), or a `gpuwise watch` log: its mean GPU utilisation over
    the job's steps (the share of time a kernel ran, as nvidia-smi reports it)."""
    if file_type(text, "watch log") is None:  # a FIFO or a folder is read_log's to refuse
        return parse_fraction(shown(text), "measured utilisation")
    from gpuwise.estimate.watch.summary import summarize
    from gpuwise.measure.watch.log import read_log

    busy = summarize(read_log([text])).gpu_util_percent
    if busy is None:
        raise GpuwiseError(f"the watch log {shown(text)} has no GPU utilisation readings",
                           "a CPU-only job? pass the busy share itself, e.g. --measured-utilization 0.3")
    return parse_fraction(busy / 100, f"the GPU utilisation in {shown(text)}")


def training_plan(kw: dict[str, Any]) -> TrainingPlan:
    return TrainingPlan(batch=kw["batch"], seq=kw["seq"], dtype=kw["dtype"] or "mixed-bf16",
                        optimizer=kw["optimizer"], finetune=kw["finetune"],
                        lora_rank=kw["lora_rank"], checkpointing=kw["checkpointing"])


def _target(load: ServeLoad | TrainLoad) -> str:
    if isinstance(load, TrainLoad):
        return f"the month's tokens trained within {load.limit_hours:,.0f} h"
    parts = ([f"<= {load.tpot_ms:g} ms per output token"] if load.tpot_ms else []) + (
        [f"first token <= {load.ttft_ms:g} ms"] if load.ttft_ms else [])
    return ", ".join(parts) if parts else "the load (no latency target given)"


RUNTIME_AUTO = "vllm on GPUs and Gaudi, llama.cpp on CPUs and Macs"


def _header(model: ResolvedModel, load: ServeLoad | TrainLoad, kw: dict[str, Any]) -> Header:
    if isinstance(load, TrainLoad):
        amount = (f"{format_count(load.tokens_per_month)} tokens/month" if load.tokens_per_month
                  else f"{load.hours_per_month:g} h/month")
        text = (f"training {model.name}: {amount}, batch {kw['batch']} x seq {kw['seq']}, "
                f"{kw['dtype'] or 'mixed-bf16'}, {kw['optimizer']}, {kw['finetune']}")
    else:
        text = (f"serving {model.name}: {load.requests_per_day:,.0f} requests/day "
                f"({format_count(load.tokens_per_month)} tokens/month) of {load.prompt_tokens} "
                f"prompt + {load.output_tokens} generated tokens over {load.hours_per_day:g} "
                f"h/day; each replica at {load.max_utilisation:.0%} of the highest rate it "
                f"serves within the targets (simulated); runtime "
                f"{RUNTIME_AUTO if kw['runtime'] == 'auto' else kw['runtime']}")
    if load.measured_util is not None:
        text += f"; measured utilisation {load.measured_util:.0%}"
    return Header(model.name, load, "training" if isinstance(load, TrainLoad) else "inference",
                  _target(load), text.split(":")[0], f"{text}\ntarget: {_target(load)}")


def advise_options(kw: dict[str, Any], progress: Progress | None = None) -> AdviceAnswer:
    """Every option, priced, with the recommendation; the serving options sized side by
    side (a simulation each), `progress` told of each."""
    model, arch = model_named(kw["model"])
    a, load = assumptions(kw), workload(kw)
    check_options(kw)
    api = api_prices(kw["api_price_per_mtok"])
    cands = _considered(kw)
    skipped: list[tuple[str, str]] = []
    unsized: list[Unsized[Job]] = []
    limit = kw["max_kw"]
    if isinstance(load, TrainLoad):
        options = training_options(arch, training_plan(kw), load, cands, a, limit, skipped)
    else:
        with Workers("sizing option", progress) as workers:
            dep = deployment(model, kw)
            cands = _with_hosts(cands, dep)
            options = serving_options(arch, load, cands, a, dep.weights, kw["runtime"], api,
                                      limit, skipped, dep, workers.stream,
                                      None if kw["show_all"] else ROWS_SHOWN, unsized)
    if not options:
        why = "; ".join(f"{what}: {reason}" for what, reason in skipped[:3])
        raise GpuwiseError(f"{model.name} has no option for this workload"
                           + (f" ({why}{'; ...' if len(skipped) > 3 else ''})" if why else ""),
                           "try --weights int4, a shorter --prompt/--seq, or LoRA")
    result = advise(options, a, load.measured_util, _target(load), skipped, unsized)
    return AdviceAnswer(_header(model, load, kw), result, a, isinstance(load, TrainLoad))


def _considered(kw: dict[str, Any]) -> list[Candidate]:
    """The devices `--on` names (each with its rates), else every priced one and this machine."""
    if not kw.get("on"):
        local = hardware_named("local") if kw["local"] else None
        return candidates(local, kw["local_price"], kw["local_power_w"])
    out = []
    for name in (n.strip() for n in kw["on"].split(",") if n.strip()):
        local = name.lower() == "local"
        out.append(candidate(hardware_named(name), kw["local_price"] if local else None, None,
                             kw["local_power_w"] if local else None))
    return out


def deployment(model: ResolvedModel, kw: dict[str, Any]) -> InferencePlan:
    """The settings each option is run with, from the deployment options check, infer and
    serve take (app/deployment.py): the same builder, the runtime and weights set per option
    (its weights, where --weights is not given: the format the model ships in, else bf16)."""
    d = Deployment(runtime=_deployment_runtime(kw), kv_dtype=kw.get("kv_dtype"), ctx=kw.get("ctx"),
                   attention=kw.get("attention") or "sdpa",
                   gpu_memory_utilization=kw.get("gpu_memory_utilization"),
                   threads=kw.get("threads"), quant_kernel=kw.get("quant_kernel") or "",
                   gpu_layers=kw.get("gpu_layers"), weights=kw["weights"],
                   expert_parallel=bool(kw.get("expert_parallel")),
                   cpu_moe=bool(kw.get("cpu_moe")), n_cpu_moe=kw.get("n_cpu_moe"))
    return build_plan(model, d, Workload(1, kw["prompt"], kw["output"])).plan


def _with_hosts(cands: list[Candidate], dep: InferencePlan) -> list[Candidate]:
    """Each GPU with its host's CPU where llama.cpp runs layers or experts there (infer's)."""
    if dep.gpu_layers is None and not dep.cpu_moe_layers:
        return cands
    from gpuwise.app.infer import offload_host  # infer's machinery, only where it is needed

    return [replace(c, host=offload_host(dep, c.hw)) for c in cands]


def _deployment_runtime(kw: dict[str, Any]) -> str:
    """The runtime the deployment options are checked against: the one named, else vLLM
    (what GPUs serve with); llama.cpp's expert offload asks for llama.cpp by name."""
    named = [r for r in runtime_list(kw["runtime"]) if r != "auto"]
    if len(named) == 1:
        return named[0]
    if kw.get("cpu_moe") or kw.get("n_cpu_moe") is not None:
        flag = "--cpu-moe" if kw.get("cpu_moe") else "--n-cpu-moe"
        raise GpuwiseError(f"{flag} sizes llama.cpp servers, and --runtime is "
                           f"{kw['runtime']}", "give --runtime llama.cpp")
    return "vllm"


def _mode(kw: dict[str, Any]) -> str | None:
    chosen = [m for m in ("owned", "rent", "reserved") if kw[m]]
    if len(chosen) > 1:
        raise GpuwiseError("choose one of --owned, --rent, --reserved", "")
    return {"owned": "owned", "rent": "on-demand", "reserved": "reserved"}.get(
        chosen[0] if chosen else "")


def cost_option(kw: dict[str, Any]) -> CostAnswer:
    """One option: `--on` a device (owned, rented or reserved), or `--on api`."""
    model, arch = model_named(kw["model"])
    a, load = assumptions(kw), workload(kw)
    check_options(kw)
    header = _header(model, load, kw)
    if kw["on"].strip().lower() == "api":
        return CostAnswer(header, _api_option(load, kw), a, isinstance(load, TrainLoad))
    if len(runtime_list(kw["runtime"])) > 1:
        raise GpuwiseError("cost prices one option: give one --runtime",
                           f"`gpuwise advise ... --runtime {kw['runtime']}` compares them")
    hw = hardware_named(kw["on"])
    local = hw.source == "detected"
    cand = candidate(hw, kw["local_price"] if local else kw["price"], kw["rate"],
                     kw["local_power_w"] if local else None)
    if isinstance(load, TrainLoad):
        sizing = size_training(arch, training_plan(kw), load, cand)
    else:
        dep = deployment(model, kw)
        cand = _with_hosts([cand], dep)[0]
        sizing = size_serving_simulated(arch, load, cand, dep.weights, kw["runtime"], dep)
    if isinstance(sizing, str):
        raise GpuwiseError(f"no {model.name} option on {hw.name}: {sizing}",
                           f"see `gpuwise check {kw['model']} --on {kw['on']}`")
    options = price_options(sizing, a, kw["max_kw"])
    mode = _mode(kw) or (options[0].cost.mode if options else "owned")
    picked = [o for o in options if o.cost.mode == mode]
    if not picked:
        what = "purchase price" if mode == "owned" else "cloud price"
        raise GpuwiseError(f"{hw.name} has no {what} in the catalogue",
                           "pass --price USD (buy) or --rate USD/h (rent)")
    header = replace(header, title=f"{header.title} on {cand.name}, {mode}")
    return CostAnswer(header, picked[0], a, isinstance(load, TrainLoad))


def _api_option(load: ServeLoad | TrainLoad, kw: dict[str, Any]) -> Option:
    prices = api_prices(kw["api_price_per_mtok"])
    if prices is None or isinstance(load, TrainLoad):
        raise GpuwiseError("--on api needs an inference load and --api-price-per-mtok",
                           "gpuwise keeps no prices for named API vendors: give yours")
    return Option(None, api_cost(load.input_tokens_per_month, load.output_tokens_per_month,
                                 *prices, load.requests_per_month))
