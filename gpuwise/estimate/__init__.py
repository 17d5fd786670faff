"""Pure estimators: (workload, plan, hardware) -> result records. No I/O, no torch."""

from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.inference import kv_cache_bytes
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.workload.plans import InferencePlan, TrainingPlan

__all__ = [
    "InferencePlan", "MemoryEstimate", "TrainingPlan", "estimate_inference",
    "estimate_training", "kv_cache_bytes", "weight_bytes",
]
