"""A tiny real training loop for the `gpuwise repro` tests and docs (about a second on a CPU).

An MLP with batch normalization learns a synthetic rule. Batch normalization over a large batch
makes CPU reductions whose order depends on the thread count, so a different thread count
changes the result even with the seed fixed. The data are fixed (seeded apart from the run's
seed); the run's seed sets the initial weights and the minibatch order.

--seed-source: 'api' (gpuwise.seed_everything), 'flag' (--seed N), 'fixed' (ignores the seed:
always 0), 'none' (never seeds: different every run).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import gpuwise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--seed-source", choices=("api", "flag", "fixed", "none"), default="api")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--count-file", default=None, help="append a line per run (resume tests)")
    args = ap.parse_args()
    if args.count_file:
        with open(args.count_file, "a") as f:
            f.write(f"{os.environ.get('GPUWISE_SEED')}\n")

    data = torch.Generator().manual_seed(1234)  # the data set is the same in every run
    x = torch.randn(16384, 32, generator=data)
    y = ((x[:, :4].sum(1) + 0.5 * x[:, 4] * x[:, 5]) > 0).float()

    if args.seed_source == "api":
        gpuwise.seed_everything()
    elif args.seed_source == "flag":
        gpuwise.seed_everything(args.seed)
    elif args.seed_source == "fixed":
        gpuwise.seed_everything(0)  # a program that hard-codes its seed

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch,))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(x[idx]).squeeze(1), y[idx]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        gpuwise.step_hash(step, loss)
    gpuwise.report_params_hash(model)
    # Evaluated in float64 so that differences in the last bits of the weights show.
    model.eval().double()
    with torch.no_grad():
        logits = model(x.double()).squeeze(1)
        final = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.double())
        acc = ((logits > 0).double() == y).double().mean()
    gpuwise.report_metric("train_loss", final.item())
    print(json.dumps({"acc": acc.item()}))


if __name__ == "__main__":
    main()
