"""Claim: the usual bottleneck is moving data. The experiment: the time model of a prefill, a
decode step and a training step of catalogue models on this machine's rates (its probe where
one was run, else the datasheet), each phase on the runtime people use for it here
(judged_on.runtime_for: llama.cpp's GGUF on a CPU, vLLM on a GPU, transformers for training),
exactly what `gpuwise infer MODEL --runtime R --weights W --ops` and `gpuwise train MODEL
--ops` give. Each operation's time is labelled memory-bound (its bytes over the bandwidth take
at least as long as its FLOPs over the rate), compute-bound, or fixed per-operation cost
(dispatch, launch, the runtime's own work)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import DEVICE_WORDS, probe_rates, runtime_for, use
from gpuwise.app.claims.machine_rates import local_rates
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, Verdict
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.catalog.claims import claim_thresholds
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import training_dtype_here
from gpuwise.estimate.speed.inference_time import eager_parts_missing
from gpuwise.estimate.speed.roofline import PhaseTime
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload.plans import TrainingPlan

ID = "data-movement"
TITLE = "The usual bottleneck is moving data"
CLAIM = ("Most of the time a model spends goes into moving data between memory and the "
         "compute units, not into arithmetic.")
MODELS = ("smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b")
PHASES = ("prefill", "decode", "training step")
# op kinds whose time is the runtime's own work rather than arithmetic or memory traffic
RUNTIME_KINDS = ("runtime",)


@dataclass(frozen=True)
class PhaseSplit:
    model: str
    phase: str
    seconds: float
    compute_s: float
    memory_s: float
    overhead_s: float
    runtime: str = ""  # what the phase was timed under: "llama.cpp q4_k_m", "transformers mixed-bf16"

    @property
    def memory_share(self) -> float:
        return self.memory_s / self.seconds if self.seconds > 0 else 0.0


def split(model: str, phase: str, parts: list[PhaseTime], runtime: str = "") -> PhaseSplit:
    """A phase's time (one or more PhaseTimes: a training step's forward, backward and
    optimizer) as compute-bound, memory-bound and fixed per-operation time."""
    compute = memory = overhead = total = 0.0
    for part in parts:
        total += part.seconds
        for t in part.ops:
            if t.op.kind in RUNTIME_KINDS:
                overhead += t.seconds
            elif t.bound == "compute":
                compute += t.seconds
            else:
                memory += t.seconds
    overhead += max(0.0, total - compute - memory - overhead)  # dispatch, launch latency, comm
    return PhaseSplit(model, phase, total, compute, memory, overhead, runtime)


def rule() -> str:
    share = claim_thresholds().memory_bound_share
    return (f"holds when more than half of the phases measured (a prefill, a decode step and a "
            f"training step of each model, each on the runtime people use for it here) spend "
            f"over {share:.0%} of their time in memory-bound operations (catalog/data/claims.toml)")


def by_phase(splits: list[PhaseSplit]) -> str:
    """'prefill 10-17%, decode 58-97% (llama.cpp q4_k_m), ...': each phase's memory-bound
    share across models, and the runtime it was timed under where the splits name one."""
    parts = []
    for phase in PHASES:
        mine = [s for s in splits if s.phase == phase]
        if not mine:
            continue
        shares = [s.memory_share for s in mine]
        lo, hi = (f"{100 * x:.0f}" for x in (min(shares), max(shares)))
        said = f"{phase} {lo}%" if lo == hi else f"{phase} {lo}-{hi}%"
        runtimes = sorted({s.runtime for s in mine if s.runtime})
        parts.append(said + (f" ({', '.join(runtimes)})" if runtimes else ""))
    return ", ".join(parts)


def judge(splits: list[PhaseSplit]) -> Verdict:
    if not splits:
        return Verdict(None, "no phase could be estimated", rule())
    limit = claim_thresholds().memory_bound_share
    bound = [s for s in splits if s.memory_share > limit]
    holds = len(bound) > len(splits) / 2
    words = f"{len(bound)} of {len(splits)} phases are memory-bound (memory-bound share: {by_phase(splits)})"
    if holds:
        return Verdict(True, words, rule())
    phases = [p for p in PHASES if any(s.phase == p for s in splits)]
    free = [p for p in phases if all(s.memory_share <= limit for s in splits if s.phase == p)]
    said = (f"only {words}: {' and '.join(free) or 'most phases'} spend most of their time in "
            "arithmetic or fixed costs here")
    decodes = [s for s in splits if s.phase == "decode"]
    bound_decodes = [s for s in decodes if s.memory_share > limit]
    if len(bound_decodes) > len(decodes) / 2:
        said += (f"; decode, the phase the bandwidth claim times, is memory-bound for "
                 f"{len(bound_decodes)} of {len(decodes)} models: the two claims cover "
                 "different phases")
    return Verdict(False, said, rule())


def run(ctx: Context) -> ClaimResult:
    ctx.step("this machine's rates", 0.0)
    local = local_rates(ctx)
    rates, how = local.rates, local.how
    hw = hardware_named("local")
    serving, training = runtime_for("decode", hw.kind), runtime_for("training step", hw.kind)
    deployment, workload = Deployment(runtime=serving.runtime, weights=serving.weights), Workload()
    train_plan = TrainingPlan(dtype=training_dtype_here(training.weights, hw),
                              runtime=training.runtime)
    splits: list[PhaseSplit] = []
    request = {}
    missing: dict[str, bool] = {}
    weights = serving.weights
    for i, name in enumerate(MODELS):
        ctx.step(f"time model of {name}", i / len(MODELS))
        model, arch = model_named(name)
        planned = build_plan(model, deployment, workload, hw)
        answer = infer(model, arch, hw, planned.plan, planned.weights_source)
        t = answer.time
        if t is None:
            raise GpuwiseError(f"no rates for this machine ({answer.rates_source})",
                               "run `gpuwise probe`")
        weights = answer.plan.weights
        served = f"{answer.plan.runtime} {weights}"
        missing[answer.plan.runtime] = missing.get(answer.plan.runtime, False) or bool(t.missing)
        step = estimate_training_time(arch, train_plan, rates)
        trained = f"{train_plan.runtime} {train_plan.dtype}"
        missing[train_plan.runtime] = (missing.get(train_plan.runtime, False)
                                       or bool(eager_parts_missing(rates, True)))
        splits += [split(name, "prefill", [t.prefill], served),
                   split(name, "decode", [t.decode], served),
                   split(name, "training step", [step.forward, step.backward, step.optimizer],
                         trained)]
        pre, dec = splits[-3], splits[-2]
        n = workload.new_tokens
        request[name] = ((pre.memory_s + n * dec.memory_s) / (pre.seconds + n * dec.seconds))
    judged = JudgedOn((use(serving, ("prefill", "decode"), weights=weights),
                       use(training, ("training step",), weights=train_plan.dtype)),
                      probe_rates(local, (serving.runtime, train_plan.runtime), missing))
    source = ("estimated from this machine's probe" if rates.source == "measured" else
              "estimated from datasheet rates")
    table = [("model", "phase", "runtime", "time", "memory-bound", "compute-bound", "fixed cost")]
    for s in splits:
        table.append((s.model, s.phase, s.runtime, f"{s.seconds * 1e3:.1f} ms",
                      f"{s.memory_share:.0%}", f"{s.compute_s / s.seconds:.0%}",
                      f"{s.overhead_s / s.seconds:.0%}"))
    first = MODELS[0]
    notes = [f"rates: {how}" + ("; no probe profile existed, so a quick probe was run and saved"
                                if local.probed_now else ""),
             "a generation request of the plan (prefill, then one decode step a new token) "
             "spends " + ", ".join(f"{share:.0%} ({m})" for m, share in request.items())
             + " of its time memory-bound"]
    if judged.rates.firmer:
        notes.append(f"the probe lacks some runtime's own costs: `{judged.rates.firmer}` "
                     "measures them and makes this verdict firmer")
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"The time model ({source}) of {', '.join(MODELS)}, each phase on the runtime people "
        f"use for it on this {DEVICE_WORDS.get(hw.kind, hw.kind)}: a prefill of {workload.prompt_tokens} tokens and a "
        f"decode step at batch {workload.batch} under {serving.runtime} ({weights} weights), "
        f"and a training step of {train_plan.batch} x {train_plan.seq} tokens under "
        f"{train_plan.runtime} ({train_plan.dtype}, {train_plan.optimizer}): what `gpuwise "
        f"infer {first} --runtime {serving.runtime} --weights {weights} --ops` and `gpuwise "
        f"train {first} --ops` print.",
        judge(splits),
        f"memory-bound: {by_phase(splits)}",
        tuple(Measurement(f"{s.model} {s.phase} memory-bound share", round(s.memory_share, 4),
                          "share", "estimated", f"{s.runtime}; {how}") for s in splits),
        {"labels": [f"{s.model} {s.phase}" for s in splits],
         "runtimes": [s.runtime for s in splits],
         "memory_s": [s.memory_s for s in splits], "compute_s": [s.compute_s for s in splits],
         "overhead_s": [s.overhead_s for s in splits], "seconds": [s.seconds for s in splits],
         "threshold": claim_thresholds().memory_bound_share},
        tuple(table), tuple(notes), judged_on=judged,
    )
