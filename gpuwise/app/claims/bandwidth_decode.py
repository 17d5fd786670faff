"""Claim: bandwidth decides decode speed. The experiment: decode a few model sizes for real
and set each token's time beside the bytes it reads over this machine's measured read
bandwidth: the median of readings before, between and after the timings (a shared machine's
bandwidth drifts by tens of percent within minutes). Decode is timed on the runtime people use
for it here (judged_on.runtime_for): on a CPU llama.cpp, random-weight f16 GGUFs timed as
llama-bench times them. Where that runtime cannot run in this process (llama.cpp not
installed; vLLM on a GPU), transformers' generate() on random weights (fp32 on a CPU, bf16 on a
GPU), and the result says so beside the verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import runtime_for, timed_here, use
from gpuwise.app.claims.llama_models import (
    QUICK_SIZES,
    SIZES,
    llama_cpp_missing,
    model_file,
    time_decode,
)
from gpuwise.app.claims.machine_rates import Bandwidth, measure_bandwidth
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, RuntimeUse, Verdict
from gpuwise.app.claims.torch_runs import decode_timing, llama_config
from gpuwise.catalog.claims import claim_thresholds
from gpuwise.estimate.runtimes import runtime_unit

ID = "bandwidth"
TITLE = "Bandwidth decides decode speed"
CLAIM = ("Generating a token reads every weight once, so a token takes about the bytes it "
         "reads divided by the memory bandwidth, whatever the arithmetic.")

# transformers' models on a GPU: large enough that launching kernels does not hide the reads
GPU_SIZES = {"0.4B": (1024, 24, 16, 8, 4096), "1.1B": (2048, 22, 32, 4, 5632),
             "2.7B": (2560, 32, 32, 8, 9728)}
CPU_TORCH_SIZES = {"0.06B": (512, 8, 8, 4, 1408), "0.11B": (768, 10, 12, 4, 2048),
                   "0.2B": (1024, 12, 16, 4, 2816)}

# the probe part of the runtime this experiment times itself: llama.cpp, through
# gpuwise.measure.llama_cpp's bench (a GGUF written here, decoded token by token)
LLAMA_CPP_PART = "llama_cpp"


@dataclass(frozen=True)
class DecodePoint:
    label: str
    bytes_per_token: int
    measured_s: float

    def predicted_s(self, read_gbs: float) -> float:
        return self.bytes_per_token / (read_gbs * 1e9)


def rule() -> str:
    f = claim_thresholds().decode_bandwidth_factor
    return (f"holds when every size's measured decode time is within {f:g}x either way of its "
            "bytes per token over the measured read bandwidth (catalog/data/claims.toml)")


def judge(points: list[DecodePoint], read_gbs: float) -> Verdict:
    """Each point's measured time over bytes / bandwidth, against the stated factor."""
    if not points or read_gbs <= 0:
        return Verdict(None, "no decode could be timed", rule())
    f = claim_thresholds().decode_bandwidth_factor
    ratios = [(p.label, p.measured_s / p.predicted_s(read_gbs)) for p in points]
    outside = [(label, r) for label, r in ratios if not 1 / f <= r <= f]
    span = f"{min(r for _, r in ratios):.2f}-{max(r for _, r in ratios):.2f}x"
    if not outside:
        return Verdict(True, f"measured decode took {span} of bytes / bandwidth", rule())
    worst = max(outside, key=lambda lr: max(lr[1], 1 / lr[1]))
    why = ("something besides reading the weights (dispatching operators, the runtime's own "
           "work) takes most of the time" if worst[1] > f else
           "the weights are served faster than the measured bandwidth (from cache)")
    return Verdict(False, f"the {worst[0]} model took {worst[1]:.2f}x bytes / bandwidth "
                   f"(allowed {1 / f:.2f}-{f:g}x): {why}", rule())


def run(ctx: Context) -> ClaimResult:
    missing = llama_cpp_missing()
    notes: list[str] = []
    readings: list[Bandwidth] = []

    def bandwidth_now() -> None:
        ctx.step("memory bandwidth")
        readings.append(measure_bandwidth())

    people = runtime_for("decode", ctx.device_kind)
    if ctx.on_gpu:
        runtime = "transformers (bf16, GPU)"
        used = use(people, ("decode",), "transformers", "bf16",
                   "its engine is not run by this experiment, which times decode in-process")
        points = _torch_points(ctx, GPU_SIZES, "bf16", bandwidth_now)
    elif runtime_unit(people.runtime).probe_part == LLAMA_CPP_PART and missing is None:
        runtime = f"llama.cpp (f16, {ctx.cores} threads)"
        used = use(people, ("decode",), weights="f16")
        points = _llama_points(ctx, bandwidth_now)
    else:
        if missing is not None:
            notes.append(f"llama.cpp is not available ({missing}): transformers' generate() "
                         "timed instead, whose per-operator dispatch adds to every token")
        runtime = "transformers (fp32, CPU)"
        used = use(people, ("decode",), "transformers", "fp32",
                   f"not available here ({missing}); eager dispatch adds to every token")
        points = _torch_points(ctx, CPU_TORCH_SIZES, "fp32", bandwidth_now)
    bandwidth_now()
    bw = _median(readings)
    low, high = min(r.read_gbs for r in readings), max(r.read_gbs for r in readings)
    notes.append(f"read bandwidth: median of {len(readings)} readings, {low:.1f}-{high:.1f} GB/s")
    verdict = judge(points, bw.read_gbs)
    table = [("model", "bytes / token", "measured", "bytes / bandwidth", "ratio")]
    for p in points:
        pred = p.predicted_s(bw.read_gbs)
        table.append((p.label, f"{p.bytes_per_token / 1e6:.0f} MB", f"{p.measured_s * 1e3:.2f} ms",
                      f"{pred * 1e3:.2f} ms", f"{p.measured_s / pred:.2f}x"))
    ratios = [p.measured_s / p.predicted_s(bw.read_gbs) for p in points]
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"Decode of {len(points)} random-weight llama models under {runtime}, each token's "
        f"time measured, against the bytes a token reads over the read bandwidth measured "
        f"here ({bw.read_gbs:.1f} GB/s, {bw.device}: the median of readings before, between "
        "and after the timings).",
        verdict,
        f"decode {min(ratios):.2f}-{max(ratios):.2f}x bytes/bandwidth "
        f"({bw.read_gbs:.0f} GB/s read)" if ratios else "no decode timed",
        (Measurement("read bandwidth", round(bw.read_gbs, 2), "GB/s", "measured",
                     f"{bw.device}; median of {len(readings)} readings, {low:.1f}-{high:.1f}"),
         *(Measurement(f"decode {p.label}", p.measured_s, "s/token", "measured",
                       f"{p.bytes_per_token} bytes read a token") for p in points)),
        {"read_gbs": bw.read_gbs, "runtime": runtime,
         "labels": [p.label for p in points],
         "bytes_per_token": [p.bytes_per_token for p in points],
         "measured_s": [p.measured_s for p in points],
         "predicted_s": [p.predicted_s(bw.read_gbs) for p in points],
         "factor": claim_thresholds().decode_bandwidth_factor},
        tuple(table), tuple(notes), judged_on=_judged_on(used, bw, readings),
    )


def _judged_on(used: RuntimeUse, bw: Bandwidth, readings: list[Bandwidth]) -> JudgedOn:
    """Decode and the bandwidth, both timed by this run (f16: every weight read as stored, so
    bytes over bandwidth is the whole of what a token should cost)."""
    return JudgedOn((used,), timed_here(
        f"decode and STREAM read timed here ({bw.read_gbs:.1f} GB/s, the median of "
        f"{len(readings)} readings)"))


def _median(readings: list[Bandwidth]) -> Bandwidth:
    ranked = sorted(readings, key=lambda r: r.read_gbs)
    return ranked[(len(ranked) - 1) // 2]


def _llama_points(ctx: Context, bandwidth_now: Callable[[], None]) -> list[DecodePoint]:
    sizes = QUICK_SIZES if ctx.quick else tuple(SIZES)
    n_gen, reps = ctx.pick((16, 3), (64, 5))
    points = []
    for i, size in enumerate(sizes):
        model_file(ctx, size)  # written before the bandwidth is read, not between
        ctx.step(f"llama.cpp decode of the {size} model", (i + 0.5) / len(sizes))
        bandwidth_now()
        t = time_decode(ctx, size, "f16", n_gen, reps)
        points.append(DecodePoint(f"{size} f16", t.bytes_per_token, t.s_per_token))
    return points


def _torch_points(ctx: Context, sizes: Mapping[str, tuple[int, ...]], dtype: str,
                  bandwidth_now: Callable[[], None]) -> list[DecodePoint]:
    chosen = list(sizes.items())[: 2 if ctx.quick else None]
    points = []
    for i, (label, shape) in enumerate(chosen):
        ctx.step(f"transformers decode of the {label} model", (i + 0.5) / len(chosen))
        bandwidth_now()
        t = decode_timing(llama_config(*shape), ctx.device, dtype, prompt=16,
                          new_tokens=ctx.pick(17, 65), repeats=ctx.pick(3, 5))
        points.append(DecodePoint(f"{label} {dtype}", t.weight_bytes, t.seconds))
    return points
