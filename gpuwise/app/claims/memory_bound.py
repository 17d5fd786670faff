"""Claim: the usual bottleneck is moving data. The experiment: the roofline time model of a
prefill, a decode step and a training step of catalogue models on this machine's rates (its
probe where one was run, else the datasheet), each operation's time labelled memory-bound
(its bytes over the bandwidth exceed its FLOPs over the rate), compute-bound, or fixed
per-operation cost (dispatch, launch, the runtime's own work)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.machine_rates import local_rates
from gpuwise.app.claims.result import ClaimResult, Measurement, Verdict
from gpuwise.app.lookup import model_named
from gpuwise.catalog.claims import claim_thresholds
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.roofline import PhaseTime
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload.plans import InferencePlan, TrainingPlan

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

    @property
    def memory_share(self) -> float:
        return self.memory_s / self.seconds if self.seconds > 0 else 0.0


def split(model: str, phase: str, parts: list[PhaseTime]) -> PhaseSplit:
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
    return PhaseSplit(model, phase, total, compute, memory, overhead)


def rule() -> str:
    share = claim_thresholds().memory_bound_share
    return (f"holds when more than half of the phases measured (a prefill, a decode step and a "
            f"training step of each model) spend over {share:.0%} of their time in memory-bound "
            "operations (catalog/data/claims.toml)")


def by_phase(splits: list[PhaseSplit]) -> str:
    """'prefill 10-17%, decode 58-97%, ...': each phase's memory-bound share across models."""
    parts = []
    for phase in PHASES:
        shares = [s.memory_share for s in splits if s.phase == phase]
        if shares:
            lo, hi = (f"{100 * x:.0f}" for x in (min(shares), max(shares)))
            parts.append(f"{phase} {lo}%" if lo == hi else f"{phase} {lo}-{hi}%")
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
    free = sorted({s.phase for s in splits if s.memory_share <= limit}, key=PHASES.index)
    return Verdict(False, f"only {words}: {' and '.join(free)} spend most of their time in "
                   "arithmetic or fixed costs here", rule())

def run(ctx: Context) -> ClaimResult:
    ctx.step("this machine's rates", 0.0)
    local = local_rates(ctx)
    rates, how = local.rates, local.how
    models = MODELS
    infer_plan, train_plan = InferencePlan(), TrainingPlan()
    splits = []
    request = {}
    for i, name in enumerate(models):
        ctx.step(f"roofline of {name}", i / len(models))
        _, arch = model_named(name)
        t = estimate_inference_time(arch, infer_plan, rates)
        step = estimate_training_time(arch, train_plan, rates)
        splits += [split(name, "prefill", [t.prefill]), split(name, "decode", [t.decode]),
                   split(name, "training step", [step.forward, step.backward, step.optimizer])]
        pre, dec = splits[-3], splits[-2]
        n = infer_plan.new_tokens
        request[name] = ((pre.memory_s + n * dec.memory_s) / (pre.seconds + n * dec.seconds))
    source = ("estimated from this machine's probe" if rates.source == "measured" else
              "estimated from datasheet rates")
    table = [("model", "phase", "time", "memory-bound", "compute-bound", "fixed cost")]
    for s in splits:
        table.append((s.model, s.phase, f"{s.seconds * 1e3:.1f} ms", f"{s.memory_share:.0%}",
                      f"{s.compute_s / s.seconds:.0%}", f"{s.overhead_s / s.seconds:.0%}"))
    first = models[0]
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"The roofline time model ({source}) of {', '.join(models)}: a prefill of "
        f"{infer_plan.prompt_tokens} tokens and a decode step at batch {infer_plan.batch} "
        f"({infer_plan.weights}, transformers), and a training step of {train_plan.batch} x "
        f"{train_plan.seq} tokens ({train_plan.dtype}, {train_plan.optimizer}): what "
        f"`gpuwise infer {first} --ops` and `gpuwise train {first} --ops` print.",
        judge(splits),
        f"memory-bound: {by_phase(splits)}",
        tuple(Measurement(f"{s.model} {s.phase} memory-bound share", round(s.memory_share, 4),
                          "share", "estimated", how) for s in splits),
        {"labels": [f"{s.model} {s.phase}" for s in splits],
         "memory_s": [s.memory_s for s in splits], "compute_s": [s.compute_s for s in splits],
         "overhead_s": [s.overhead_s for s in splits], "seconds": [s.seconds for s in splits],
         "threshold": claim_thresholds().memory_bound_share},
        tuple(table),
        ((f"rates: {how}" + ("; no probe profile existed, so a quick probe was run and saved "
                              "(`gpuwise probe` measures more)" if local.probed_now else "")),
         "a generation request of the plan (prefill, then one decode step a new token) spends "
         + ", ".join(f"{share:.0%} ({m})" for m, share in request.items())
         + " of its time memory-bound"),
    )
