"""The kernel probe's optimizer steps: seconds per parameter element of AdamW, SGD with momentum
and transformers' Adafactor, by the size of the parameter tensor."""

from __future__ import annotations

from gpuwise.measure.probe.kernel_timer import KernelTimer
from gpuwise.measure.runs.optimizers import make_optimizer

OPTIMIZERS = ("adamw", "sgd", "adafactor")


def _matrix(n: int) -> tuple[int, int]:
    """A 2-D shape of n elements (a power of two), as square as it goes."""
    rows = 2 ** (n.bit_length() // 2)
    return rows, max(1, n // rows)


class OptimizerKernels(KernelTimer):
    """One optimizer step over parameters whose states exceed the cache."""

    def optimizer(self, dtype: str) -> dict[str, list[list[float]]]:
        """Seconds per parameter element of one optimizer step, by the size of the parameter
        tensor, for AdamW, SGD with momentum and transformers' Adafactor (as `gpuwise
        validate` and the module runs make them; Adafactor on 2-D tensors, whose second
        moment it factors): one step over enough such parameters that their weights,
        gradients and two states exceed the cache, as a model's are (a small tensor's cost
        is the loop's per-tensor cost for it: Adafactor's Python runs about 40 kernels per
        tensor). An optimizer that cannot be made here (no transformers) is left out."""
        curves: dict[str, list[list[float]]] = {}
        size = self.t.empty((), dtype=self.types[dtype]).element_size()
        for name in OPTIMIZERS:
            curve = []
            for n in self.plan.optimizer_elements:
                self.step(f"{name} {dtype} on {n:,} elements")
                count = max(1, min(256, self.plan.cold_set_bytes // (4 * n * size)))
                shape = _matrix(n) if name == "adafactor" else (n,)
                params = [self.t.nn.Parameter(self.tensor(*shape, dtype=dtype))
                          for _ in range(count)]
                for p in params:
                    p.grad = self.tensor(*shape, dtype=dtype)
                if name == "adamw":  # the loop a CPU runs; a GPU's foreach kernels
                    opt = self.t.optim.AdamW(params, lr=1e-4, foreach=self.device.type == "cuda")
                else:
                    try:
                        opt = make_optimizer(name, params)
                    except ImportError:
                        break
                curve.append([n, self.median_s(opt.step) / (n * count)])
                del opt, params
            if curve:
                curves[name] = curve
        return curves
