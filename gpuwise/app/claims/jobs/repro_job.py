"""A small training run for `gpuwise repro` under `gpuwise claims` (the claim "fixing the seed
does not make GPU training reproducible"), about a second on a CPU.

An MLP with batch normalisation and a segment sum (pooling rows by a group id) learns a
synthetic rule. Batch normalisation over a large batch makes reductions whose order depends on
the CPU thread count. The segment sum is index_add_ and indexing on a GPU, as scatters and gathers run there:
atomic adds in whatever order the threads arrive, unless deterministic algorithms are on. On a
CPU, whose index_add_ and gather backward also add in parallel, it is the same sums as matmuls
with the one-hot group matrix, deterministic at a fixed thread count (what `gpuwise repro`
expects of a CPU). The data are fixed; the run's seed (GPUWISE_SEED, through
seed_everything) sets the initial weights and the minibatch order.

    python repro_job.py [--steps 40] [--device cpu|cuda]

Reports `train_loss` (evaluated in float64, so differences in the last bits of the weights
show), the parameters' hash and a hash of each step's loss. Nothing is written to stdout.
"""

from __future__ import annotations

import argparse

import torch

from gpuwise.measure.repro.program_api import (
    report_metric,
    report_params_hash,
    seed_everything,
    step_hash,
)

SEGMENTS = 64


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)
        self.norm = torch.nn.BatchNorm1d(64)
        self.out = torch.nn.Linear(64, 1)

    def forward(self, x: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.inp(x)))
        scale = len(h) / SEGMENTS
        if h.is_cuda:  # a scatter and a gather, as GPU code writes them: atomics
            pooled = torch.zeros(SEGMENTS, h.shape[1], device=h.device, dtype=h.dtype)
            rows = (pooled.index_add(0, segment, h) / scale)[segment]
        else:  # the same sums as matmuls (a CPU's scatter and gather-backward add in parallel)
            onehot = torch.nn.functional.one_hot(segment, SEGMENTS).to(h.dtype)
            rows = onehot @ (onehot.T @ h / scale)
        return self.out(h + 0.1 * rows).squeeze(1)

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    data = torch.Generator().manual_seed(1234)  # the data set is the same in every run
    x = torch.randn(16384, 32, generator=data)
    y = ((x[:, :4].sum(1) + 0.5 * x[:, 4] * x[:, 5]) > 0).float()
    segment = torch.arange(len(x)) % SEGMENTS
    x, y, segment = x.to(device), y.to(device), segment.to(device)

    seed_everything()
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch,)).to(device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(x[idx], segment[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_hash(step, loss)
    report_params_hash(model)
    model.eval().double()
    with torch.no_grad():
        logits = model(x.double(), segment)
        final = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.double())
    report_metric("train_loss", final.item())


if __name__ == "__main__":
    main()
