"""Claim: training and inference spend energy differently. The experiment: one small llama
model (random weights) trained for a few steps and then generating tokens, both for real in
this process; joules per training step and per generated token from the energy counters
where they can be read (RAPL, NVML), else estimated from the threads' measured busy share and
per-thread watts (Cloud Carbon Footprint's coefficients); and joules per FLOP of each, the
FLOPs counted by the model's operations (gpuwise.workload.ops)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.app.claims.context import Context
from gpuwise.app.claims.judged_on import runtime_for, timed_here, use
from gpuwise.app.claims.result import ClaimResult, JudgedOn, Measurement, Verdict
from gpuwise.app.claims.torch_runs import TorchTiming, decode_timing, llama_config, training_timing
from gpuwise.catalog.claims import claim_thresholds, thread_watts
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape, forward_ops

ID = "energy"
TITLE = "Training and inference spend energy differently"
CLAIM = ("A training step turns its energy into arithmetic on many tokens at once; generating "
         "a token spends it moving every weight for one token's arithmetic, so per unit of "
         "work inference costs more energy.")

# (hidden, layers, heads, kv heads, ffn, vocab): a small vocabulary keeps the logits (and a
# CPU's page faults on them) from dominating a step
CPU_MODEL = {"quick": (384, 6, 6, 2, 1024, 8192), "full": (512, 8, 8, 4, 1408, 8192)}
GPU_MODEL = (1024, 12, 16, 4, 2816, 32000)


@dataclass(frozen=True)
class EnergyPoint:
    label: str  # "training step" or "generated token"
    seconds: float
    flops: float
    joules: float | None
    watts: float | None
    source: str  # measured, estimated

    @property
    def joules_per_gflop(self) -> float | None:
        return self.joules / (self.flops / 1e9) if self.joules is not None and self.flops else None


def rule() -> str:
    ratio = claim_thresholds().energy_per_flop_ratio
    return (f"holds when a generated token costs at least {ratio:g}x the joules per FLOP of a "
            "training step (catalog/data/claims.toml)")


def judge(train: EnergyPoint, token: EnergyPoint) -> Verdict:
    a, b = token.joules_per_gflop, train.joules_per_gflop
    if a is None or b is None or b <= 0:
        return Verdict(None, "no energy could be read or estimated here", rule())
    ratio = a / b
    limit = claim_thresholds().energy_per_flop_ratio
    words = (f"a generated token cost {a:.3g} J per GFLOP, a training step {b:.3g} "
             f"({ratio:.1f}x; {token.source})")
    if ratio >= limit:
        return Verdict(True, words, rule())
    return Verdict(False, f"{words}: under {limit:g}x", rule())


def flops(config: dict[str, object], batch: int, tokens: int, context: int, training: bool,
          nbytes: float) -> float:
    """FLOPs of a forward over `tokens` per sequence (x3 for a training step: the backward
    does twice the forward's), every position's logits in training, the last one's otherwise."""
    arch = from_config(dict(config), "claims")
    shape = Shape(batch, tokens, context, nbytes, nbytes, nbytes, "sdpa",
                  tokens if training else 1)
    forward = sum(op.flops * op.count for op in forward_ops(arch, shape))
    return 3.0 * forward if training else forward


def run(ctx: Context) -> ClaimResult:
    shape = GPU_MODEL if ctx.on_gpu else CPU_MODEL["quick" if ctx.quick else "full"]
    config = llama_config(*shape)
    dtype, nbytes = ("bf16", 2.0) if ctx.on_gpu else ("fp32", 4.0)
    batch, seq = (8, 512) if ctx.on_gpu else ctx.pick((4, 128), (8, 128))
    prompt, new = 16, ctx.pick(33, 65)
    ctx.step("training steps", 0.0)
    step = training_timing(config, ctx.device, dtype, batch, seq, steps=ctx.pick(3, 5))
    ctx.step("generating tokens", 0.5)
    decode = decode_timing(config, ctx.device, dtype, prompt, new, repeats=ctx.pick(3, 5))
    train = _point(ctx, "training step", step,
                   flops(config, batch, seq, seq, True, nbytes))
    token = _point(ctx, "generated token", decode,
                   flops(config, 1, 1, prompt + new // 2, False, nbytes))
    points = (train, token)
    notes = [f"energy counters: {step.energy_note}" if train.source == "measured" else
             f"no energy counter could be read here ({step.energy_note.removeprefix('NA: ')})"]
    if train.joules is not None and train.source == "estimated":
        vendor = thread_watts(_vendor(ctx))
        notes.append(f"estimated: {vendor.idle_w:g}-{vendor.busy_w:g} W a thread by its measured "
                     f"busy share ({vendor.source}); both runs kept the threads about equally "
                     "busy, so the ratio rests on the measured times")
    table = [("", "time", "GFLOP", "joules", "watts", "J per GFLOP", "source")]
    for p in points:
        table.append((p.label, f"{p.seconds * 1e3:.1f} ms", f"{p.flops / 1e9:.3g}",
                      _num(p.joules), _num(p.watts), _num(p.joules_per_gflop), p.source))
    hidden, layers = shape[0], shape[1]
    energy_from = ("the energy counters" if train.source == "measured" else
                   "estimated from the threads' busy share" if train.joules is not None else
                   "no energy reading")
    judged = JudgedOn(
        (use(runtime_for("training step", ctx.device_kind), ("training step",), "transformers",
             dtype),
         use(runtime_for("decode", ctx.device_kind), ("decode",), "transformers", dtype,
             "the token and the training step run one model in one process under one energy "
             "meter; eager dispatch adds to every token")),
        timed_here(f"times measured here, energy {energy_from}"))
    return ClaimResult(
        ID, TITLE, CLAIM,
        f"A random-weight llama model (hidden {hidden}, {layers} layers, {dtype}, "
        f"{decode.params / 1e6:.0f}M parameters besides the embedding) on the "
        f"{'GPU' if ctx.on_gpu else 'CPU'}: training steps of {batch} x {seq} tokens (AdamW), "
        f"then {new} tokens generated one at a time after a {prompt}-token prompt.",
        judge(train, token),
        f"{_num(train.joules)} J a training step, {_num(token.joules)} J a token "
        f"({train.source})",
        tuple(m for p in points for m in (
            Measurement(f"{p.label}: time", p.seconds, "s", "measured"),
            Measurement(f"{p.label}: energy", p.joules, "J", p.source),
            Measurement(f"{p.label}: FLOPs", p.flops, "FLOP", "estimated",
                        "counted from the model's operations"))),
        {"labels": [p.label for p in points], "seconds": [p.seconds for p in points],
         "flops": [p.flops for p in points], "joules": [p.joules for p in points],
         "joules_per_gflop": [p.joules_per_gflop for p in points],
         "watts": [p.watts for p in points], "source": train.source,
         "threshold": claim_thresholds().energy_per_flop_ratio},
        tuple(table), tuple(notes), judged_on=judged,
    )


def _vendor(ctx: Context) -> str:
    model = ctx.machine.cpu_model.lower()
    for vendor in ("amd", "intel"):
        if vendor in model:
            return vendor
    return "arm" if model.startswith(("arm", "neoverse", "apple", "graviton")) else model


def _point(ctx: Context, label: str, t: TorchTiming, work: float) -> EnergyPoint:
    if t.joules is not None:
        return EnergyPoint(label, t.seconds, work, t.joules, t.joules / t.seconds if t.seconds
                           else None, "measured")
    if ctx.on_gpu or t.busy_share is None:
        return EnergyPoint(label, t.seconds, work, None, None, "estimated")
    watts = thread_watts(_vendor(ctx)).watts(t.threads, t.busy_share)
    return EnergyPoint(label, t.seconds, work, watts * t.seconds, watts, "estimated")


def _num(x: float | None) -> str:
    return "NA" if x is None else f"{x:.3g}"
