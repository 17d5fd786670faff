"""What is run: a model turned into architecture facts (shapes, parameter counts)."""

from gpuwise.workload.arch import Architecture, MoE
from gpuwise.workload.families import from_config
from gpuwise.workload.params import ParamCounts, count_params

__all__ = ["Architecture", "MoE", "ParamCounts", "count_params", "from_config"]
