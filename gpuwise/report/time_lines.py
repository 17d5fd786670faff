"""The time lines of `gpuwise infer` and `gpuwise train`, written from their JSON records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwise.report.terminal import format_seconds

if TYPE_CHECKING:
    from gpuwise.app.train import PageFaults

# The share of a step in page faults from which `gpuwise train` says how to avoid them.
FAULTS_WORTH_A_TIP = 0.05


def time_lines(rec: dict[str, Any]) -> dict[str, str]:
    if "unavailable" in rec:
        return {"time": f"not estimated: {rec['unavailable']}"}
    if "step_s" in rec:
        return {"time": f"step {format_seconds(rec['step_s'])}{_range(rec, 'step_s')}, "
                        f"{rec['tokens_per_s']:,.0f} tokens/s, MFU {100 * rec['mfu']:.0f}% "
                        f"(backward {rec['bound']['backward']}-bound; {rec['source']}: "
                        f"{rec['rates']}); runtime {rec['runtime']}"
                        + _host_memory(rec) + _time_to_train(rec)}
    kernel = f", {rec['kernel']} kernels" if rec.get("kernel") else ""
    return {"time": f"prefill {format_seconds(rec['prefill_s'])} "
                    f"({_range(rec, 'prefill_s', '; ')}{rec['bound']['prefill']}-bound), decode "
                    f"{format_seconds(rec['decode_s_per_token'])}/token "
                    f"({_range(rec, 'decode_s_per_token', '; ')}{rec['bound']['decode']}-bound), "
                    f"{rec['tokens_per_s']:,.1f} tokens/s ({rec['source']}: {rec['rates']}); "
                    f"runtime {rec['runtime']}{kernel}"}


def _range(rec: dict[str, Any], key: str, then: str = "") -> str:
    """The estimate's 80% interval: "6.8-9.3 ms, 80%" followed by `then`, or without `then`
    " (6.8-9.3 ms, 80%)"; "" where there is none."""
    iv = rec.get(f"{key}_interval")
    if not iv:
        return ""
    low, high = format_seconds(iv["low"]), format_seconds(iv["high"])
    unit = high.split(" ")[-1]
    if low.endswith(" " + unit):
        low = low.rsplit(" ", 1)[0]
    text = f"{low}-{high}, 80%"
    return text + then if then else f" ({text})"


HOST_PARTS = {"offload_copies_s": "offload's copies compute does not hide",
              "host_step_s": "the optimizer step on the host", "paging_s": "paging states"}


def _host_memory(rec: dict[str, Any]) -> str:
    """'; 1.2 s of it host memory (...)' where host memory costs the step time."""
    parts = {k: v for k, v in rec.get("host_memory_s", {}).items() if v > 0}
    if not parts:
        return ""
    said = ", ".join(f"{HOST_PARTS[k]} {format_seconds(v)}" for k, v in parts.items())
    return f"; {format_seconds(sum(parts.values()))} of it host memory ({said})"


def _time_to_train(rec: dict[str, Any]) -> str:
    if not rec.get("train_tokens"):
        return ""
    hours = rec["time_to_train_s"] / 3600
    return f"; {rec['train_tokens']:,.0f} tokens in {hours:,.1f} h ({hours / 24:,.1f} days)"


def faults_tip(faults: PageFaults, step_s: float) -> str | None:
    """glibc gives back memory and maps it again every step; told not to, it faults nothing
    in after the first steps, for a higher peak (docs/speed.md, "Page faults on a CPU").
    Where the probe saw first touch slow down with memory in use, the step at that rate too:
    such a host's steps run in between. None where the faults are too small to mention."""
    fault_s = faults.step_fault_s
    if fault_s < FAULTS_WORTH_A_TIP * step_s:
        return None
    from gpuwise.measure.runs.module_run import NO_FAULTS_ENV  # only here: check never needs it

    env = " ".join(f"{k}={v}" for k, v in NO_FAULTS_ENV.items())
    slow = ""
    if faults.slow_step_s and faults.slow_bytes_per_s:
        slow = (f"; at the {faults.slow_bytes_per_s / 1e9:.2f} GB/s the probe also "
                f"saw with memory in use, the step takes up to {faults.slow_step_s:.2f} s")
    return (f"{fault_s:.2f} s of the step ({fault_s / step_s:.0%}) at the probed first-touch "
            f"rate, for memory glibc gives back and maps again every step{slow}; `{env}` "
            "keeps it mapped, for a peak about 10% higher")
