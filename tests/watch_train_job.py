"""Small training jobs that `tests/test_watch_runs.py` runs under `gpuwise watch` (no gpuwise
code inside: the injection must find the phases by itself).

    python watch_train_job.py loop SLEEP_S OUT.json   # DataLoader sleeps SLEEP_S per batch
    torchrun --nproc_per_node 2 watch_train_job.py ddp SLEEP_S   # rank 1 sleeps, gloo

`loop` writes its own measurement (per step: wait for the batch, step time) to OUT.json and
exits with code 3, printing one line on stdout and one on stderr.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SleepyData(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s
        self.x = torch.randn(n, 256)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def model(width: int | None = None) -> torch.nn.Module:
    """The small MLP; `width` adds a hidden layer of that size, so compute (several ms a
    step) outweighs collating a batch of 32 even on a slow machine."""
    torch.manual_seed(0)
    if width is None:
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 1))
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 1))


def loop(sleep_s: float, out: str) -> None:
    m = model(2048)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    batch = 32
    loader = DataLoader(SleepyData(batch * 24, sleep_s / batch), batch_size=batch)
    steps, it = [], iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        waited = time.perf_counter() - t0
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps.append([t0, waited])
    end = time.perf_counter()
    starts = [t for t, _ in steps] + [end]
    own = [{"wait_s": w, "step_s": starts[i + 1] - starts[i]} for i, (_, w) in enumerate(steps)]
    with open(out, "w") as f:
        json.dump(own, f)
    print(f"final loss {loss.item():.6f}")
    print("to stderr", file=sys.stderr)
    sys.exit(3)


def ddp(sleep_s: float) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    m = torch.nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    batch = 16
    data = SleepyData(batch * 16, sleep_s / batch if rank == 1 else 0.0)
    for x, y in DataLoader(data, batch_size=batch):
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()  # both ranks done with gloo before either tears its pairs down
    dist.destroy_process_group()
    print(f"rank {rank} done pid {os.getpid()}")


if __name__ == "__main__":
    if sys.argv[1] == "loop":
        loop(float(sys.argv[2]), sys.argv[3])
    else:
        ddp(float(sys.argv[2]))
