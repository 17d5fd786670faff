"""How fast a model generates (docs/speed.md): its prefill and one decode step, each the
runtime's one step model (estimate/runtimes/: `step_model`) for this request."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.catalog.time_intervals import TimeInterval, time_interval
from gpuwise.estimate.runtimes import step_model
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.estimate.speed.roofline import PhaseTime
from gpuwise.estimate.speed.step import decode_context
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

RUNTIME = "Hugging Face transformers (PyTorch eager)"


@dataclass(frozen=True)
class InferenceTime:
    prefill: PhaseTime
    decode: PhaseTime  # one step at the mid-point of generation
    batch: int
    new_tokens: int
    source: str
    runtime: str = RUNTIME
    runtime_id: str = "transformers"
    kernel: str = ""  # the weight-only kernel, or the ggml type under llama.cpp
    # What a measured estimate had to go without: a part of the probe it needs that this
    # machine's profile lacks, one line each (empty: nothing, or datasheet rates throughout)
    missing: tuple[str, ...] = ()

    @property
    def prefill_s(self) -> float:
        return self.prefill.seconds

    @property
    def decode_s_per_token(self) -> float:
        return self.decode.seconds

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second across the batch, in the decode phase."""
        return self.batch / self.decode.seconds

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.new_tokens * self.decode_s_per_token

    def interval(self, phase: str) -> TimeInterval | None:
        """The 80% interval of this runtime's validation for "prefill" or "decode"."""
        return time_interval(self.runtime_id, phase, self.source)


def estimate_inference_time(arch: Architecture, plan: InferencePlan, rates: DeviceRates,
                            runtime: str | None = None, tp: int | None = None,
                            host: DeviceRates | None = None) -> InferenceTime:
    """Time to first token (prefill) and per output token (decode) under the plan's runtime
    (or `runtime`): transformers' generate(), torch.compile, vLLM, SGLang or llama.cpp
    (whose layers past `plan.gpu_layers` run on `host`)."""
    rt = runtime_speed(runtime or plan.runtime)
    tp = plan.tp if tp is None else tp
    context = decode_context(plan.prompt_tokens, plan.new_tokens)
    decode_read = plan.batch * context
    step = step_model(arch, plan, rates, tp, host, rt.id)
    if isinstance(step, GgmlStep):
        prefill, g = step.prefill(), step.g
        decode = step.phase("decode", plan.batch, 0, decode_read)
        missing: tuple[str, ...] = ()
        if rates.source == "measured" and g.source != "measured":
            missing = (f"llama.cpp was not probed here for {step.gtype} on "
                       f"{plan.threads or rates.compute_units} thread(s): its rates are the "
                       "datasheet's shares (`gpuwise probe --runtime llama.cpp` measures them)",)
        return InferenceTime(prefill, decode, plan.batch, plan.new_tokens, g.source, rt.name,
                             rt.id, step.gtype, missing)
    prompts = plan.batch * plan.prompt_tokens
    prefill = step.phase("prefill", prompts, prompts, prompts, prompts=plan.batch)
    decode = step.phase("decode", plan.batch, 0, decode_read)
    kernel = step.kernel
    return InferenceTime(prefill, decode, plan.batch, plan.new_tokens, step.rates.source,
                         rt.name, rt.id, kernel.id if kernel else "",
                         eager_parts_missing(step.rates, step.eager))


def eager_parts_missing(rates: DeviceRates, eager: bool) -> tuple[str, ...]:
    """The line saying a measured eager estimate goes without the runtime's own costs: a
    quick probe measures none, and the bare op's cost that stands in is a fraction of
    transformers' (decode runs fast by half or more on a CPU)."""
    if not eager or rates.source != "measured" or rates.runtime_op_s:
        return ()
    return ("the probe measured no eager runtime costs (a quick probe does not): each op is "
            "charged the bare op's dispatch, not transformers', so this time is low "
            "(`gpuwise probe` without --quick measures them)",)
