"""This machine: CPU, RAM and GPUs detected, NVML and RAPL read (each in one module here)."""
