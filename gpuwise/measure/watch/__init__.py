"""`gpuwise watch`: measure a real training job and say where its time and energy went.

The pieces: `sensors` and `sampler` (readings every ~0.2 s), `inject/` (the start-up hook
that times a PyTorch loop with no code change), `api` (`gpuwise.watch()`), `callbacks`
(Hugging Face Trainer, PyTorch Lightning), `runner` (runs the command), `log` (reads logs),
`exporter` (serves the job's metrics for Prometheus: `--prometheus`).
The verdict itself is pure: gpuwise.estimate.watch.verdict.
"""

from gpuwise.measure.watch.api import watch

__all__ = ["watch"]
