"""The kernel probe's matrix products: F.linear forward and backward over a grid of rows x
input width x output width (and x @ W with W stored (in, out), GPT-2's Conv1D), and
convolutions as implicit GEMMs by window and stride, forward and backward."""

from __future__ import annotations

from functools import partial
from typing import Any

from gpuwise.measure.probe.kernel_timer import Cycle, KernelTimer


class MatmulKernels(KernelTimer):
    """Linear layers and convolutions."""

    def linear(self, dtype: str) -> dict[str, list[list[float]]]:
        plan = self.plan
        fwd: list[list[float]] = []
        bwd: list[list[float]] = []
        for k in plan.widths:
            for n in plan.widths:
                weights = Cycle(self.weights(k, n, dtype))
                for m in plan.rows:
                    self.step(f"linear {dtype} {m}x{k}->{n}")
                    if self._too_slow(fwd, (m, k, n), f"linear.{dtype}.forward"):
                        continue
                    x = self.tensor(m, k, dtype=dtype)
                    fwd.append([m, k, n, self.median_s(partial(self._forward, x, weights))])
                for m in plan.backward_rows:
                    self.step(f"linear backward {dtype} {m}x{k}->{n}")
                    if self._too_slow(bwd, (m, k, n), f"linear.{dtype}.backward"):
                        continue
                    x, grad = self.tensor(m, k, dtype=dtype), self.tensor(m, n, dtype=dtype)
                    bwd.append([m, k, n, self.median_s(partial(self._backward, x, grad, weights))])
        return {"forward": fwd, "backward": bwd, "forward_nn": self._linear_nn(dtype)}

    def _too_slow(self, done: list[list[float]], shape: tuple[int, int, int], grid: str) -> bool:
        """Whether a point's call would take over `slow_call_s` at the rate of the point
        measured before it in its grid (then it is counted in `skipped`, not measured)."""
        if not done:
            return False
        m, k, n, seconds = done[-1]
        predicted = seconds * (shape[0] * shape[1] * shape[2]) / (m * k * n)
        if predicted <= self.plan.slow_call_s:
            return False
        count, slowest = self.skipped.get(grid, (0, 0.0))
        self.skipped[grid] = (count + 1, max(slowest, predicted))
        return True

    def _linear_nn(self, dtype: str) -> list[list[float]]:
        """x @ W with W stored (in, out): GPT-2's Conv1D (addmm), at the rows where it differs."""
        points: list[list[float]] = []
        for k in self.plan.nn_widths:
            for n in self.plan.nn_widths:
                weights = Cycle([w.t().contiguous() for w in self.weights(k, n, dtype)])
                for m in self.plan.nn_rows:
                    self.step(f"linear x@W {dtype} {m}x{k}->{n}")
                    if self._too_slow(points, (m, k, n), f"linear.{dtype}.forward_nn"):
                        continue
                    x = self.tensor(m, k, dtype=dtype)
                    points.append([m, k, n, self.median_s(partial(self._forward_nn, x, weights))])
        return points

    def _forward(self, x: Any, weights: Cycle) -> object:
        return self.t.nn.functional.linear(x, weights.next())

    def _forward_nn(self, x: Any, weights: Cycle) -> object:
        return self.t.mm(x, weights.next())

    def _backward(self, x: Any, grad: Any, weights: Cycle) -> object:
        """What autograd runs for F.linear: the input's and the weight's gradient."""
        return self.t.mm(grad, weights.next()), self.t.mm(grad.t(), x)

    def conv(self, dtype: str) -> dict[str, list[list[float]]]:
        """Convolutions as implicit GEMMs [rows m (batch x output positions), window k
        (window x in channels), out channels n, (a backward: the GEMMs it runs,) seconds],
        forward and backward: 3x3 stride 1 under "forward"/"backward", the plan's other
        windows and strides under "forward:1x1/s2" and so on."""
        out: dict[str, list[list[float]]] = {}
        for channels, size in self.plan.conv_shapes:
            self._conv_point(out, dtype, ("3x3/s1", channels, channels, size))
        for spec in self.plan.conv_variants:
            self._conv_point(out, dtype, spec)
        return out

    def _conv_point(self, out: dict[str, list[list[float]]], dtype: str,
                    spec: tuple[str, int, int, int]) -> None:
        """One convolution, forward and backward. A 3-channel input is a network's own
        input, which needs no gradient: its backward is the weight gradient alone. An odd
        window pads to keep the size ("same"), an even one (a ViT's patches) does not."""
        variant, cin, cout, size = spec
        window, stride = int(variant.split("x")[0]), int(variant.split("/s")[1])
        pad = window // 2 if window % 2 else 0
        conv2d, batch = self.t.nn.functional.conv2d, self.plan.conv_batch
        positions = ((size + 2 * pad - window) // stride + 1) ** 2
        shape = [batch * positions, window * window * cin, cout]
        x = self.tensor(batch, cin, size, size, dtype=dtype).requires_grad_(cin > 3)
        w = self.tensor(cout, cin, window, window, dtype=dtype).requires_grad_()
        call = partial(conv2d, x, w, stride=stride, padding=pad)
        suffix = "" if variant == "3x3/s1" else f":{variant}"
        self.step(f"conv {dtype} {variant} {cin}ch {size}px")
        with self.t.no_grad():
            out.setdefault("forward" + suffix, []).append([*shape, self.median_s(call)])
        self.step(f"conv backward {dtype} {variant} {cin}ch {size}px")
        result = call()
        wrt = (x, w) if x.requires_grad else (w,)
        step = partial(self.t.autograd.grad, result, wrt, self.t.ones_like(result),
                       retain_graph=True)
        out.setdefault("backward" + suffix, []).append([*shape, len(wrt), self.median_s(step)])
