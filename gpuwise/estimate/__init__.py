"""Pure estimators: (workload, plan, hardware) -> result records. No I/O, no torch."""

from gpuwise.estimate.inference import estimate_inference, kv_cache_bytes
from gpuwise.estimate.plans import InferencePlan, TrainingPlan
from gpuwise.estimate.results import MemoryEstimate
from gpuwise.estimate.training import estimate_training
from gpuwise.estimate.weights import weight_bytes

__all__ = [
    "InferencePlan", "MemoryEstimate", "TrainingPlan", "estimate_inference",
    "estimate_training", "kv_cache_bytes", "weight_bytes",
]  # fmt: skip
