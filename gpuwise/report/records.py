"""Plain dicts for --json: every number with its unit in the key and its source."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.workload import Architecture, count_params


def model_record(model: ResolvedModel, arch: Architecture) -> dict[str, Any]:
    counts = count_params(arch)
    return {
        "name": model.name, "origin": model.origin, "location": model.location,
        "family": arch.model_type, "params": counts.total, "active_params": counts.active,
        "layers": arch.num_layers, "hidden_size": arch.hidden_size,
        "attention": arch.attention_kind, "heads": arch.num_heads,
        "kv_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "vocab_size": arch.vocab_size,
        "max_position": arch.max_position, "tied_embeddings": arch.tie_embeddings,
        "sliding_window": arch.sliding_window, "sliding_layers": arch.sliding_layers,
        "moe": asdict(arch.moe) if arch.moe else None,
    }


def hardware_record(hw: Hardware) -> dict[str, Any]:
    rec = asdict(hw)
    rec["aliases"] = list(hw.aliases)
    return rec


def memory_record(est: MemoryEstimate) -> dict[str, Any]:
    return {
        "total_bytes": est.total_bytes, "breakdown": est.breakdown,
        "capacity_bytes": est.capacity_bytes, "fits": est.fits, "verdict": est.verdict,
        "margin_bytes": est.margin_bytes, "allocated_bytes": est.allocated_bytes,
        "headroom_bytes": est.headroom_bytes, "model_bytes": est.model_bytes,
        "peak_phase": est.peak_phase, "phases": est.phases, "runtime": est.runtime,
        "source": est.source, "notes": list(est.notes),
        "paged_bytes": est.paged_bytes, "paged_on_host_bytes": est.paged_on_host_bytes,
        "host_bytes": est.host_needed_bytes, "host_capacity_bytes": est.host_capacity_bytes,
    }


def interval_record(interval: Any, seconds: float) -> dict[str, Any] | None:
    """An estimate's 80% interval and what it rests on (None: no validation to go by)."""
    if interval is None:
        return None
    low, high = interval.around(seconds)
    return {"low": low, "high": high, "confidence": 0.8, "basis": interval.basis}


def inference_time_record(t: Any, how: str, curve: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "prefill_s": t.prefill_s, "decode_s_per_token": t.decode_s_per_token,
        "prefill_s_interval": interval_record(t.interval("prefill"), t.prefill_s),
        "decode_s_per_token_interval": interval_record(t.interval("decode"),
                                                       t.decode_s_per_token),
        "runtime_id": t.runtime_id, "kernel": t.kernel,
        "tokens_per_s": t.tokens_per_s, "generate_s": t.total_s,
        "bound": {"prefill": t.prefill.bound, "decode": t.decode.bound},
        "overhead_s": {"prefill": t.prefill.overhead_s, "decode": t.decode.overhead_s},
        "source": t.source, "rates": "; ".join((how, *t.missing)), "runtime": t.runtime,
        "source_kind": "estimated", "missing_parts": list(t.missing), "throughput_by_batch": curve,
    }


def training_time_record(t: Any, how: str, train_tokens: float = 0, fault_s: float = 0.0,
                         slow_faults_step_s: float | None = None) -> dict[str, Any]:
    extra = {"train_tokens": train_tokens, "time_to_train_s": t.seconds_for(train_tokens)}
    return ({} if not train_tokens else extra) | {
        "step_s": t.step_s, "tokens_per_s": t.tokens_per_s, "mfu": t.mfu,
        "step_s_interval": interval_record(t.interval(), t.step_s), "runtime_id": t.runtime_id,
        "page_faults_s": fault_s, "step_s_slow_page_faults": slow_faults_step_s,
        "forward_s": t.forward.seconds, "backward_s": t.backward.seconds,
        "optimizer_s": t.optimizer.seconds, "communication_s": t.comm_s,
        "host_memory_s": {"offload_copies_s": t.host.copies_s, "host_step_s": t.host.host_step_s,
                          "paging_s": t.host.paging_s},
        "bound": {"forward": t.forward.bound, "backward": t.backward.bound,
                  "optimizer": t.optimizer.bound},
        "source": t.source, "rates": how, "runtime": t.runtime,
    }


# The square matmul the device records give the rate of: the size GEMM benchmarks publish.
LARGE_MATMUL = 8192


def device_rates_record(rates: Any) -> dict[str, Any]:
    """The device's rates an estimate rests on, before a runtime's kernels: memory (its
    achieved rate), interconnect one way, and a large square matmul by dtype."""
    n = LARGE_MATMUL
    return {"source": rates.source, "memory_bytes_per_s": rates.memory_bytes_per_s,
            "interconnect_bytes_per_s": rates.interconnect_bytes_per_s,
            "matmul_size": n,
            "matmul_flops_per_s": {dtype: rates.matmul_rate(n, n, 2.0 * n**3, dtype)
                                   for dtype, peak in rates.peak_flops.items() if peak}}


def ops_record(phase: Any) -> list[dict[str, Any]]:
    return [
        {"op": t.op.name, "kind": t.op.kind, "count": t.op.count, "flops": t.op.flops * t.op.count,
         "bytes": t.op.bytes * t.op.count, "intensity": t.op.intensity, "seconds": t.seconds,
         "bound": t.bound, "timed_by": "probed kernel" if t.measured else "roofline"}
        for t in phase.ops
    ]
