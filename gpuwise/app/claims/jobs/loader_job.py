"""A training loop whose DataLoader is slow: `gpuwise claims` watches it twice, with the data
loaded in the loop's own process and with worker processes (the claim "a GPU at 30% has a
data-pipeline problem").

    python loader_job.py --device cpu --steps 30 --busy 0.3 --sleep-out FILE
    python loader_job.py --device cpu --steps 30 --workers 4 --sleep-per-batch S

Without --sleep-per-batch the job first times a few steps of its model on a fixed batch and
makes loading a batch take (1 - busy) / busy times that (so the loop computes `busy` of the
time); it writes the sleep to --sleep-out, so that the second run loads the same way. A batch
sleeps, as reading and decoding its files would, in whichever process loads it. Nothing is
written to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

FEATURES = 256


class SlowData(Dataset):
    """Batches that take `sleep_s` each to load: one sleep a batch (a sleep a sample would add
    the scheduler's wake-up delay per sample, many times over on a busy machine)."""

    def __init__(self, n: int, sleep_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=generator)
        self.y = torch.randn(n, 1, generator=generator)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep_s)
        return self.x[rows], self.y[rows]


def model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    parts: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, width), torch.nn.ReLU()]
    for _ in range(layers - 1):
        parts += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*parts, torch.nn.Linear(width, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--busy", type=float, default=0.3)
    ap.add_argument("--sleep-per-batch", type=float, default=None)
    ap.add_argument("--sleep-out", default=None)
    args = ap.parse_args()
    # more workers than cores is the point here: they sleep, as a loader waiting on files does
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    device = torch.device(args.device)
    net = model(args.width, args.layers).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor, calibrating: bool = False) -> None:
        loss = ((net(x.to(device)) - y.to(device)) ** 2).mean()
        loss.backward()
        if calibrating:  # the same update by hand: watch counts optimizer steps as the loop's
            with torch.no_grad():
                for p in net.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-1e-3)
        else:
            opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()

    sleep = args.sleep_per_batch
    if sleep is None:  # calibrate: the model's compute time on one batch, before any loader
        x, y = torch.randn(args.batch, FEATURES), torch.randn(args.batch, 1)
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            step(x, y, calibrating=True)
            times.append(time.perf_counter() - t0)
        sleep = statistics.median(times[1:]) * (1 - args.busy) / args.busy
    if args.sleep_out:
        with open(args.sleep_out, "w") as f:
            f.write(f"{sleep!r}\n")
    data = SlowData(args.batch * args.steps, sleep)
    batches = BatchSampler(SequentialSampler(data), args.batch, drop_last=True)
    loader = DataLoader(data, sampler=batches, batch_size=None, num_workers=args.workers,
                        pin_memory=device.type == "cuda")
    for x, y in loader:
        step(x, y)


if __name__ == "__main__":
    main()
