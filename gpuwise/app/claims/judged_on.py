"""What a claim's verdict was judged on, in one place: the runtime people use for each phase on
this machine's device (`runtime_for`: llama.cpp for inference on a CPU or a Mac, vLLM on an
NVIDIA or AMD GPU, transformers for training; catalog/data/claims.toml `runtime_people_use`),
and the rates the numbers rest on (timed by the experiment itself, a probe profile with or
without the runtime's own costs, the datasheet), with the probe that would make the verdict
firmer. Each ClaimResult carries one `JudgedOn` (result.py); the views print it beside the
verdict."""

from __future__ import annotations

from gpuwise.app.claims.machine_rates import LocalRates
from gpuwise.app.claims.result import NAMES, RatesUsed, RuntimeUse
from gpuwise.catalog.claims import PeopleRun, runtime_people_use
from gpuwise.estimate.runtimes import runtime_unit

# Inference, where the catalogue names no runtime for the device (a TPU): transformers'.
FALLBACK = PeopleRun("transformers", "bf16", "no runtime for this kind of device in "
                     "catalog/data/claims.toml: transformers, which runs on every kind")


# Each kind of device (hardware.toml `kind`) as the claims name it.
DEVICE_WORDS = {"cpu": "CPU", "gpu": "GPU", "apple": "Mac", "tpu": "TPU", "hpu": "Gaudi"}


def runtime_for(phase: str, kind: str) -> PeopleRun:
    """The runtime and weights people use for `phase` ("prefill", "decode" or "training step")
    on a device of `kind` (hardware.toml: cpu, apple, gpu, tpu)."""
    found = runtime_people_use("training" if phase == "training step" else kind)
    return found if found is not None else FALLBACK


def use(people: PeopleRun, phases: tuple[str, ...], runtime: str = "", weights: str = "",
        why: str = "") -> RuntimeUse:
    """The runtime a claim ran for `phases`: what people use (`people`), or `runtime` in its
    place, saying `why`."""
    if not runtime or runtime == people.runtime:
        return RuntimeUse(people.runtime, weights or people.weights, phases)
    return RuntimeUse(runtime, weights, phases, people.runtime, why)


def timed_here(what: str) -> RatesUsed:
    return RatesUsed("timed here", what)


def probe_rates(local: LocalRates, runtimes: tuple[str, ...],
                missing: dict[str, bool]) -> RatesUsed:
    """The rates of an estimate from this machine's rates (`local`) under `runtimes`, where
    `missing[runtime]` says the probe lacks that runtime's own costs (the estimate's own
    `missing` lines: llama.cpp not probed for the type and threads, or no eager costs)."""
    command = firmer_probe(tuple(r for r in runtimes if missing.get(r)))
    if local.rates.source != "measured":
        return RatesUsed("datasheet", "datasheet rates (no probe profile)",
                         firmer_probe(runtimes) or "gpuwise probe")
    said = f"{'quick ' if local.quick else ''}probe of {local.probed_on or 'this machine'}"
    if local.probed_now:
        said += " (run now)"
    held = [_costs(r) for r in runtimes if not missing.get(r) and runtime_unit(r).probe_part is not None]
    lacked = [_costs(r) for r in runtimes if missing.get(r)]
    unprobed = [_costs(r) for r in runtimes if runtime_unit(r).probe_part is None]
    if held:
        said += f" with {_and(held)} costs"
    if lacked:
        said += f"{',' if held else ''} without {_and(lacked)} costs"
    if unprobed:
        said += f" ({_and(unprobed)} costs: the catalogue's, no probe measures them)"
    return RatesUsed("probe without runtime costs" if lacked else "probe with runtime costs",
                     said, command)


def firmer_probe(runtimes: tuple[str, ...]) -> str:
    """The probe that measures the own costs of `runtimes` ("" where none does):
    `gpuwise probe --runtime llama.cpp` for llama.cpp's (a full probe besides, so it measures
    transformers' too), `gpuwise probe` for transformers' dispatch."""
    units = [runtime_unit(r) for r in runtimes]
    own = [u.id for u in units if u.probe_part]
    if own:
        return f"gpuwise probe --runtime {own[0]}"
    return "gpuwise probe" if any(u.probe_part == "" for u in units) else ""


def _costs(runtime: str) -> str:
    name = NAMES.get(runtime, runtime)
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
