"""A tiny replica for the `gpuwise repro --ray` tests and overhead benchmark: pure Python, no
torch, deterministic given its seed (the same bits on any x86-64 or ARM machine).

Fits y = 3x - 1 + noise by SGD from a seeded start and seeded minibatches (the data set is
fixed), hashes each step's loss, reports the final loss, the weights' hash and how long it
worked. --sleep keeps a replica running (a test can kill its node meanwhile); --count-file
appends "seed pid" per start (resume tests); a --fail-file that exists and names this run's
seed makes it fail (retry tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import gpuwise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--count-file", default=None)
    ap.add_argument("--fail-file", default=None)
    args = ap.parse_args()
    seed = int(os.environ.get("GPUWISE_SEED", "0"))  # seed_everything would import torch
    if args.count_file:
        with open(args.count_file, "a") as f:
            f.write(f"{seed} {os.getpid()}\n")
    if args.fail_file and os.path.exists(args.fail_file):
        with open(args.fail_file) as f:
            if str(seed) in f.read().split():
                sys.exit(f"failing on purpose: seed {seed} is in {args.fail_file}")
    data = random.Random(1234)  # the data set is the same in every run
    xs = [data.uniform(-1, 1) for _ in range(256)]
    ys = [3 * x - 1 + data.gauss(0, 0.3) for x in xs]
    rng = random.Random(seed)  # the run's seed: the start and the minibatches
    w, b = rng.gauss(0, 1), rng.gauss(0, 1)
    for step in range(args.steps):
        batch = [rng.randrange(len(xs)) for _ in range(16)]
        gw = sum(2 * (w * xs[i] + b - ys[i]) * xs[i] for i in batch) / len(batch)
        gb = sum(2 * (w * xs[i] + b - ys[i]) for i in batch) / len(batch)
        w, b = w - 0.05 * gw, b - 0.05 * gb
        if step % 20 == 0:
            gpuwise.step_hash(step, w)
    time.sleep(args.sleep)
    loss = sum((w * x + b - y) ** 2 for x, y in zip(xs, ys, strict=True)) / len(xs)
    gpuwise.report_params_hash([w, b])
    print(json.dumps({"loss": loss, "w": w}))


if __name__ == "__main__":
    main()
